"""The NaN policy (docs/kernels.md, NaN and inf): a NaN in any float input reaches exactly the
scores it touches as NaN, as in the float64 reference (torch's max propagates NaN), and +inf/-inf
give what float64 torch gives. Each input of each op is poisoned at one element, with
validate=False; the output must have the reference's NaN pattern exactly and its other entries
(finite or infinite) must match it.

fp32 products run as tf32x3 on a GPU, whose head/tail split turns an inf into NaN (docs/
kernels.md), so the inf cases use 16-bit inputs where the value enters a product.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from tests.conftest import ON_GPU
from tests.kernels.test_maxsim_dense import flat_where_it_applies
from tests.kernels.test_maxsim_pq import random_pq_index
from tests.kernels.test_maxsim_residual import norms_of, random_index
from tests.tolerances import TOLERANCES
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.codecs.residual import decompress_residuals
from tilemaxsim_plaid.kernels.common import max_nan_flagged, max_nan_tree, maximum_nan
from tilemaxsim_plaid.ops import centroid, dense, pq, residual
from tilemaxsim_plaid.ops.dense import MaxSimConfig
from tilemaxsim_plaid.ops.pq import PQConfig
from tilemaxsim_plaid.ops.residual import ResidualConfig

# numpy warns of inf - inf and 0 * inf in the interpreter's products: those are the cases tested.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

NAN, INF = float("nan"), float("inf")
VALUES = [pytest.param(NAN, id="nan"), pytest.param(INF, id="inf"), pytest.param(-INF, id="-inf")]
# An empty document (always -inf), a one-token one, and longer ones over several tiles.
LENGTHS = [0, 1, 17, 40, 5]
B, LQ = 2, 5
POISONED_DOC = 2  # the document a document-side poison lands in


def assert_same_pattern(out, ref, op, dtype, value):
    """NaN exactly where the reference has NaN; everything else equal to the reference within
    the op's tolerance (infinities equal)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), (
        f"NaN pattern differs:\nout {torch.isnan(out).int().tolist()}\n"
        f"ref {torch.isnan(ref).int().tolist()}")
    if value != value:
        assert torch.isnan(ref).any(), "the poison reached no score: the test tests nothing"
    rtol, atol = TOLERANCES[(op, dtype)]
    keep = ~torch.isnan(ref)
    torch.testing.assert_close(out[keep], ref[keep], rtol=rtol, atol=atol)


def _offsets(lengths):
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    return offsets


def _poisoned(x, index, value):
    x = x.clone()
    x[index] = value
    return x


# Reductions: both forms of max_nan (compiled on a GPU; flagged under the interpreter) against
# torch.amax, on rows with NaN, +inf, -inf, all -inf and all NaN.
@triton.jit
def _reduce_rows(p_x, p_out, TREE: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    x = tl.load(p_x + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :])
    if TREE:
        row_max = max_nan_tree(x, 1)
    else:
        row_max = max_nan_flagged(x, 1)
    # An elementwise max against -inf and against a row of NaN, as the kernels' running maxima.
    row_max = maximum_nan(row_max, float("-inf"))
    tl.store(p_out + tl.arange(0, R), row_max)


@pytest.mark.parametrize("tree", [pytest.param(True, id="tree"), pytest.param(False, id="flagged")])
def test_both_reductions_propagate_nan_as_torch(device, tree):
    x = torch.randn(8, 16)
    x[1, 3] = NAN
    x[2, 5] = INF
    x[3] = -INF
    x[4] = NAN
    x[5, 0], x[5, 1] = NAN, INF
    x[6, 7], x[6, 8] = -INF, NAN
    out = torch.empty(8, device=device)
    _reduce_rows[(1,)](x.to(device), out, tree, 8, 16)
    expected = x.amax(1)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(expected))
    keep = ~torch.isnan(expected)
    assert torch.equal(out.cpu()[keep], expected[keep])


# Dense: every path of maxsim_packed / maxsim_padded.
DENSE_CONFIGS = [
    pytest.param(None, id="default"),
    pytest.param(MaxSimConfig(block_t=16), id="tiled"),
    pytest.param(MaxSimConfig(block_t=16, hold_query=True), id="hold_query"),
    pytest.param(MaxSimConfig(block_t=16, hold_query=True, running_max=True), id="running_max"),
    pytest.param(MaxSimConfig(block_t=64, single_tile=True, q_blocks_per_program=2),
                 id="single_tile"),
    pytest.param(MaxSimConfig(block_t=16, slots=True, docs_per_program=4), id="slots"),
]


def _dense_inputs(dtype, device):
    offsets = _offsets(LENGTHS)
    Q = torch.randn(B, LQ, 64).to(dtype)
    D = torch.randn(int(offsets[-1]), 64).to(dtype)
    return Q.to(device), D.to(device), offsets.to(device)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.float32, id="fp32")])
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("where", ["Q", "D_packed"])
@pytest.mark.parametrize("config", DENSE_CONFIGS)
def test_packed(device, config, where, value, dtype):
    if math.isinf(value) and dtype == torch.float32 and ON_GPU:
        pytest.skip("fp32 products are tf32x3 on a GPU: an inf is NaN there (module docstring)")
    Q, D, offsets = _dense_inputs(dtype, device)
    if where == "Q":
        Q = _poisoned(Q, (0, 1, 3), value)
    else:
        D = _poisoned(D, (int(offsets[POISONED_DOC]) + 4, 5), value)
    out = dense.maxsim_packed(Q, D, offsets, config=config, max_doc_len=max(LENGTHS),
                              validate=False)
    ref = reference.maxsim_packed(Q, D, offsets)
    assert_same_pattern(out, ref, "maxsim_dense", dtype, value)


def _poisoned_last_rows(D, offsets, value):
    """The only row of the one-token document and the last row of the poisoned one."""
    D = _poisoned(D, (int(offsets[1]), 7), value)
    return _poisoned(D, (int(offsets[POISONED_DOC + 1]) - 1, 5), value)


@pytest.mark.parametrize("repeat", [pytest.param(True, id="repeated"),
                                    pytest.param(False, id="masked")])
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("config", DENSE_CONFIGS)
def test_packed_poisoned_last_rows(device, config, value, repeat, monkeypatch):
    """The rows a tile re-reads past a document's end (ops.dense._repeat_rows) poisoned: the
    only row of a one-token document and the last of a 17-token one reach exactly their own
    documents' scores, rows repeated or masked."""
    monkeypatch.setattr(dense, "_repeat_rows", lambda num_queries, c, dim: repeat)
    Q, D, offsets = _dense_inputs(torch.float16, device)
    D = _poisoned_last_rows(D, offsets, value)
    out = dense.maxsim_packed(Q, D, offsets, config=config, max_doc_len=max(LENGTHS),
                              validate=False)
    ref = reference.maxsim_packed(Q, D, offsets)
    assert_same_pattern(out, ref, "maxsim_dense", torch.float16, value)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("where", ["Q", "D_packed"])
@pytest.mark.parametrize("config", [
    pytest.param(MaxSimConfig(block_t=16, block_d=32), id="tiled-2x32+16"),
    pytest.param(MaxSimConfig(block_t=16, hold_query=True, block_d=64), id="held-64+16"),
    pytest.param(MaxSimConfig(block_t=16, hold_query=True, running_max=True, block_d=32),
                 id="running-max-2x32+16"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True, num_warps=1,
                              block_d=64), id="flat-64+16"),
])
def test_packed_poison_in_the_remainder_chunk(device, config, where, value, monkeypatch):
    """d = 80 past its whole chunks by 16 columns (the kernels' narrower last chunk): a poison in
    one of those columns, in the query or in a document, reaches the same scores as in torch."""
    monkeypatch.setattr(dense, "_flat_documents", flat_where_it_applies)
    assert dense._remainder_chunk(80, config.block_d) == 16
    offsets = _offsets(LENGTHS)
    Q = torch.randn(B, LQ, 80).half().to(device)
    D = torch.randn(int(offsets[-1]), 80).half().to(device)
    offsets = offsets.to(device)
    if where == "Q":
        Q = _poisoned(Q, (1, 2, 70), value)
    else:
        D = _poisoned(D, (int(offsets[POISONED_DOC]) + 4, 75), value)
    out = dense.maxsim_packed(Q, D, offsets, config=config, validate=False)
    assert_same_pattern(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense",
                        torch.float16, value)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("where", ["Q", "D_packed", "last rows"])
def test_packed_flat_documents(device, where, value, monkeypatch):
    """The held query's documents walked as one loop (ops.dense._flat_documents): a poison in
    the query, inside a document or in its last rows reaches the same scores as in torch."""
    monkeypatch.setattr(dense, "_flat_documents", flat_where_it_applies)
    config = MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True)
    Q, D, offsets = _dense_inputs(torch.float16, device)
    if where == "Q":
        Q = _poisoned(Q, (1, 2, 9), value)
    elif where == "D_packed":
        D = _poisoned(D, (int(offsets[POISONED_DOC]) + 4, 5), value)
    else:
        D = _poisoned_last_rows(D, offsets, value)
    out = dense.maxsim_packed(Q, D, offsets, config=config, validate=False)
    ref = reference.maxsim_packed(Q, D, offsets)
    assert_same_pattern(out, ref, "maxsim_dense", torch.float16, value)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("where", ["Q head", "Q tail", "D_packed"])
def test_packed_tail_joined_to_the_head(device, where, value, monkeypatch):
    """A split query's tail scored in the head's launch (dense.tail_joins_head): a poison in a
    head token, a tail token or a document row reaches the same scores as in float64 torch."""
    monkeypatch.setattr(dense, "MANY_DOCS", 2)  # the held default on a few documents
    monkeypatch.setattr(dense, "TAIL_JOIN_MIN_ROWS", 16)
    Q = torch.randn(4, 33, 64).half()
    assert dense.tail_joins_head(4, 32, 1, None, 64, True, len(LENGTHS))
    offsets = _offsets(LENGTHS)
    D = torch.randn(int(offsets[-1]), 64).half()
    if where == "Q head":
        Q = _poisoned(Q, (1, 30, 3), value)
    elif where == "Q tail":
        Q = _poisoned(Q, (2, 32, 7), value)
    else:
        D = _poisoned(D, (int(offsets[POISONED_DOC]) + 4, 5), value)
    Q, D, offsets = Q.to(device), D.to(device), offsets.to(device)
    launched = []
    real = dense._launch_kernel
    monkeypatch.setattr(dense, "_launch_kernel",
                        lambda *a, **k: launched.append(k["tail_tokens"]) or real(*a, **k))
    out = dense.maxsim_packed(Q, D, offsets, validate=False)  # no max_doc_len: no single tile
    assert launched == [1]
    ref = reference.maxsim_packed(Q, D, offsets)
    assert_same_pattern(out, ref, "maxsim_dense", torch.float16, value)


@pytest.mark.parametrize("config", DENSE_CONFIGS[:4])
def test_packed_unscored_rows_do_not_reach_the_scores(device, config):
    """Rows past offsets[-1] (PLAID's uninitialised tail) and rows of documents not in pids are
    never read: NaN there changes nothing."""
    Q, D, offsets = _dense_inputs(torch.float16, device)
    D = torch.cat([D, torch.full((7, 64), NAN, dtype=D.dtype, device=device)])
    D[int(offsets[POISONED_DOC]):int(offsets[POISONED_DOC + 1])] = NAN
    pids = torch.tensor([3, 0, 1, 4], device=device)
    out = dense.maxsim_packed(Q, D, offsets, pids, config=config, max_doc_len=max(LENGTHS),
                              validate=False)
    ref = reference.maxsim_packed(Q, D, offsets, pids)
    assert not torch.isnan(ref).any()
    assert_same_pattern(out, ref, "maxsim_dense", torch.float16, 0.0)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("where", ["Q", "D", "D_past_length"])
@pytest.mark.parametrize("config", DENSE_CONFIGS[:4])
def test_padded(device, config, where, value):
    Q = torch.randn(B, LQ, 64).half().to(device)
    D = torch.randn(4, 40, 64).half().to(device)
    doc_lengths = torch.tensor([40, 0, 17, 3], device=device)
    if where == "Q":
        Q = _poisoned(Q, (1, 4, 0), value)
    elif where == "D":
        D = _poisoned(D, (2, 16, 63), value)
    else:  # a token at or past its document's length is never read
        D = _poisoned(D, (3, 3, 1), value)
        D = _poisoned(D, (1, 0, 1), value)
    if config is not None and config.single_tile:
        config = MaxSimConfig(block_t=64, single_tile=True)
    out = dense.maxsim_padded(Q, D, doc_lengths, config=config, validate=False)
    ref = reference.maxsim_padded(Q, D, doc_lengths)
    assert_same_pattern(out, ref, "maxsim_dense", torch.float16,
                        0.0 if where == "D_past_length" else value)


# Residual codes: Q, centroids, bucket weights, inverse norms, a caller's centroid-score table.
RESIDUAL_CONFIGS = [
    pytest.param(dict(centroid_table=False), id="gather"),
    pytest.param(dict(centroid_table=True), id="table"),
    pytest.param(dict(centroid_table=True, decode="permute"), id="table-permute"),
    pytest.param(dict(centroid_table=False, decode="select"), id="gather-select"),
]


def _residual_case(device, where, value, dtype=torch.float16):
    index = random_index(device, 128, 2, lengths=LENGTHS)
    # The kernels decode with the bucket weights in the query's dtype (colbert-ai's GPU path
    # holds them in fp16), the float64 reference with them as given: weights the query's dtype
    # holds exactly give both the same zeros of centroid + weight, where an inf query column
    # makes NaN (0 x inf). Otherwise a weight rounded onto -centroid (about 1 run in 300) is NaN
    # in the op and +-inf in the reference.
    index["bucket_weights"] = index["bucket_weights"].to(dtype).float()
    Q = torch.nn.functional.normalize(torch.randn(B, LQ, 128), dim=-1).to(dtype).to(device)
    token = int(index["offsets"][POISONED_DOC]) + 4
    if where == "Q":
        Q = _poisoned(Q, (0, 2, 7), value)
    elif where == "centroids":
        index["centroids"] = _poisoned(index["centroids"], (int(index["codes"][token]), 9), value)
    elif where == "bucket_weights":
        index["bucket_weights"] = _poisoned(index["bucket_weights"], 3, value)
    return index, Q, token


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("where", ["Q", "centroids", "bucket_weights"])
@pytest.mark.parametrize("kwargs", RESIDUAL_CONFIGS)
def test_residual(device, kwargs, where, value):
    index, Q, _ = _residual_case(device, where, value)
    inv_norms = norms_of(index, 2) if kwargs["centroid_table"] else None
    out = residual.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                   index["centroids"], index["bucket_weights"], 2,
                                   inv_norms=inv_norms, config=ResidualConfig(**kwargs),
                                   validate=False)
    if inv_norms is None:
        ref = reference.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                        index["centroids"], index["bucket_weights"], 2)
    else:
        # The table path computes (<q, c> + <q, r>) * inv_norm, with the inverse norms as given
        # (NaN or 0 where the poison touched them): inf - inf is NaN there where <q, c + r> is
        # +-inf (docs/kernels.md, NaN and inf).
        ref = _table_reference(Q, index, inv_norms, None)
    assert_same_pattern(out, ref, "maxsim_residual", torch.float16, value)


# d = 96 on every decoder, with and without precomputed inverse norms (the centroid-table path
# always has them).
ODD_D_CONFIGS = [
    pytest.param(dict(centroid_table=False), False, id="gather"),
    pytest.param(dict(centroid_table=False), True, id="gather-norms"),
    pytest.param(dict(centroid_table=False, decode="select"), False, id="gather-select"),
    pytest.param(dict(centroid_table=False, decode="select"), True, id="gather-select-norms"),
    pytest.param(dict(centroid_table=True), True, id="table"),
    pytest.param(dict(centroid_table=True, decode="select"), True, id="table-select"),
    pytest.param(dict(centroid_table=True, decode="permute"), True, id="table-permute"),
    pytest.param(dict(centroid_table=False, decode="permute"), False, id="gather-permute"),
]
# "unused": bucket 0 is poisoned and no real dimension is in it; "all_but_last": every bucket but
# the last is poisoned and every real dimension is in the last.
UNUSED_BUCKETS = ["unused", "all_but_last"]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("poisoned", UNUSED_BUCKETS)
@pytest.mark.parametrize("units", ["words", "bytes"])
@pytest.mark.parametrize("nbits", [pytest.param(n, id=f"nbits{n}") for n in (1, 2, 4)])
@pytest.mark.parametrize("kwargs,with_norms", ODD_D_CONFIGS)
def test_residual_unused_bucket_weight_at_odd_d(device, kwargs, with_norms, nbits, units,
                                                poisoned, value):
    """d = 96 is scored in one masked 128-column chunk. A non-finite weight of a bucket that no
    real dimension uses must reach no score, as in the reference (0 x NaN is NaN: the chunk's
    columns past d, which have no bits, must not decode to it)."""
    if kwargs.get("decode") == "permute" and (nbits == 1 or units == "bytes"):
        pytest.skip("byte permutes decode nbits = 2 and 4 in 32-bit words only")
    dim, last = 96, (1 << nbits) - 1
    index = random_index(device, dim, nbits, lengths=LENGTHS)
    # The raw field of bucket b is b's bits reversed: 0 and all ones map to themselves.
    low = 1 if poisoned == "unused" else last
    fields = torch.randint(low, last + 1, (*index["residuals"].shape, 8 // nbits))
    shifts = nbits * torch.arange(8 // nbits)
    rows = (fields << shifts).sum(-1).to(torch.uint8).to(device)
    if units == "bytes":
        # Rows one byte off 4-byte alignment are read byte by byte.
        rows = torch.cat([torch.zeros_like(rows[:, :1]), rows], dim=1)[:, 1:]
    index["residuals"] = rows
    weights = index["bucket_weights"].clone()
    weights[:1 if poisoned == "unused" else last] = value
    index["bucket_weights"] = weights
    Q = torch.nn.functional.normalize(torch.randn(B, LQ, dim), dim=-1).half().to(device)
    inv_norms = norms_of(index, nbits) if with_norms else None
    out = residual.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                   index["centroids"], index["bucket_weights"], nbits,
                                   inv_norms=inv_norms, config=ResidualConfig(**kwargs),
                                   validate=False)
    ref = reference.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                    index["centroids"], index["bucket_weights"], nbits)
    assert torch.isfinite(ref[:, torch.tensor(LENGTHS) > 0]).all(), "the poison is unused"
    assert_same_pattern(out, ref, "maxsim_residual", torch.float16, 0.0)


def _table_reference(Q, index, inv_norms, S):
    """float64 MaxSim as the table path computes it: (S[code_t] + <q, r_t>) * inv_norm_t, with
    S = centroids @ Q^T unless given."""
    Q64 = Q.double().cpu().reshape(-1, Q.shape[-1])  # [B * Lq, d]
    codes = index["codes"].cpu().long()
    zero = torch.zeros_like(index["centroids"].cpu().double())
    r = decompress_residuals(index["codes"].cpu(), index["residuals"].cpu(), zero,
                             index["bucket_weights"].cpu().double(), 2, normalize=False)
    if S is None:
        S = index["centroids"].cpu().double() @ Q64.T
    sim = (S.double().cpu()[codes] + r.double() @ Q64.T) * inv_norms.double().cpu()[:, None]
    lengths = index["offsets"].cpu().diff()
    Lq = Q.shape[1]
    return torch.stack([reference.segment_maxsim(sim[:, b * Lq:(b + 1) * Lq], lengths)
                        for b in range(Q.shape[0])])


@pytest.mark.parametrize("value", VALUES)
def test_residual_inverse_norms(device, value):
    index, Q, token = _residual_case(device, "none", value)
    inv_norms = _poisoned(norms_of(index, 2), token, value)
    out = residual.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                   index["centroids"], index["bucket_weights"], 2,
                                   inv_norms=inv_norms,
                                   config=ResidualConfig(centroid_table=True), validate=False)
    assert_same_pattern(out, _table_reference(Q, index, inv_norms, None), "maxsim_residual",
                        torch.float16, value)


@pytest.mark.parametrize("value", VALUES)
def test_residual_centroid_scores(device, value):
    index, Q, token = _residual_case(device, "none", value, torch.float32)
    inv_norms = norms_of(index, 2)
    S = (index["centroids"].float() @ Q.reshape(-1, 128).T).contiguous()
    S = _poisoned(S, (int(index["codes"][token]), 1 * LQ + 3), value)
    out = residual.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                   index["centroids"], index["bucket_weights"], 2,
                                   inv_norms=inv_norms, centroid_scores=S, validate=False)
    assert_same_pattern(out, _table_reference(Q, index, inv_norms, S), "maxsim_residual",
                        torch.float32, value)


def test_residual_split_query_nan(device):
    """split_query (fp32 Q as fp16 head + tail): a NaN in Q is NaN in both halves."""
    index, Q, _ = _residual_case(device, "Q", NAN, torch.float32)
    inv_norms = norms_of(index, 2)
    out = residual.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                   index["centroids"], index["bucket_weights"], 2,
                                   inv_norms=inv_norms, split_query=True, validate=False)
    ref = reference.maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"],
                                    index["centroids"], index["bucket_weights"], 2)
    assert_same_pattern(out, ref, "maxsim_residual_split", torch.float32, NAN)


# Product quantization: Q, codebooks, centroids, inverse norms; the decode and lut scorings.
PQ_CONFIGS = [pytest.param(PQConfig(), id="decode"),
              pytest.param(PQConfig(block_t=16, reduce_per_tile=True), id="decode-reduce_per_tile"),
              pytest.param(PQConfig(scoring="lut", lut_rows=4), id="lut")]
if ON_GPU:
    PQ_CONFIGS.append(pytest.param(PQConfig(scoring="mma"), id="mma"))


PQ_CASES = [pytest.param(where, value, id=f"{where}-{name}")
            for where in ("Q", "codebooks", "centroids", "inv_norms")
            for value, name in ((NAN, "nan"), (INF, "inf"), (-INF, "-inf"))
            # The kernels scale a token's products by its inverse norm (s_t <q, x_t>), the
            # reference its vector (<q, s_t x_t>): for an infinite s_t they differ
            # (docs/kernels.md, NaN and inf), so that input is poisoned with NaN only.
            if where != "inv_norms" or value != value]


@pytest.mark.parametrize("where,value", PQ_CASES)
@pytest.mark.parametrize("config", PQ_CONFIGS)
def test_pq(device, config, where, value):
    residual_mode = where in ("centroids", "inv_norms")
    if config.scoring == "mma" and residual_mode:
        pytest.skip("the mma kernel scores PQ codes of embeddings only")
    index = random_pq_index(device, 128, 16, lengths=LENGTHS,
                            num_centroids=8 if residual_mode else 0)
    Q = torch.nn.functional.normalize(torch.randn(B, LQ, 128), dim=-1).half().to(device)
    token = int(index["offsets"][POISONED_DOC]) + 4
    if where == "Q":
        Q = _poisoned(Q, (1, 0, 100), value)
    elif where == "codebooks":
        index["codebooks"] = _poisoned(index["codebooks"], (5, int(index["pq_codes"][token, 5]), 2),
                                       value)
    elif where == "centroids":
        index["centroids"] = _poisoned(index["centroids"],
                                       (int(index["centroid_codes"][token]), 40), value)
    else:
        index["inv_norms"] = _poisoned(index["inv_norms"], token, value)
    extra = {k: index[k] for k in ("centroid_codes", "centroids", "inv_norms") if k in index}
    args = (index["pq_codes"], index["offsets"], index["codebooks"])
    out = pq.maxsim_pq(Q, *args, **extra, config=config, validate=False)
    if config.scoring in ("decode", "mma"):
        # The decode kernels multiply codebooks rounded to Q's dtype (fp16 here), as the
        # reference is given them.
        args = (args[0], args[1], args[2].to(Q.dtype))
    ref = reference.maxsim_pq(Q, *args, **extra)
    assert_same_pattern(out, ref, "maxsim_pq", torch.float16, value)


# Candidate generation: the centroid-interaction kernel over a centroid-score table.
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("pruned", [pytest.param(False, id="all"), pytest.param(True, id="keep")])
def test_centroid_interaction(device, pruned, value):
    offsets = _offsets(LENGTHS)
    codes = torch.randint(0, 15, (int(offsets[-1]),), dtype=torch.int32)
    scores = torch.randn(16, 32)
    keep = torch.rand(16) > 0.3 if pruned else None
    code = 15
    codes[int(offsets[POISONED_DOC]) + 4] = code
    if keep is not None:
        keep[code] = True
        pruned_code = int(codes[int(offsets[3])])
        keep[pruned_code] = False  # a pruned code: its poison is never read
        scores = _poisoned(scores, (pruned_code, 0), value)
    scores = _poisoned(scores, (code, 6), value)
    args = [x.to(device) for x in (scores, codes, offsets)]
    kw = {} if keep is None else {"keep": keep.to(device)}
    out = centroid.centroid_interaction(*args, **kw, validate=False)
    ref = reference.centroid_interaction(*args, **kw)
    assert_same_pattern(out, ref, "centroid_interaction", torch.float32, value)
