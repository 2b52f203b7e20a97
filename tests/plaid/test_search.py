"""The patched PLAID search on a real tiny colbert-ai index, against stock colbert-ai (CPU)
and against exact MaxSim over PLAID's decompressed embeddings.

What "equal to stock" means on the CPU: stock colbert-ai's CPU MaxSim (segmented_maxsim.cpp)
starts every per-token maximum at 0, so a query token whose best match is negative adds 0
instead of its (negative) maximum. The plugin computes exact MaxSim. So the tests assert that
both score the same candidate set (stages 2-3 have the same semantics), that the plugin's
scores are the exact ones, that stock's scores are the exact ones with negative maxima floored
at 0, and that the plugin's order is the exact order.
"""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

from tests.plaid.conftest import patch_state, stock_colbert  # noqa: E402
from tests.tolerances import TOLERANCES  # noqa: E402
from tilemaxsim_plaid import reference  # noqa: E402
from tilemaxsim_plaid.plaid import backends  # noqa: E402
from tilemaxsim_plaid.plaid.device_index import device_index  # noqa: E402

pytestmark = pytest.mark.colbert

# (k, ncells, centroid_score_threshold, ndocs) as Searcher.dense_search fills them in.
KNOBS = {10: (1, 0.5, 256), 100: (2, 0.45, 1024)}
ALL_GROUPS = ("compat", "scoring")


def _configure(searcher, k):
    ncells, threshold, ndocs = KNOBS[k]
    searcher.configure(ncells=ncells, centroid_score_threshold=threshold, ndocs=ndocs)
    return searcher.config


def _token_maxima(searcher, Q, pids):
    """[M, Lq] float64 per-token maxima over PLAID's decompressed embeddings, decompressed by
    colbert-ai's own codec (so the reference shares no code with the plugin)."""
    with patch_state(("compat",)):
        D_packed, lengths = searcher.ranker.embeddings_strided.lookup_pids(torch.tensor(pids))
    offsets = torch.zeros(len(pids) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    sim = D_packed.double() @ Q.double().T
    return torch.stack([sim[offsets[i]:offsets[i + 1]].max(0).values for i in range(len(pids))])


def _spread_pids(searcher, count):
    """[count] int64 pids spread evenly over the documents sorted by length, the shortest and
    the longest included: every tile shape the residual kernel takes on this index (a full
    tile, a tail, both), in a fraction of the interpreter's time for all 300 (one program per
    document)."""
    by_length = torch.argsort(searcher.ranker.doclens, stable=True)
    return by_length[torch.linspace(0, by_length.numel() - 1, count).round().long()]


def _assert_exact(scores, maxima):
    rtol, atol = TOLERANCES[("plaid_exact", torch.float32)]
    torch.testing.assert_close(torch.tensor(scores, dtype=torch.float64), maxima.sum(1), rtol=rtol, atol=atol)


def _assert_sorted_by(pids, exact, tie=1e-4):
    values = exact.tolist()
    assert all(a >= b - tie for a, b in zip(values, values[1:])), "not in exact descending order"


@pytest.mark.parametrize("k", [10, 100])
def test_rankings_equal_stock_colbert_on_cpu(tiny_searcher, tiny_query_embeddings, k):
    config = _configure(tiny_searcher, k)
    ranker = tiny_searcher.ranker
    queries = tiny_query_embeddings[:12]
    with stock_colbert():
        stock = [ranker.rank(config, Q[None]) for Q in queries]
    with patch_state(ALL_GROUPS):
        ours = [ranker.rank(config, Q[None]) for Q in queries]
    for Q, (stock_pids, stock_scores), (our_pids, our_scores) in zip(queries, stock, ours):
        assert set(our_pids) == set(stock_pids)
        assert len(our_pids) == len(set(our_pids)) <= config.ndocs // 4
        maxima = _token_maxima(tiny_searcher, Q, our_pids)
        _assert_exact(our_scores, maxima)
        _assert_sorted_by(our_pids, maxima.sum(1))
        stock_maxima = _token_maxima(tiny_searcher, Q, stock_pids)
        _assert_exact(stock_scores, stock_maxima.clamp(min=0))
        if (stock_maxima >= 0).all():
            # No floor was applied: stock's order is the exact order too (up to ties).
            exact = dict(zip(our_pids, maxima.sum(1).tolist()))
            assert all(abs(exact[a] - exact[b]) < 1e-4 for a, b in zip(our_pids, stock_pids) if a != b)


def test_filter_fn_keeps_stock_semantics(tiny_searcher, tiny_query_embeddings):
    config = _configure(tiny_searcher, 10)
    Q = tiny_query_embeddings[1][None]

    def even_only(pids):
        return pids[pids % 2 == 0]

    with stock_colbert():
        stock_pids, _ = tiny_searcher.ranker.rank(config, Q, filter_fn=even_only)
    with patch_state(ALL_GROUPS):
        our_pids, _ = tiny_searcher.ranker.rank(config, Q, filter_fn=even_only)
        nothing = tiny_searcher.ranker.rank(config, Q, filter_fn=lambda p: p[:0])
    assert our_pids and all(p % 2 == 0 for p in our_pids)
    assert set(our_pids) == set(stock_pids)
    assert nothing == ([], [])


@pytest.mark.parametrize("products", backends.PRODUCTS)
def test_triton_path_equals_torch_path(tiny_searcher, tiny_query_embeddings, monkeypatch, products):
    # The GPU path's logic (fixed-size candidates, fused kernels), run under TRITON_INTERPRET,
    # with either way of multiplying the fp32 query in stage 4. One query takes every stage.
    config = _configure(tiny_searcher, 10)
    queries = tiny_query_embeddings[:1]
    with patch_state(ALL_GROUPS):
        monkeypatch.setenv(backends.BACKEND_ENV_VAR, "torch")
        expected = [tiny_searcher.ranker.rank(config, Q[None]) for Q in queries]
        monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, products)
        monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
        actual = [tiny_searcher.ranker.rank(config, Q[None]) for Q in queries]
        assert device_index(tiny_searcher.ranker).inv_norms is not None
    for (pids_a, scores_a), (pids_e, scores_e) in zip(actual, expected):
        assert set(pids_a) == set(pids_e)
        torch.testing.assert_close(torch.tensor(sorted(scores_a)), torch.tensor(sorted(scores_e)),
                                   rtol=1e-4, atol=1e-4)


def test_search_end_to_end_and_search_all(tiny_searcher, tiny_plaid_index):
    queries = tiny_plaid_index.queries[:6]
    with patch_state(ALL_GROUPS):
        tiny_searcher.configure(ncells=None, centroid_score_threshold=None, ndocs=None)
        one_by_one = [tiny_searcher.search(q, k=10) for q in queries]
        ranking = tiny_searcher.search_all({i: q for i, q in enumerate(queries)}, k=10)
    for qid, (pids, ranks, scores) in enumerate(one_by_one):
        assert len(pids) == 10 and ranks == list(range(1, 11))
        batched = ranking.data[qid]
        assert [p for p, _, _ in batched] == pids
        torch.testing.assert_close(torch.tensor([s for _, _, s in batched]), torch.tensor(scores))
    # The descriptions are written for their own article: most should find it.
    assert sum(i in pids for i, (pids, _, _) in enumerate(one_by_one)) >= 4


def test_rerank_path_scores_every_given_pid(tiny_searcher, tiny_query_embeddings):
    config = _configure(tiny_searcher, 10)
    Q = tiny_query_embeddings[3]
    given = torch.randperm(300)[:41].tolist() + [7, 7]  # duplicates are scored twice, as upstream
    with stock_colbert():
        stock_pids, stock_scores = tiny_searcher.ranker.rank(config, Q[None], pids=given)
    with patch_state(ALL_GROUPS):
        our_pids, our_scores = tiny_searcher.ranker.rank(config, Q[None], pids=given)
        via_search = tiny_searcher.search("a film", k=43, pids=given)
    assert sorted(our_pids) == sorted(given) == sorted(stock_pids)
    maxima = _token_maxima(tiny_searcher, Q, our_pids)
    _assert_exact(our_scores, maxima)
    _assert_sorted_by(our_pids, maxima.sum(1))
    _assert_exact(stock_scores, _token_maxima(tiny_searcher, Q, stock_pids).clamp(min=0))
    assert sorted(via_search[0]) == sorted(given)


def test_rerank_table_from_fp16_centroids(tiny_searcher, tiny_query_embeddings, monkeypatch):
    """colbert-ai saves centroids in fp16, so the device index gets an exact fp16 copy, from
    which an fp16x2 rerank builds its table with the query's halves in one launch: the same
    scores as the path with the fp32 table. Centroids that are not fp16 values get no copy."""
    config = _configure(tiny_searcher, 10)
    Q = tiny_query_embeddings[5][None]
    given = torch.randperm(300)[:37].tolist()
    codec = tiny_searcher.ranker.codec
    with patch_state(ALL_GROUPS):
        monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
        monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, "fp16x2")
        index = device_index(tiny_searcher.ranker)
        assert index.centroids_half is not None
        assert torch.equal(index.centroids_half.float(), index.centroids)
        from tilemaxsim_plaid.ops import residual

        builds = []
        split_build = residual.split_query_centroid_scores
        monkeypatch.setattr(residual, "split_query_centroid_scores",
                            lambda *args: builds.append(1) or split_build(*args))
        fused_pids, fused_scores = tiny_searcher.ranker.rank(config, Q, pids=given)
        assert builds == [1]
        without_half = type(index)(**{**vars(index), "centroids_half": None})
        fp32_table = backends.exact_scores(without_half, Q[0].float(), torch.tensor(fused_pids))
        monkeypatch.setattr(codec, "centroids", codec.centroids * (1 + 2**-20))
        assert device_index(tiny_searcher.ranker).centroids_half is None
    assert sorted(fused_pids) == sorted(given)
    torch.testing.assert_close(torch.tensor(fused_scores), fp32_table, rtol=1e-5, atol=1e-5)


def test_rerank_is_chunked_without_changing_scores(tiny_searcher, tiny_query_embeddings, monkeypatch):
    config = _configure(tiny_searcher, 10)
    Q = tiny_query_embeddings[4][None]
    given = list(range(300))
    with patch_state(ALL_GROUPS):
        whole = tiny_searcher.ranker.rank(config, Q, pids=given)
        # Chunks of one or two documents: ~150 launches instead of one.
        monkeypatch.setattr(backends, "TOKENS_PER_CHUNK", 200)
        chunked = tiny_searcher.ranker.rank(config, Q, pids=given)
    assert chunked[0] == whole[0]
    torch.testing.assert_close(torch.tensor(chunked[1]), torch.tensor(whole[1]))


# Largest |score - exact| each way of multiplying the fp32 query may give on this index. Measured
# here: tf32x3 1.3e-6; fp16x2 6.4e-4 and fp16 6.8e-4, both dominated by rounding the residual
# weights to fp16 (the query's own rounding adds little), which grows with the bucket weights of
# the index: this tiny index's coarse codec has large ones. Its CPU codec keeps fp32 weights, so
# "auto" is tf32x3 here.
PRODUCTS_ERROR = {"auto": 1e-5, "tf32x3": 1e-5, "fp16x2": 2e-3, "fp16": 2e-3}


@pytest.mark.parametrize("products", backends.PRODUCTS)
def test_each_products_mode_stays_within_its_error(tiny_searcher, tiny_query_embeddings,
                                                   monkeypatch, products):
    """Stage 4 on the Triton path (interpreter) over passages of every length, against float64
    MaxSim of colbert-ai's own decompression: each mode within the error its documentation
    states."""
    Q = tiny_query_embeddings[5]
    everything = _spread_pids(tiny_searcher, 64)
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, products)
    with patch_state(ALL_GROUPS):
        index = device_index(tiny_searcher.ranker)
        scores = backends.exact_scores(index, Q.float(), everything)
    exact = _token_maxima(tiny_searcher, Q, everything.tolist()).sum(1)
    error = (scores.double() - exact).abs().max().item()
    assert error <= PRODUCTS_ERROR[products], f"{products}: max error {error:.2e}"


class _MatmulFlags:
    """Stand-in for ``torch.backends.cuda.matmul``: the legacy flag, or the newer API's
    precision, which torch refuses to read through the legacy flag once it was set."""

    def __init__(self, allow_tf32=None, fp32_precision="none"):
        self._allow_tf32, self.fp32_precision = allow_tf32, fp32_precision

    @property
    def allow_tf32(self):
        if self._allow_tf32 is None:
            raise RuntimeError("mix of the legacy and new APIs")
        return self._allow_tf32


def test_centroid_scores_never_use_tf32(tiny_searcher, tiny_query_embeddings, monkeypatch):
    """The centroid-score table (candidate generation's, which stage 4 reuses as the exact
    centroid part of every score, and a rerank's own) comes from the tf32x3 kernel on a GPU whose
    process lets cuBLAS multiply fp32 as TF32 (through either API), and from a plain fp32 matmul
    otherwise; both within 1e-6 of float64."""
    from tilemaxsim_plaid.ops.residual import query_centroid_scores
    from tilemaxsim_plaid.plaid import scoring

    config = _configure(tiny_searcher, 10)
    Q = tiny_query_embeddings[3].float()
    rows = Q[: config.query_maxlen]
    with patch_state(ALL_GROUPS):
        index = device_index(tiny_searcher.ranker)
    # Only the choice depends on the device: a stand-in index that says "cuda" makes it here.
    gpu_index = types.SimpleNamespace(device=torch.device("cuda"), centroids=index.centroids)
    tables = {}
    for name, flags, exact_fp32 in [("legacy off", _MatmulFlags(allow_tf32=False), True),
                                    ("legacy on", _MatmulFlags(allow_tf32=True), False),
                                    ("new api tf32", _MatmulFlags(fp32_precision="tf32"), False),
                                    ("new api ieee", _MatmulFlags(fp32_precision="ieee"), True)]:
        monkeypatch.setattr(torch.backends.cuda, "matmul", flags)
        assert backends.cublas_fp32_is_exact() == exact_fp32, name
        tables[name] = scoring._centroid_scores(gpu_index, config, Q)
        expected = (index.centroids @ rows.T if exact_fp32
                    else query_centroid_scores(rows[None], index.centroids))
        assert torch.equal(tables[name], expected), name
    exact = index.centroids.double() @ rows.double().T
    for name, table in tables.items():
        assert table.shape == exact.shape and table.dtype == torch.float32, name
        torch.testing.assert_close(table.double(), exact, rtol=0, atol=1e-6)


def test_auto_products_take_fp16x2_only_where_the_weights_are_fp16_values(
        tiny_searcher, tiny_query_embeddings, monkeypatch):
    """With the bucket weights rounded to fp16, as colbert-ai's GPU codec holds them, "auto" is
    fp16x2 and exact to tf32x3's bound against float64 MaxSim of colbert-ai's decompression with
    those same weights; with the CPU codec's fp32 weights it stays tf32x3."""
    Q = tiny_query_embeddings[7]
    everything = _spread_pids(tiny_searcher, 64)
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
    monkeypatch.delenv(backends.PRODUCTS_ENV_VAR, raising=False)
    codec = tiny_searcher.ranker.codec
    with patch_state(ALL_GROUPS):
        index = device_index(tiny_searcher.ranker)
        assert not index.bucket_weights_in_fp16 and backends.products_for(index, Q.shape[0]) == "tf32x3"
        monkeypatch.setattr(codec, "bucket_weights", codec.bucket_weights.half().float())
        index = device_index(tiny_searcher.ranker)  # rebuilt: the weights tensor changed
        assert index.bucket_weights_in_fp16 and backends.products_for(index, Q.shape[0]) == "fp16x2"
        scores = backends.exact_scores(index, Q.float(), everything)
        monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, "tf32x3")
        assert backends.products_for(index, Q.shape[0]) == "tf32x3"  # an explicit choice wins
    exact = _token_maxima(tiny_searcher, Q, everything.tolist()).sum(1)
    error = (scores.double() - exact).abs().max().item()
    assert error <= PRODUCTS_ERROR["tf32x3"], f"auto (fp16x2) on fp16 weights: max error {error:.2e}"


@pytest.mark.parametrize("products", ["auto", "fp16x2", "fp16"])
def test_fp16_products_fall_back_to_tf32x3_without_the_centroid_table(
        tiny_searcher, tiny_query_embeddings, monkeypatch, caplog, products):
    """A centroid-score table too large for the table path even split by query rows (a query
    of 65-128 tokens at C = 2**19; one of up to WHOLE_TABLE_ROWS takes its table whole) or a
    query longer than one launch: every mode scores as tf32x3,
    exactly, instead of failing (split_query needs the table) or losing the centroid part's
    precision; an explicit fp16 mode says so in the log."""
    from tilemaxsim_plaid.ops import residual

    Q = tiny_query_embeddings[2].float()
    everything = _spread_pids(tiny_searcher, 32)
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
    codec = tiny_searcher.ranker.codec
    monkeypatch.setattr(codec, "bucket_weights", codec.bucket_weights.half().float())
    monkeypatch.setattr(backends, "_warned_no_table", {})
    with patch_state(ALL_GROUPS):
        index = device_index(tiny_searcher.ranker)
        monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, "tf32x3")
        expected = backends.exact_scores(index, Q, everything)
        monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, products)
        assert backends.products_for(index, Q.shape[0]) == ("fp16x2" if products == "auto" else products)
        assert backends.products_for(index, 129) == "tf32x3"  # scored in two launches
        # A table of one row's size or less: this tiny index now looks like a huge one.
        monkeypatch.setattr(residual, "MAX_CENTROID_TABLE_BYTES", 4 * Q.shape[0])
        monkeypatch.setattr(residual, "WHOLE_TABLE_ROWS", 0)
        assert backends.products_for(index, Q.shape[0]) == "tf32x3"
        with caplog.at_level("WARNING", logger=backends.logger.name):
            scores = backends.exact_scores(index, Q, everything)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-5)
    warned = "stage 4 multiplies as tf32x3" in caplog.text
    assert warned == (products != "auto"), caplog.text


@pytest.mark.parametrize(
    "pids, match",
    [
        pytest.param([0, 300], r"pids must lie in \[0, 300\)", id="past-the-end"),
        pytest.param([-1, 4], r"pids must lie in \[0, 300\)", id="negative"),
        pytest.param([[1, 2]], "flat", id="nested"),
    ],
)
def test_bad_pids_raise(tiny_searcher, tiny_query_embeddings, pids, match):
    config = _configure(tiny_searcher, 10)
    with patch_state(ALL_GROUPS), pytest.raises(ValueError, match=match):
        tiny_searcher.ranker.rank(config, tiny_query_embeddings[0][None], pids=pids)


def test_empty_pid_list_returns_nothing(tiny_searcher, tiny_query_embeddings):
    config = _configure(tiny_searcher, 10)
    with patch_state(ALL_GROUPS):
        assert tiny_searcher.ranker.rank(config, tiny_query_embeddings[0][None], pids=[]) == ([], [])


@pytest.mark.parametrize(
    "shape",
    [pytest.param((1, 32, 64), id="wrong-dim"), pytest.param((32,), id="1d"), pytest.param((1, 0, 128), id="no-tokens")],
)
def test_query_of_wrong_shape_raises(tiny_searcher, shape):
    config = _configure(tiny_searcher, 10)
    with patch_state(ALL_GROUPS), pytest.raises(ValueError, match="Q must be"):
        tiny_searcher.ranker.rank(config, torch.randn(*shape))


def test_device_index_is_cached_and_rebuilt_when_the_index_changes(tiny_searcher):
    ranker = tiny_searcher.ranker
    with patch_state(ALL_GROUPS):
        first = device_index(ranker)
        assert device_index(ranker) is first
        original_codes = ranker.embeddings.codes
        try:
            ranker.embeddings.codes = original_codes.clone()
            rebuilt = device_index(ranker)
        finally:
            ranker.embeddings.codes = original_codes
        assert rebuilt is not first
        assert torch.equal(rebuilt.codes, first.codes)


def test_colbert_score_packed_is_exact_where_stock_floors():
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling import colbert as modeling_colbert

    Q = torch.nn.functional.normalize(torch.randn(1, 32, 64), dim=-1)
    D = torch.nn.functional.normalize(torch.randn(40, 64), dim=-1)
    lengths = torch.tensor([1, 2, 30, 7])
    offsets = torch.tensor([0, 1, 3, 33, 40])
    expected = reference.maxsim_packed(Q[0], D, offsets)
    config = ColBERTConfig()
    with stock_colbert():
        stock = modeling_colbert.colbert_score_packed(Q, D, lengths, config)
    with patch_state(ALL_GROUPS):
        ours = modeling_colbert.colbert_score_packed(Q, D, lengths, config)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-5)
    # The one-token document has negative maxima: stock floors them, the exact score does not.
    assert float(stock[0]) > float(ours[0])


def test_unknown_stage_4_products_are_named(monkeypatch):
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, "fp8")
    with pytest.raises(ValueError, match=backends.PRODUCTS_ENV_VAR):
        backends.stage_4_products()


def test_decompress_tokens_is_colbert_decompression(tiny_searcher):
    """The torch path's decompression (one weight lookup per residual byte) gives exactly the
    codec's decompression (tests/codecs: equal to colbert-ai's own), for rows of any shape."""
    from tilemaxsim_plaid.codecs.residual import decompress_residuals

    with patch_state(ALL_GROUPS):
        index = device_index(tiny_searcher.ranker)
    rows = torch.randint(0, index.num_tokens, (3, 7))
    got = backends.decompress_tokens(index, rows)
    flat = rows.reshape(-1)
    expected = decompress_residuals(index.codes[flat], index.residuals[flat], index.centroids,
                                    index.bucket_weights, index.nbits)
    assert got.shape == (3, 7, index.dim) and got.dtype == torch.float32
    assert torch.equal(got.reshape(-1, index.dim), expected)
