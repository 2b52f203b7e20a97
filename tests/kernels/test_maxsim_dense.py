"""Dense TileMaxSim kernels against the float64 reference (CPU interpreter or GPU)."""

import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import property_examples, rows_in_order
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import dense
from tilemaxsim_plaid.ops.dense import (MANY_DOCS, MaxSimConfig, default_config,
                                         default_query_chunks, maxsim_packed, maxsim_padded)
from tilemaxsim_plaid.ops.launch import memory_bandwidth

DTYPES = [
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float32, id="fp32"),
]

# (B, Lq, N, Ld, d): odd query lengths, single-token queries and docs, non-power-of-two d.
SHAPES = [
    pytest.param(1, 32, 7, 40, 128, id="1q-d128"),
    pytest.param(3, 31, 5, 17, 96, id="Lq31-d96"),
    pytest.param(2, 33, 4, 70, 384, id="Lq33-d384"),
    pytest.param(5, 1, 6, 1, 64, id="Lq1-Ld1-d64"),
    pytest.param(2, 8, 3, 9, 768, id="d768"),
    pytest.param(2, 140, 3, 5, 64, id="Lq140-chunked"),
]


def _rand(*shape, dtype, device):
    # Unit-scale rows; never zeros (they hide unwritten outputs and wrong indexing).
    return (torch.randn(*shape, device=device) / math.sqrt(shape[-1])).to(dtype)


def _packed_from_lengths(lengths, d, dtype, device, tail=3):
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    # Extra rows past the last document (PLAID keeps 512 uninitialised ones): never read.
    D = _rand(int(offsets[-1]) + tail, d, dtype=dtype, device=device)
    D[int(offsets[-1]):] = float("nan")
    return D, offsets.to(device)


@pytest.fixture(autouse=True)
def _nan_poisoned_outputs(monkeypatch):
    """Every output buffer starts as NaN, so an element a kernel never writes fails the test."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    monkeypatch.setattr(dense.torch, "empty", empty)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Lq,N,Ld,d", SHAPES)
def test_padded_matches_reference(B, Lq, N, Ld, d, dtype, device):
    Q = _rand(B, Lq, d, dtype=dtype, device=device)
    D = _rand(N, Ld, d, dtype=dtype, device=device)
    doc_lengths = torch.randint(0, Ld + 1, (N,), device=device)
    doc_lengths[0] = 0  # an empty document
    doc_lengths[-1] = min(1, Ld)
    query_lengths = torch.randint(0, Lq + 1, (B,), device=device)
    out = maxsim_padded(Q, D, doc_lengths, query_lengths)
    assert out.dtype == torch.float32 and out.shape == (B, N)
    assert_close(out, reference.maxsim_padded(Q, D, doc_lengths, query_lengths), "maxsim_dense", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_2d_query_and_full_lengths(dtype, device):
    Q = _rand(31, 128, dtype=dtype, device=device)
    D = _rand(9, 33, 128, dtype=dtype, device=device)
    out = maxsim_padded(Q, D)
    assert out.shape == (9,)
    assert_close(out, reference.maxsim_padded(Q, D), "maxsim_dense", dtype)


def test_packed_default_takes_the_mean_length_and_the_bandwidth(device, monkeypatch):
    """maxsim_packed's default launch gives default_config its documents' rows per document
    and the card's bandwidth (launch.memory_bandwidth: None on the CPU)."""
    seen = []
    real = dense.default_config
    monkeypatch.setattr(dense, "default_config",
                        lambda *args, **kwargs: seen.append(kwargs) or real(*args, **kwargs))
    D, offsets = _packed_from_lengths([3, 0, 9], 64, torch.float16, device, tail=0)
    Q = _rand(8, 64, dtype=torch.float16, device=device)
    assert_close(maxsim_packed(Q, D, offsets), reference.maxsim_packed(Q, D, offsets),
                 "maxsim_dense", torch.float16)
    assert seen[-1]["mean_tokens"] == pytest.approx(4.0)
    assert seen[-1]["read_bandwidth"] == memory_bandwidth(device)


@pytest.mark.parametrize("d, lengths, want", [
    (128, [90, 0, 1, 129, 130, 40], MaxSimConfig(block_t=32, num_warps=2, num_stages=2)),
    (256, [130, 0, 1, 257, 300, 80], MaxSimConfig(block_t=64, num_warps=4, num_stages=3,
                                                   block_d=128)),
])
def test_packed_default_on_a_card_of_less_bandwidth_scores_exactly(d, lengths, want, device,
                                                                      monkeypatch):
    """The per-document defaults a card under dense.PER_DOCUMENT_MAX_BANDWIDTH takes for one
    query over long packed documents (d in one chunk; d in whole 128-column chunks), reached
    through the op's own bandwidth and mean length, score as the float64 reference (an empty
    document, a one-token one, NaN rows past the last document that are never read), with a
    NaN token reaching its own document only and a strided query; a card of unknown bandwidth
    takes another config for the same call."""
    seen = []
    real = dense.default_config
    monkeypatch.setattr(dense, "MANY_DOCS", 4)  # a few documents take the held query else
    monkeypatch.setattr(dense, "memory_bandwidth", lambda dev: 3.35e12)
    monkeypatch.setattr(dense, "default_config",
                        lambda *args, **kwargs: seen.append(real(*args, **kwargs)) or seen[-1])
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(29, d, dtype=torch.float16, device=device)
    assert_close(maxsim_packed(Q, D, offsets), reference.maxsim_packed(Q, D, offsets),
                 "maxsim_dense", torch.float16)
    assert seen[-1] == want
    monkeypatch.setattr(dense, "memory_bandwidth", lambda dev: None)
    assert_close(maxsim_packed(Q, D, offsets), reference.maxsim_packed(Q, D, offsets),
                 "maxsim_dense", torch.float16)
    assert seen[-1] != want  # the held query or the 64-column chunks
    # A NaN in one document's token reaches that document's score only (the NaN policy), and a
    # strided query scores as the contiguous one, on the slower card's config.
    monkeypatch.setattr(dense, "memory_bandwidth", lambda dev: 3.35e12)
    D[int(offsets[3]) + 5, 7] = float("nan")
    Q_strided = torch.stack([Q, torch.zeros_like(Q)], 1)[:, 0]
    got = maxsim_packed(Q_strided, D, offsets)
    assert seen[-1] == want and not Q_strided.is_contiguous()
    ref = reference.maxsim_packed(Q, D, offsets)
    others = torch.arange(len(lengths), device=got.device) != 3
    assert torch.isnan(got[3]) and torch.isnan(ref[3])
    assert_close(got[others], ref[others], "maxsim_dense", torch.float16)


def test_padded_single_tile_takes_the_longest_of_doc_lengths(device):
    """A single-tile config over documents padded past its tile but no longer than it: with
    validate=True the longest is read from doc_lengths, new or remembered (the same answer
    either way); validate=False knows only Ld and refuses it."""
    Q = _rand(16, 33, 128, dtype=torch.float16, device=device)
    D = _rand(3, 33, 128, dtype=torch.float16, device=device)
    doc_lengths = torch.tensor([32, 0, 7], device=device)
    config = MaxSimConfig(block_t=32, single_tile=True)
    want = reference.maxsim_padded(Q, D, doc_lengths)
    for _ in range(2):  # new, then remembered
        assert_close(maxsim_padded(Q, D, doc_lengths, config=config), want, "maxsim_dense",
                     torch.float16)
    with pytest.raises(ValueError, match="single_tile"):
        maxsim_padded(Q, D, doc_lengths, config=config, validate=False)
    with pytest.raises(ValueError, match="single_tile"):
        maxsim_padded(Q, D, torch.tensor([33, 0, 7], device=device), config=config)


def test_padded_accepts_strided_documents(device):
    """A non-contiguous view (every other token) is read through its strides, not copied."""
    Q = _rand(2, 16, 64, dtype=torch.float16, device=device)
    D = _rand(5, 24, 64, dtype=torch.float16, device=device)[:, ::2]
    assert not D.is_contiguous()
    assert_close(maxsim_padded(Q, D), reference.maxsim_padded(Q, D), "maxsim_dense", torch.float16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lengths,d",
    [
        pytest.param([3, 0, 70, 1, 129, 5, 0], 128, id="mixed-with-empty"),
        pytest.param([0, 0], 64, id="all-empty"),
        pytest.param([200, 17, 0, 33, 1, 1, 1, 1, 90], 384, id="d384"),
        pytest.param([5] * 40, 96, id="many-short-d96"),
    ],
)
@pytest.mark.parametrize("B", [1, 3])
def test_packed_matches_reference(lengths, d, B, dtype, device):
    D, offsets = _packed_from_lengths(lengths, d, dtype, device)
    Q = _rand(B, 33, d, dtype=dtype, device=device)
    query_lengths = torch.randint(0, 34, (B,), device=device)
    out = maxsim_packed(Q, D, offsets, query_lengths=query_lengths)
    expected = reference.maxsim_packed(Q, D, offsets, query_lengths=query_lengths)
    assert_close(out, expected, "maxsim_dense", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_pids_score_in_place_in_order(dtype, device):
    lengths = [3, 0, 70, 1, 129, 5]
    D, offsets = _packed_from_lengths(lengths, 128, dtype, device)
    Q = _rand(2, 32, 128, dtype=dtype, device=device)
    pids = torch.tensor([4, 1, 0, 4, 5], device=device, dtype=torch.int32)
    out = maxsim_packed(Q, D, offsets, pids)
    assert out.shape == (2, 5)
    assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense", dtype)


def test_packed_equals_padded(device):
    lengths = torch.tensor([7, 1, 0, 40, 12])
    D_packed, offsets = _packed_from_lengths(lengths.tolist(), 128, torch.float16, device)
    D_padded = torch.zeros(5, 40, 128, dtype=torch.float16, device=device)
    for n in range(5):
        start, end = int(offsets[n]), int(offsets[n + 1])
        D_padded[n, : end - start] = D_packed[start:end]
    Q = _rand(4, 32, 128, dtype=torch.float16, device=device)
    packed = maxsim_packed(Q, D_packed, offsets)
    padded = maxsim_padded(Q, D_padded, lengths.to(device))
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


CONFIGS = [
    pytest.param(MaxSimConfig(block_t=16), id="tiles16"),
    pytest.param(MaxSimConfig(block_t=64, queries_per_block=2, docs_per_program=3), id="2q-3docs"),
    pytest.param(MaxSimConfig(block_t=64, queries_per_block=1, q_blocks_per_program=3,
                              single_tile=True), id="single-tile-3qblocks"),
    pytest.param(MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=4, slots=True),
                 id="slots-16x4"),
    pytest.param(MaxSimConfig(block_t=4, docs_per_program=4, slots=True), id="slots-4x4"),
    # The tiles' documents taken in order of length, scores stored at their own positions.
    pytest.param(MaxSimConfig(block_t=8, queries_per_block=2, docs_per_program=4, slots=True,
                              length_order=True), id="slots-8x4-length-order"),
    # The default's eight documents of 16-token slots for a full block of several queries.
    pytest.param(MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=8, slots=True,
                              length_order=True), id="slots-16x8-length-order"),
    # One query tile held across tiles and documents: several documents per program, several
    # query blocks (programs) per document.
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True), id="hold-query-3docs"),
    pytest.param(MaxSimConfig(block_t=32, queries_per_block=2, docs_per_program=2, hold_query=True),
                 id="hold-query-2q-2docs"),
    # One warp holding the query across 16 documents (here more slots than documents, so most
    # of the program's slots are empty).
    pytest.param(MaxSimConfig(block_t=16, num_warps=1, num_stages=3, docs_per_program=16,
                              hold_query=True), id="one-warp-hold-16docs"),
    # Whole tiles into a running max, the last partial tile masked (documents of 0, 64 and 1
    # tokens: no tile, whole tiles only, a partial tile only).
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True, running_max=True),
                 id="hold-query-running-max"),
    pytest.param(MaxSimConfig(block_t=32, queries_per_block=2, running_max=True),
                 id="2q-running-max"),
]


# The single-tile path takes d <= 128 only (tests/ops/test_dense.py refuses wider); a held query
# holds d = 384 as three 128-wide tiles.
CONFIG_DIMS = [pytest.param(c.values[0], d, id=f"{c.id}-d{d}") for c in CONFIGS for d in (128, 384)
               if not (c.values[0].single_tile and d > 128)]


@pytest.mark.parametrize("config,d", CONFIG_DIMS)
def test_every_config_path_is_exact(config, d, device):
    """Each kernel path a config can select computes the same function, with and without pids."""
    lengths = [3, 0, 50, 1, 17, 64, 2]
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(5, 31, d, dtype=torch.float16, device=device)
    out = maxsim_packed(Q, D, offsets, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)
    pids = torch.tensor([6, 2, 1, 2], device=device)
    out = maxsim_packed(Q, D, offsets, pids, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense", torch.float16)


@pytest.mark.parametrize("config", [c for c in CONFIGS if not c.values[0].running_max])
def test_repeated_rows_score_as_masked_ones(config, device, monkeypatch):
    """Rows past a document's end re-read as its last row (REPEAT_ROWS) or masked to -inf score
    alike: packed with pids (empty documents, one of a single token) and padded documents whose
    padding holds NaN, which neither way reads. Bit for bit on a GPU, where every product of a
    tile is summed alike; the interpreter's numpy products may round a repeated row's copies
    apart in the last bit, so there both are held to the reference."""
    lengths = [3, 0, 50, 1, 17, 64, 2]
    D, offsets = _packed_from_lengths(lengths, 96, torch.float16, device)
    Q = _rand(3, 19, 96, dtype=torch.float16, device=device)
    pids = torch.tensor([6, 1, 3, 1, 0], device=device)
    Dp = torch.full((4, 40, 96), float("nan"), dtype=torch.float16, device=device)
    doc_lengths = torch.tensor([40, 0, 1, 23], device=device)
    for n, length in enumerate(doc_lengths.tolist()):
        Dp[n, :length] = _rand(length, 96, dtype=torch.float16, device=device)
    cfg = config
    padded_cfg = cfg if not cfg.slots else None
    scores = {}
    for repeat in (True, False):
        monkeypatch.setattr(dense, "_repeat_rows", lambda num_queries, c, dim, repeat=repeat: repeat)
        scores[repeat] = (maxsim_packed(Q, D, offsets, pids, config=cfg),
                          maxsim_padded(Q, Dp, doc_lengths, config=padded_cfg))
    refs = (reference.maxsim_packed(Q, D, offsets, pids),
            reference.maxsim_padded(Q, Dp, doc_lengths))
    for repeated, masked, ref in zip(scores[True], scores[False], refs):
        if repeated.is_cuda:
            assert torch.equal(repeated, masked)
        for out in (repeated, masked):
            assert_close(out, ref, "maxsim_dense", torch.float16)


def test_slots_with_64_bit_lengths_score_as_32_bit_ones(device, monkeypatch):
    """The slots kernel's token positions in 64 bits (TOKENS_I32 off, for a packed tensor past
    2^31 rows) score as the 32-bit ones, rows repeated and masked."""
    assert dense._lengths_fit_int32(2**31 - 1) and not dense._lengths_fit_int32(2**31)
    D, offsets = _packed_from_lengths([3, 0, 40, 1, 17], 64, torch.float16, device)
    Q = _rand(4, 8, 64, dtype=torch.float16, device=device)
    config = MaxSimConfig(block_t=16, queries_per_block=4, docs_per_program=2, slots=True)
    ref = reference.maxsim_packed(Q, D, offsets)
    for repeat in (True, False):
        monkeypatch.setattr(dense, "_repeat_rows", lambda num_queries, c, dim, repeat=repeat: repeat)
        narrow = maxsim_packed(Q, D, offsets, config=config)
        monkeypatch.setattr(dense, "_lengths_fit_int32", lambda num_rows: False)
        wide = maxsim_packed(Q, D, offsets, config=config)
        monkeypatch.undo()
        assert torch.equal(narrow, wide)
        assert_close(wide, ref, "maxsim_dense", torch.float16)


FLAT_CONFIGS = [
    pytest.param(1, 32, 128, MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True,
                                          num_warps=1), id="one-warp-32-rows"),
    pytest.param(1, 64, 64, MaxSimConfig(block_t=32, docs_per_program=8, hold_query=True),
                 id="64-rows"),
    pytest.param(4, 32, 128, MaxSimConfig(block_t=32, queries_per_block=4, docs_per_program=8,
                                          hold_query=True), id="4-queries"),
    pytest.param(3, 19, 96, MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=2,
                                         hold_query=True, block_d=32), id="held-chunks"),
    pytest.param(2, 9, 64, MaxSimConfig(block_t=16, docs_per_program=1, hold_query=True),
                 id="one-document-a-program"),
    # One query's default at d = 144 (the last 32-column chunk half masked) and d = 256.
    pytest.param(1, 32, 144, MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True,
                                          num_warps=1, block_d=32), id="one-warp-d144"),
    pytest.param(1, 24, 256, MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True,
                                          num_warps=1, block_d=64), id="one-warp-d256"),
    # d = 144 as one 128-column chunk and a 16-column remainder.
    pytest.param(1, 32, 144, MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True,
                                          num_warps=1, block_d=128), id="one-warp-d144-128+16"),
]


def flat_where_it_applies(num_queries, config, packed, tail_tokens, mean_tokens):
    """ops.dense._flat_documents forced on wherever the flat kernel applies."""
    return dense._flat_applies(config, packed, tail_tokens)


@pytest.mark.parametrize("B,Lq,d,config", FLAT_CONFIGS)
def test_flat_documents_score_as_a_loop_per_document(B, Lq, d, config, device, monkeypatch):
    """The held query's documents walked as one loop (_maxsim_packed_flat_kernel, rows past a
    document's end repeated) score as the loop per document with rows masked or repeated: empty
    documents (first, last, in a row), one-token ones, a last program with fewer documents,
    pids, query lengths, strided views, token positions in 32 and 64 bits; a packed tensor of
    no rows takes the loop per document."""
    assert dense._flat_applies(config, True, 0)
    lengths = [0, 3, 0, 0, 50, 1, 17, 64, 2, 33, 5, 0]
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(B, Lq, d, dtype=torch.float16, device=device)
    pids = torch.tensor([11, 4, 0, 2, 6, 6, 9], device=device)
    q_lengths = torch.tensor([Lq, 0, 5, 1][:B], device=device)
    calls = [((Q, D, offsets), {}), ((Q, D, offsets, pids), {"query_lengths": q_lengths}),
             ((_strided(Q), _strided(D), _strided(offsets), _strided(pids)), {})]
    fits = dense._row_offsets_fit_int32
    for repeat, wide in ((True, False), (False, False), (True, True)):
        monkeypatch.setattr(dense, "_repeat_rows", lambda num_queries, c, dim, repeat=repeat: repeat)
        monkeypatch.setattr(dense, "_row_offsets_fit_int32",
                            (lambda *a: False) if wide else fits)
        for args, kwargs in calls:
            monkeypatch.setattr(dense, "_flat_documents", flat_where_it_applies)
            flat = maxsim_packed(*args, config=config, **kwargs)
            monkeypatch.setattr(dense, "_flat_documents", lambda *a: False)
            per_document = maxsim_packed(*args, config=config, **kwargs)
            if flat.is_cuda:
                assert torch.equal(flat, per_document)
            ref = reference.maxsim_packed(Q, D, offsets, *args[3:], **kwargs)
            assert_close(flat, ref, "maxsim_dense", torch.float16)
    monkeypatch.setattr(dense, "_flat_documents", flat_where_it_applies)
    none = maxsim_packed(Q, D[:0], torch.zeros(4, dtype=torch.int64, device=device),
                         config=config)
    assert torch.equal(none, torch.full_like(none, float("-inf")))


OUT_OF_ORDER_CONFIGS = [*(c.values[0] for c in CONFIGS), *(c.values[3] for c in FLAT_CONFIGS)]


@pytest.mark.parametrize("config", OUT_OF_ORDER_CONFIGS)
def test_an_end_before_its_start_is_an_empty_document(config, device, monkeypatch):
    """Offsets out of order but inside the rows (what a check judged after the launch gives
    it, before it raises): every kernel path scores a document whose end is before its start
    as empty (-inf) and reads no row outside the others' bounds."""
    lengths = [3, 0, 50, 1, 17, 64, 2, 9]
    D, offsets = _packed_from_lengths(lengths, 64, torch.float16, device)
    offsets[4], offsets[7] = 40, 120  # documents 3 and 6 end before they start
    Q = _rand(3, 19, 64, dtype=torch.float16, device=device)
    rows, want_offsets = rows_in_order(offsets)
    want_D = D[rows]
    pids = torch.tensor([3, 6, 5, 1, 7], device=device)
    monkeypatch.setattr(dense, "_flat_documents", flat_where_it_applies)
    for args in ((), (pids,)):
        out = maxsim_packed(Q, D, offsets, *args, max_doc_len=64, config=config, validate=False)
        want = reference.maxsim_packed(Q, want_D, want_offsets, *args)
        assert_close(out, want, "maxsim_dense", torch.float16)
        empty = [3, 6] if not args else [0, 1]
        assert (out[:, empty] == float("-inf")).all()


REPEAT_ROWS_RULE = dense._repeat_rows


def force_row_masks(monkeypatch, way: str) -> None:
    """Rows past a document's end as ``way`` says: "masked" (never repeated) or "default" (the
    host's rule: repeated for several queries and at d <= 64)."""
    monkeypatch.setattr(dense, "_repeat_rows",
                        REPEAT_ROWS_RULE if way == "default" else lambda *args: False)


# The dense kernel's paths with rows past a document's end masked: the held query (one query
# of 48 tokens, four queries' 128-row block, chunks of d with a masked last one), the query read
# per document.
MASK_CONFIGS = [
    pytest.param(1, 48, 128, MaxSimConfig(block_t=32, docs_per_program=8, hold_query=True),
                 id="held-64-rows"),
    pytest.param(4, 32, 128, MaxSimConfig(block_t=32, queries_per_block=4, docs_per_program=8,
                                          hold_query=True), id="held-4-queries"),
    pytest.param(1, 32, 144, MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True,
                                          block_d=32), id="held-d144-chunks"),
    pytest.param(3, 19, 80, MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=3),
                 id="streamed-d80"),
]


@pytest.mark.parametrize("B,Lq,d,config", MASK_CONFIGS)
def test_masked_rows_past_a_document_never_win(B, Lq, d, config, device, monkeypatch):
    """Rows past a document's end, masked or (the default for several queries) repeated, score
    as the reference: empty documents, one-token ones, documents of whole tiles and one row
    short of one, the packed tensor's NaN rows past its last document, pids, query lengths, a
    row stride wider than d, every product negative (a masked row read as 0 must not win)."""
    lengths = [0, 3, 0, 50, 1, 17, 64, 2, 33, 5, 31, 32, 0]
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(B, Lq, d, dtype=torch.float16, device=device)
    pids = torch.tensor([12, 3, 0, 2, 6, 6, 9, 4, 5, 10, 11], device=device)
    q_lengths = torch.tensor([Lq, 0, 5, 1, 7][:B], device=device)
    wide = torch.zeros(D.shape[0], d + 8, dtype=D.dtype, device=device)
    wide[:, :d] = D
    # Every product negative: an unmasked row past a document's end (read as 0) would win.
    calls = [((Q, D, offsets), {}), ((Q, D, offsets, pids), {"query_lengths": q_lengths}),
             ((Q, wide[:, :d], offsets), {}), ((Q.abs(), -D.abs(), offsets, pids), {})]
    for args, kwargs in calls:
        ref = reference.maxsim_packed(*args, **kwargs)
        for way in ("default", "masked"):
            force_row_masks(monkeypatch, way)
            out = maxsim_packed(*args, config=config, validate=False, **kwargs)
            assert_close(out, ref, "maxsim_dense", torch.float16)


def test_flat_documents_cover_the_held_query_over_packed_documents():
    held = MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True)
    assert dense._flat_applies(held, True, 0)
    assert not dense._flat_applies(held, False, 0)  # padded
    assert not dense._flat_applies(held, True, 1)  # a tail block
    assert not dense._flat_applies(MaxSimConfig(docs_per_program=4), True, 0)
    assert not dense._flat_applies(MaxSimConfig(hold_query=True, running_max=True), True, 0)
    assert not dense._flat_applies(MaxSimConfig(hold_query=True, docs_per_program=3), True, 0)


def test_flat_documents_for_one_query_held_by_one_warp_over_short_documents():
    one_warp = MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True, num_warps=1)
    short = dense.FLAT_MAX_MEAN_TOKENS
    assert dense._flat_documents(1, one_warp, True, 0, short)
    assert not dense._flat_documents(1, one_warp, True, 0, short + 1)
    assert not dense._flat_documents(2, one_warp, True, 0, short)
    assert not dense._flat_documents(1, dataclasses.replace(one_warp, num_warps=4), True, 0, 30)
    assert not dense._flat_documents(1, one_warp, False, 0, 30)
    # The default at lognormal-30-like lengths takes it wherever it holds one query in one warp
    # (d = 96 and 144 in 32-column chunks, 192 and 256 in 64-column ones), the headline's
    # lengths do not; d = 384 is not held.
    for d in (64, 96, 128, 144, 192, 256):
        config = dense.default_config(1, 32, None, d, True, dense.MANY_DOCS)
        assert dense._flat_documents(1, config, True, 0, 30.0)
        assert not dense._flat_documents(1, config, True, 0, 70.0)
    config = dense.default_config(1, 32, None, 384, True, dense.MANY_DOCS)
    assert not dense._flat_documents(1, config, True, 0, 30.0)


def test_rows_repeat_for_several_queries_or_narrow_rows():
    """One query is bound by the read (masked rows are never fetched) except where rows are
    narrow; several queries by the products' selects. A running max masks only its last tile
    and keeps its own way."""
    assert dense._repeat_rows(4, MaxSimConfig(), 128)
    assert not dense._repeat_rows(1, MaxSimConfig(hold_query=True), 128)
    assert not dense._repeat_rows(1, MaxSimConfig(hold_query=True), dense.REPEAT_ROWS_MAX_DIM + 16)
    assert dense._repeat_rows(1, MaxSimConfig(hold_query=True), dense.REPEAT_ROWS_MAX_DIM)
    assert dense._repeat_rows(1, MaxSimConfig(), 48)
    assert not dense._repeat_rows(4, MaxSimConfig(running_max=True), 128)
    assert not dense._repeat_rows(1, MaxSimConfig(running_max=True), 64)


# What default_config chooses for each input class (tests/ops/test_dense.py), run on small inputs:
# (B, Lq, d, packed, documents the rule is asked about).
DEFAULT_SHAPES = [
    pytest.param(1, 32, 128, True, MANY_DOCS, id="one-query-many-docs"),
    pytest.param(1, 33, 128, True, MANY_DOCS, id="one-query-64-rows-many-docs"),
    pytest.param(1, 32, 144, True, 0, id="one-query-d144"),
    pytest.param(1, 32, 144, True, MANY_DOCS, id="one-query-d144-many-docs"),
    pytest.param(1, 32, 96, True, MANY_DOCS, id="one-query-d96-many-docs"),
    pytest.param(1, 33, 96, True, MANY_DOCS, id="one-query-64-rows-d96-many-docs"),
    pytest.param(1, 48, 144, True, MANY_DOCS, id="one-query-64-rows-d144-many-docs"),
    pytest.param(1, 16, 144, True, MANY_DOCS, id="one-query-16-rows-d144-many-docs"),
    pytest.param(1, 32, 192, True, MANY_DOCS, id="one-query-d192-many-docs"),
    pytest.param(1, 32, 192, True, 0, id="one-query-d192"),
    pytest.param(4, 32, 128, False, 0, id="one-query-block-padded"),
    pytest.param(1, 64, 128, False, MANY_DOCS, id="one-query-64-rows-padded-many-docs"),
    pytest.param(1, 64, 256, True, 0, id="one-query-64-rows-d256"),
    pytest.param(8, 32, 128, True, 0, id="several-queries-packed"),
]


@pytest.mark.parametrize("joins_tail", [False, True])
@pytest.mark.parametrize("B,Lq", [(4, 32), (5, 17), (3, 40)])
def test_default_full_query_blocks_of_several_queries_are_exact(B, Lq, joins_tail, device):
    """Several queries over many packed documents longer than one tile: 128-row query blocks
    over eight documents a tile in order of length, or held across documents for a head that
    holds its tail (a last block partly empty at B = 5 and 3)."""
    lengths = [3, 0, 150, 1, 17, 64, 2, 129, 9, 33]
    config = default_config(B, Lq, max(lengths), 128, variable_lengths=True, num_docs=MANY_DOCS,
                            joins_tail=joins_tail)
    assert config.queries_per_block * 2 ** (Lq - 1).bit_length() == 128
    assert (config.hold_query, config.slots and config.length_order) == (joins_tail, not joins_tail)
    Q = _rand(B, Lq, 128, dtype=torch.float16, device=device)
    D, offsets = _packed_from_lengths(lengths, 128, torch.float16, device)
    out = maxsim_packed(Q, D, offsets, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("Lq", [33, 40])
def test_default_split_of_several_queries_past_a_power_of_two_is_exact(Lq, packed, device):
    """Four queries of 33-48 tokens go in two launches (32 tokens, then the rest) whose scores
    add up; with query lengths, some queries end inside the first launch."""
    assert default_query_chunks(4, Lq) == [32, Lq - 32]
    lengths = [3, 0, 50, 1, 17, 64, 2, 9]
    Q = _rand(4, Lq, 64, dtype=torch.float16, device=device)
    D, offsets = _packed_from_lengths(lengths, 64, torch.float16, device)
    q_lengths = torch.tensor([Lq, 20, 33, 1], device=device)
    if packed:
        out = maxsim_packed(Q, D, offsets, query_lengths=q_lengths)
        ref = reference.maxsim_packed(Q, D, offsets, query_lengths=q_lengths)
    else:
        D_padded = torch.zeros(len(lengths), max(lengths), 64, dtype=torch.float16, device=device)
        for n, (start, end) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
            D_padded[n, :end - start] = D[start:end]
        doc_lengths = torch.tensor(lengths, device=device)
        out = maxsim_padded(Q, D_padded, doc_lengths, query_lengths=q_lengths)
        ref = reference.maxsim_padded(Q, D_padded, doc_lengths, query_lengths=q_lengths)
    assert_close(out, ref, "maxsim_dense", torch.float16)


@pytest.mark.parametrize("way", ["default", "masked"])
@pytest.mark.parametrize("B,Lq,d,q_lengths", [
    (4, 33, 128, None), (4, 40, 64, [40, 20, 33, 1]), (5, 48, 96, [48, 33, 32, 0, 47]),
    (4, 65, 64, [65, 64, 64, 3]), (8, 96, 64, None)])
def test_a_tail_joining_the_held_head_is_exact(B, Lq, d, q_lengths, way, device, monkeypatch):
    """Where the head's default launch holds its query block (many packed documents), a query
    of 33-48 (65-96) tokens is scored in one launch: the tail tokens of every query of a block
    as a second held block over the same tiles. Query lengths end some queries in the head,
    some in the tail, one before it starts; Q, D_packed, offsets and query_lengths are strided
    views; a last block is partly empty. Rows past a document's end repeated (the default) or
    masked."""
    force_row_masks(monkeypatch, way)
    monkeypatch.setattr(dense, "MANY_DOCS", 4)  # the held default on a few documents
    monkeypatch.setattr(dense, "TAIL_JOIN_MIN_ROWS", 16)  # every tail block joins here
    head, tail = default_query_chunks(B, Lq)
    assert dense.tail_joins_head(B, head, tail, None, d, True, 10)
    launched = []
    real = dense._launch_kernel
    monkeypatch.setattr(dense, "_launch_kernel",
                        lambda *a, **k: launched.append(k) or real(*a, **k))
    lengths = [3, 0, 150, 1, 17, 64, 2, 129, 9, 33]
    Q = _rand(B, Lq, 2 * d, dtype=torch.float16, device=device)[:, :, ::2]
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    D = torch.cat([D, torch.zeros_like(D)], 1)[:, :d]  # rows of stride 2 * d
    offsets = torch.stack([offsets, torch.zeros_like(offsets)], 1)[:, 0]
    ql = None if q_lengths is None else torch.stack(
        [torch.tensor(q_lengths[:B], device=device)] * 2, 1)[:, 0]
    out = maxsim_packed(Q, D, offsets, query_lengths=ql)
    assert [k["tail_tokens"] for k in launched] == [tail]
    assert_close(out, reference.maxsim_packed(Q, D, offsets, query_lengths=ql), "maxsim_dense",
                 torch.float16)


@pytest.mark.parametrize("d,block_d", [pytest.param(144, 128, id="d144-128+16"),
                                       pytest.param(80, 32, id="d80-2x32+16")])
def test_a_joined_tail_takes_the_remainder_chunk(d, block_d, device):
    """A tail held beside its head's block multiplies the same chunks of d as the head, the
    narrower last one included."""
    B, Lq, tail = 4, 40, 8
    Q = _rand(B, Lq, d, dtype=torch.float16, device=device)
    D, offsets = _packed_from_lengths([3, 0, 40, 1, 17, 33], d, torch.float16, device)
    query_lengths = torch.tensor([40, 20, 33, 0], device=device)
    out = dense._launch_kernel(
        Q, D, packed=True, offsets=offsets, doc_lengths=None, pids=None,
        query_lengths=query_lengths, num_out_docs=6, padded_doc_len=0, max_doc_len=None,
        config=MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=4,
                            hold_query=True, block_d=block_d), tail_tokens=tail)
    assert dense._remainder_chunk(d, block_d) == 16
    assert_close(out, reference.maxsim_packed(Q, D, offsets, query_lengths=query_lengths),
                 "maxsim_dense", torch.float16)


def test_which_tails_join_the_head():
    """A tail joins a held head where its block has TAIL_JOIN_MIN_ROWS rows: 4 queries' 16
    tokens (Lq 41-48), 2 queries' 32 (Lq 81-96); smaller tails, few documents (no held block)
    and padded documents keep the second launch."""
    many = MANY_DOCS
    assert dense.tail_joins_head(4, 32, 16, None, 128, True, many)  # 4 x 16 rows
    assert dense.tail_joins_head(16, 32, 9, None, 128, True, many)
    assert dense.tail_joins_head(4, 64, 32, None, 128, True, many)  # 2 x 32 rows
    assert not dense.tail_joins_head(4, 32, 1, None, 128, True, many)  # 4 x 1 (16 padded)
    assert not dense.tail_joins_head(4, 32, 8, None, 128, True, many)  # 4 x 8
    assert not dense.tail_joins_head(4, 64, 16, None, 128, True, many)  # 2 x 16
    assert not dense.tail_joins_head(4, 32, 16, None, 128, True, many - 1)
    assert not dense.tail_joins_head(4, 32, 16, None, 128, False, many)  # padded


def test_a_tail_needs_the_held_tiled_path(device):
    Q = _rand(4, 33, 64, dtype=torch.float16, device=device)
    D, offsets = _packed_from_lengths([3, 5], 64, torch.float16, device)
    with pytest.raises(ValueError, match="tail of 1 query tokens"):
        dense._launch_kernel(Q, D, packed=True, offsets=offsets, doc_lengths=None, pids=None,
                             query_lengths=None, num_out_docs=2, padded_doc_len=0, max_doc_len=5,
                             config=MaxSimConfig(block_t=16, queries_per_block=4), tail_tokens=1)


@pytest.mark.parametrize("B,Lq,d,packed,num_docs", DEFAULT_SHAPES)
def test_default_configs_are_exact(B, Lq, d, packed, num_docs, device):
    lengths = [3, 0, 50, 1, 17, 64, 2, 128, 9]
    config = default_config(B, Lq, max(lengths), d, variable_lengths=packed, num_docs=num_docs)
    Q = _rand(B, Lq, d, dtype=torch.float16, device=device)
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    if packed:
        out = maxsim_packed(Q, D, offsets, config=config)
        assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)
        return
    D_padded = torch.zeros(len(lengths), max(lengths), d, dtype=torch.float16, device=device)
    for n, (start, end) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        D_padded[n, :end - start] = D[start:end]
    doc_lengths = torch.tensor(lengths, device=device)
    out = maxsim_padded(Q, D_padded, doc_lengths, config=config)
    assert_close(out, reference.maxsim_padded(Q, D_padded, doc_lengths), "maxsim_dense", torch.float16)


def test_hold_query_padded(device):
    """The padded layout takes the held query too (documents of several tiles, doc lengths)."""
    Q = _rand(3, 9, 96, dtype=torch.float16, device=device)
    D = _rand(7, 40, 96, dtype=torch.float16, device=device)
    lengths = torch.tensor([40, 0, 1, 17, 33, 16, 39], device=device)
    for running_max in (False, True):
        out = maxsim_padded(Q, D, lengths, config=MaxSimConfig(
            block_t=16, docs_per_program=2, hold_query=True, running_max=running_max))
        assert_close(out, reference.maxsim_padded(Q, D, lengths), "maxsim_dense", torch.float16)



@pytest.mark.parametrize("config", [
    pytest.param(None, id="default"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True, block_d=32),
                 id="held-chunks"),
    pytest.param(MaxSimConfig(block_t=32, num_warps=2, num_stages=2), id="tiles")])
def test_64_bit_row_offsets_score_as_32_bit_ones(config, device, monkeypatch):
    """Documents whose row offsets would overflow int32 take 64-bit ones (TOKENS_I32 False):
    the same scores, bit for bit, on packed and padded documents, at d = 96 (a masked chunk)."""
    D, offsets = _packed_from_lengths([3, 0, 40, 1, 17], 96, torch.float16, device)
    Q = _rand(1, 9, 96, dtype=torch.float16, device=device)
    Dp = _rand(4, 33, 96, dtype=torch.float16, device=device)
    lengths = torch.tensor([33, 0, 1, 20], device=device)
    assert not dense._row_offsets_fit_int32(2**31 // 128, 128, 128, 1)
    assert dense._row_offsets_fit_int32(2**31 // 128 - 2, 128, 128, 1)
    # The default takes 32-bit offsets where d is one chunk only; here both, wherever they fit.
    assert dense._tokens_i32(100, 1, 128, 128, 1) and not dense._tokens_i32(100, 2, 64, 128, 1)
    monkeypatch.setattr(dense, "_tokens_i32", lambda rows, tiles, block_d, sdt, sdd:
                        dense._row_offsets_fit_int32(rows, tiles * block_d, sdt, sdd))
    narrow = (maxsim_packed(Q, D, offsets, config=config),
              maxsim_padded(Q, Dp, lengths, config=config))
    monkeypatch.setattr(dense, "_tokens_i32", lambda *args: False)
    wide = (maxsim_packed(Q, D, offsets, config=config),
            maxsim_padded(Q, Dp, lengths, config=config))
    for a, b in zip(narrow, wide):
        assert torch.equal(a, b)
    assert_close(narrow[0], reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)


# block_d: d in narrower chunks, with no masked column where block_d divides d (96 as 3 x 32,
# 144 as 9 x 16, 80 as 5 x 16, 256 as 4 x 64: the default's held chunks past one), with a
# narrower last chunk where d is past whole chunks by a power of two (144 as 128 + 16 and as
# 4 x 32 + 16, 96 as 64 + 32; the slots kernel masks it instead), and with a masked last chunk
# where it is past them by another width (112 as 64 + 48 in two 64-column chunks).
BLOCK_D_CASES = [
    pytest.param(256, 64, id="d256-4x64"),
    pytest.param(96, 32, id="d96-3x32"),
    pytest.param(144, 16, id="d144-9x16"),
    pytest.param(80, 16, id="d80-5x16"),
    pytest.param(144, 128, id="d144-128+16"),
    pytest.param(144, 32, id="d144-4x32+16"),
    pytest.param(96, 64, id="d96-64+32"),
    pytest.param(112, 64, id="d112-masked-2x64"),
]


def _block_d_configs(block_d):
    """Every path that walks several d chunks: per-document tiles (several documents per
    program), the query held as one tile per chunk (three documents a program) and packed
    slots."""
    return [MaxSimConfig(block_t=16, docs_per_program=2, block_d=block_d),
            MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True, block_d=block_d),
            MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=2, slots=True,
                         block_d=block_d)]


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("d,block_d", BLOCK_D_CASES)
def test_block_d_packed_is_exact(d, block_d, B, device):
    D, offsets = _packed_from_lengths([3, 0, 20, 1, 9, 17], d, torch.float16, device)
    Q = _rand(B, 9, d, dtype=torch.float16, device=device)
    query_lengths = torch.tensor([9, 0, 4, 1][:B], device=device)
    pids = torch.tensor([5, 1, 2, 2], device=device)
    for config in _block_d_configs(block_d):
        out = maxsim_packed(Q, D, offsets, query_lengths=query_lengths, config=config)
        expected = reference.maxsim_packed(Q, D, offsets, query_lengths=query_lengths)
        assert_close(out, expected, "maxsim_dense", torch.float16)
        out = maxsim_packed(Q, D, offsets, pids, config=config)
        assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense",
                     torch.float16)


@pytest.mark.parametrize("d,block_d", [pytest.param(96, 32, id="d96-3x32"),
                                       pytest.param(144, 16, id="d144-9x16"),
                                       pytest.param(144, 128, id="d144-128+16")])
def test_held_chunks_read_strided_views(d, block_d, device):
    """The query held one tile per chunk reads Q, D, offsets, pids and query lengths through
    their strides: views (every other column and row of wider tensors, columns of 2-D index
    tensors) score as their contiguous copies, bit for bit, and as the reference."""
    D, offsets = _packed_from_lengths([3, 0, 20, 1, 9, 17], d, torch.float16, device)
    Q = _rand(2, 9, d, dtype=torch.float16, device=device)
    wide_D = torch.zeros(D.shape[0] * 2, d * 2, dtype=D.dtype, device=device)
    wide_D[::2, ::2] = D
    wide_Q = torch.zeros(2, 18, d * 2, dtype=Q.dtype, device=device)
    wide_Q[:, ::2, ::2] = Q
    pids = torch.tensor([5, 1, 2, 2], device=device)
    query_lengths = torch.tensor([9, 4], device=device)

    def column(t):
        return torch.stack([t, torch.zeros_like(t)], 1)[:, 0]

    config = MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True, block_d=block_d)
    views = maxsim_packed(wide_Q[:, ::2, ::2], wide_D[::2, ::2], column(offsets), column(pids),
                          query_lengths=column(query_lengths), config=config)
    copies = maxsim_packed(Q, D, offsets, pids, query_lengths=query_lengths, config=config)
    assert torch.equal(views, copies)
    assert_close(copies, reference.maxsim_packed(Q, D, offsets, pids, query_lengths=query_lengths),
                 "maxsim_dense", torch.float16)


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("d,block_d", BLOCK_D_CASES)
def test_block_d_padded_is_exact(d, block_d, B, device):
    Q = _rand(B, 9, d, dtype=torch.float16, device=device)
    D = _rand(5, 20, d, dtype=torch.float16, device=device)
    doc_lengths = torch.tensor([20, 0, 1, 17, 16], device=device)
    for config in (MaxSimConfig(block_t=16, docs_per_program=2, block_d=block_d),
                   MaxSimConfig(block_t=16, docs_per_program=2, hold_query=True, block_d=block_d)):
        out = maxsim_padded(Q, D, doc_lengths, config=config)
        assert_close(out, reference.maxsim_padded(Q, D, doc_lengths), "maxsim_dense", torch.float16)


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bf16"),
                                   pytest.param(torch.float32, id="fp32")])
def test_block_d_other_dtypes(dtype, device):
    """16-column chunks in bf16 and in fp32 (tf32x3 products of K = 16)."""
    D, offsets = _packed_from_lengths([3, 0, 20, 1], 144, dtype, device)
    Q = _rand(2, 9, 144, dtype=dtype, device=device)
    for config in _block_d_configs(16):
        out = maxsim_packed(Q, D, offsets, config=config)
        assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", dtype)


def test_block_d_of_one_chunk_keeps_the_one_chunk_paths(device):
    """A block_d that covers d (wider than d: a masked chunk) takes single_tile, and hold_query
    with one held tile."""
    D, offsets = _packed_from_lengths([3, 0, 20, 1, 9], 80, torch.float16, device)
    Q = _rand(3, 9, 80, dtype=torch.float16, device=device)
    expected = reference.maxsim_packed(Q, D, offsets)
    for config in (MaxSimConfig(block_t=16, docs_per_program=2, hold_query=True, block_d=128),
                   MaxSimConfig(block_t=32, q_blocks_per_program=2, single_tile=True,
                                block_d=128)):
        assert_close(maxsim_packed(Q, D, offsets, config=config), expected, "maxsim_dense",
                     torch.float16)

def test_empty_document_scores_minus_inf_and_empty_query_zero(device):
    Q = _rand(2, 4, 64, dtype=torch.float32, device=device)
    D = _rand(2, 3, 64, dtype=torch.float32, device=device)
    out = maxsim_padded(Q, D, torch.tensor([0, 3], device=device), torch.tensor([4, 0], device=device))
    assert out[0, 0] == float("-inf")
    assert out[1, 0] == 0 and out[1, 1] == 0
    assert torch.isfinite(out[0, 1])


def test_int64_offsets_past_2_31_elements(device):
    d = 128
    rows = (2**31) // d + 4096  # the last documents start past element 2**31
    D = torch.empty(rows, d, dtype=torch.float16, device=device)
    D[-64:] = _rand(64, d, dtype=torch.float16, device=device)
    offsets = torch.tensor([0, 10, rows - 64, rows - 1, rows], device=device)
    D[:10] = _rand(10, d, dtype=torch.float16, device=device)
    Q = _rand(1, 32, d, dtype=torch.float16, device=device)
    pids = torch.tensor([2, 3, 0], device=device)
    out = maxsim_packed(Q, D, offsets, pids)
    expected = torch.stack([reference.maxsim_packed(Q, D[int(offsets[p]):int(offsets[p + 1])],
                                                    torch.tensor([0, int(offsets[p + 1] - offsets[p])]))[0, 0]
                            for p in pids.tolist()])
    assert_close(out[0], expected, "maxsim_dense", torch.float16)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    B=st.integers(1, 4),
    Lq=st.integers(0, 40),
    lengths=st.lists(st.integers(0, 80), min_size=0, max_size=9),
    d=st.sampled_from([16, 64, 96, 128, 200]),
    with_pids=st.booleans(),
)
def test_packed_property(B, Lq, lengths, d, with_pids, device):
    """Any lengths, any query length (0 included), any subset of documents: exact and never NaN."""
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(B, Lq, d, dtype=torch.float16, device=device)
    pids = None
    if with_pids and lengths:
        pids = torch.randint(0, len(lengths), (len(lengths) + 2,), device=device)
    out = maxsim_packed(Q, D, offsets, pids)
    expected = reference.maxsim_packed(Q, D, offsets, pids)
    assert_close(out, expected, "maxsim_dense", torch.float16)


@settings(max_examples=property_examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    B=st.integers(1, 5),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=7),
    block_t=st.sampled_from([4, 16, 32, 64]),
    queries_per_block=st.sampled_from([1, 2, 4]),
    q_blocks_per_program=st.integers(1, 3),
    docs_per_program=st.integers(1, 4),
    kind=st.sampled_from(["plain", "single_tile", "slots", "hold_query"]),
    with_pids=st.booleans(),
    block_d=st.sampled_from([None, 16, 32, 64, 128]),
    row_masks=st.sampled_from(["default", "masked"]),
    d=st.sampled_from([64, 80]),
)
def test_any_config_is_exact_or_refused(B, lengths, block_t, queries_per_block, q_blocks_per_program,
                                        docs_per_program, kind, with_pids, block_d, row_masks, d,
                                        device, monkeypatch):
    """Over the whole MaxSimConfig space, rows past a document's end repeated or masked, d in
    whole chunks or with a remainder (80 as 2 x 32 + 16, 64 + 16, or one masked chunk): a
    launch either matches the float64 reference in every element or is refused with a
    ValueError naming the config, never a silent partial result."""
    force_row_masks(monkeypatch, row_masks)
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(B, 13, d, dtype=torch.float16, device=device)
    pids = torch.randint(0, len(lengths), (len(lengths) + 1,), device=device) if with_pids else None
    config = MaxSimConfig(block_t=block_t, queries_per_block=queries_per_block,
                          q_blocks_per_program=q_blocks_per_program, docs_per_program=docs_per_program,
                          single_tile=kind == "single_tile", slots=kind == "slots",
                          hold_query=kind == "hold_query", block_d=block_d)
    try:
        out = maxsim_packed(Q, D, offsets, pids, config=config)
    except ValueError as error:
        assert "config" in str(error)
        return
    assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense", torch.float16)


def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values as a view in which no dimension has unit stride."""
    return torch.stack([x, torch.zeros_like(x)], -1)[..., 0]


@pytest.mark.parametrize("config", [
    pytest.param(None, id="default"),
    pytest.param(MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=2, slots=True),
                 id="slots"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True), id="hold-query"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True, running_max=True),
                 id="running-max"),
])
@pytest.mark.parametrize("validate", [True, False])
def test_every_argument_as_a_strided_view(config, validate, device):
    """Every tensor argument passed as a non-contiguous view scores exactly as its contiguous
    copy: Q and D through their strides, the 1-D tensors copied once."""
    lengths = [3, 0, 50, 1, 17, 6]
    D, offsets = _packed_from_lengths(lengths, 64, torch.float16, device)
    Q = _rand(3, 13, 64, dtype=torch.float16, device=device)
    pids = torch.tensor([4, 0, 2, 2, 5], device=device)
    query_lengths = torch.tensor([13, 5, 0], device=device)
    args = (Q, D, offsets, pids)
    want = maxsim_packed(*args, query_lengths=query_lengths, config=config, validate=validate)
    got = maxsim_packed(*map(_strided, args), query_lengths=_strided(query_lengths),
                        config=config, validate=validate)
    assert torch.equal(got, want)
    assert_close(got, reference.maxsim_packed(Q, D, offsets, pids, query_lengths=query_lengths),
                 "maxsim_dense", torch.float16)
    if config is not None and config.slots:
        return  # slots are for the packed layout
    D_padded = _rand(6, 20, 64, dtype=torch.float16, device=device)
    doc_lengths = torch.tensor([20, 0, 7, 1, 19, 3], device=device)
    want = maxsim_padded(Q, D_padded, doc_lengths, query_lengths, config=config, validate=validate)
    got = maxsim_padded(_strided(Q), _strided(D_padded), _strided(doc_lengths),
                        _strided(query_lengths), config=config, validate=validate)
    assert torch.equal(got, want)
    assert_close(got, reference.maxsim_padded(Q, D_padded, doc_lengths, query_lengths),
                 "maxsim_dense", torch.float16)


def test_length_order_follows_offsets_written_in_place(device):
    """config.length_order's order is remembered per offsets tensor (checks.derived): offsets
    rewritten in place (new lengths, same object) take a new order, and either way every score
    is stored at its own document's position."""
    from tilemaxsim_plaid.ops.dense import _length_order

    config = MaxSimConfig(block_t=4, queries_per_block=4, docs_per_program=4, slots=True,
                          length_order=True)
    lengths = [9, 0, 2, 31, 5, 5, 17, 1, 12]
    D, offsets = _packed_from_lengths(lengths, 64, torch.float16, device)
    Q = _rand(3, 7, 64, dtype=torch.float16, device=device)
    order = _length_order(offsets, None)
    assert torch.equal(torch.tensor(lengths)[order.cpu()], torch.tensor(sorted(lengths)))
    assert_close(maxsim_packed(Q, D, offsets, config=config),
                 reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)
    # The same total, other documents: lengths reversed.
    offsets[1:] = torch.tensor(lengths[::-1], device=device).cumsum(0)
    new_order = _length_order(offsets, None)
    assert torch.equal(torch.tensor(lengths[::-1])[new_order.cpu()], torch.tensor(sorted(lengths)))
    assert_close(maxsim_packed(Q, D, offsets, config=config),
                 reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)
    # pids (repeats, every length) ordered by their documents' lengths.
    pids = torch.tensor([3, 3, 0, 8, 1], device=device)
    by_pid = torch.tensor(lengths[::-1])[pids.cpu()]
    assert torch.equal(by_pid[_length_order(offsets, pids).cpu()], by_pid.sort().values)


def test_length_order_reads_strided_views_and_keeps_nan_where_it_lands(device):
    """config.length_order with offsets and pids as strided views (a column of a 2-D tensor) and
    a NaN in one document's token: the NaN reaches exactly that document's scores, every other
    score matches the float64 reference, wherever the order puts the documents."""
    config = MaxSimConfig(block_t=8, queries_per_block=4, docs_per_program=4, slots=True,
                          length_order=True)
    lengths = [5, 0, 33, 1, 12, 20, 2, 7]
    D, offsets = _packed_from_lengths(lengths, 32, torch.float16, device)
    D[int(offsets[4]) + 3, 7] = float("nan")  # document 4
    Q = _rand(3, 9, 32, dtype=torch.float16, device=device)
    offsets_view = torch.stack([offsets, torch.zeros_like(offsets)], 1)[:, 0]
    pids = torch.tensor([7, 4, 2, 4, 1, 0, 5], device=device)
    pids_view = torch.stack([pids, torch.full_like(pids, 99)], 1)[:, 0]
    assert not offsets_view.is_contiguous() and not pids_view.is_contiguous()
    out = maxsim_packed(Q, D, offsets_view, pids_view, config=config)
    want = reference.maxsim_packed(Q, D, offsets, pids)
    nan_cols = pids == 4
    assert torch.isnan(out[:, nan_cols]).all() and not torch.isnan(out[:, ~nan_cols]).any()
    assert_close(out[:, ~nan_cols], want[:, ~nan_cols], "maxsim_dense", torch.float16)
