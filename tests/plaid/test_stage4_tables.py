"""Stage 4's centroid-score tables at large centroid counts: the fp16 products keep their exact
centroid part from one query's whole table at any C, from tables split by query rows where a
query is wider (ops.residual.centroid_table_tiles), and fall back to tf32x3, logged and counted,
only where even the tiles do not fit."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F

from tests.tolerances import TOLERANCES
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.codecs.residual import bucket_table, residual_inverse_norms
from tilemaxsim_plaid.ops import residual
from tilemaxsim_plaid.plaid import backends, counters
from tilemaxsim_plaid.plaid.device_index import DeviceIndex

DIM, NBITS, NUM_CENTROIDS, QUERY_LEN = 128, 2, 40, 32
# Lengths on purpose: an empty document, one token, one past a 16-token tile, longer ones.
DOC_LENGTHS = [0, 1, 17, 40, 9, 33]
# An fp32 table of a query at C = 2**18 is a MiB a row; the budget (24 MiB) holds 24 rows, which
# splits a query of 65-128 tokens (wider than WHOLE_TABLE_ROWS).
ROWS_AT_MSMARCO_SCALE = residual.MAX_CENTROID_TABLE_BYTES // ((1 << 18) * 4)


def small_index(device: torch.device, nbits: int = NBITS) -> DeviceIndex:
    """A DeviceIndex over random codes with what stage 4 reads (no IVF: a rerank needs none);
    fp16-valued centroids and bucket weights, as colbert-ai's GPU codec holds them."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor(DOC_LENGTHS)
    offsets = torch.zeros(len(DOC_LENGTHS) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    T = int(offsets[-1])
    centroids = F.normalize(torch.randn(NUM_CENTROIDS, DIM, generator=generator), dim=-1).half()
    weights = torch.sort(torch.randn(1 << nbits, generator=generator) * 0.05).values.half().float()
    codes = torch.randint(0, NUM_CENTROIDS, (T,), generator=generator, dtype=torch.int32)
    residuals = torch.randint(0, 256, (T, DIM * nbits // 8), generator=generator,
                              dtype=torch.uint8)
    inv_norms = residual_inverse_norms(codes, residuals, centroids, weights, nbits)
    empty = torch.zeros(0, dtype=torch.int64)
    on = {name: t.to(device) for name, t in dict(
        codes=codes, residuals=residuals, offsets=offsets, doclens=lengths,
        centroids=centroids.float(), bucket_weights=weights,
        bucket_table=bucket_table(nbits).to(torch.uint8), ivf_pids=empty.int(),
        ivf_offsets=torch.zeros(1, dtype=torch.int64), ivf_lengths=empty,
        inv_norms=inv_norms.float(), centroids_half=centroids).items()}
    return DeviceIndex(
        device=device, dim=DIM, nbits=nbits, num_docs=len(DOC_LENGTHS), num_tokens=T,
        max_doclen=max(DOC_LENGTHS), max_ivf_length=0, ivf_lengths_desc_cumsum=empty,
        source_key=("stage4-tables", nbits), bucket_weights_in_fp16=True, **on)


def with_centroid_count(index: DeviceIndex, num_centroids: int) -> DeviceIndex:
    """The same index as if it had ``num_centroids`` centroids (one row broadcast: no memory);
    for the choice of products only, which reads nothing but the shapes."""
    return dataclasses.replace(index, centroids=index.centroids[:1].expand(num_centroids, DIM),
                               centroids_half=None)


@pytest.fixture
def triton_stage_4(monkeypatch):
    """The Triton backend on CPU tensors (TRITON_INTERPRET=1), each log line's memory cleared."""
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
    monkeypatch.setattr(backends, "_warned_no_table", {})
    monkeypatch.setattr(residual, "_logged_no_table", set())
    monkeypatch.setattr(residual, "_logged_tiles", set())


def _table_budget(monkeypatch, rows: int) -> list[tuple[int, bool, bool]]:
    """One launch's fp32 table holds ``rows`` query rows of the small index, as 24 do at
    C = 2**18, and the 32-token query is split as a wider one is there (no whole table);
    returns (query tokens, split_query, table given) of every launch."""
    monkeypatch.setattr(residual, "MAX_CENTROID_TABLE_BYTES", rows * NUM_CENTROIDS * 4)
    monkeypatch.setattr(residual, "WHOLE_TABLE_ROWS", 0)
    launched = []
    real = residual._launch_kernel

    def recording(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids,
                  inv_norms, query_lengths, num_out_docs, config, centroid_scores=None,
                  split_query=False):
        launched.append((Q3.shape[1], split_query, centroid_scores is not None))
        return real(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids,
                    inv_norms, query_lengths, num_out_docs, config, centroid_scores, split_query)

    monkeypatch.setattr(residual, "_launch_kernel", recording)
    return launched


def _fallbacks() -> tuple[int, int]:
    """Calls counted as multiplied as tf32x3 for want of a table, and as gathering centroid rows."""
    counts = counters.stats().fallbacks
    return counts.get(backends._NO_TABLE, 0), counts.get(backends._GATHERED, 0)


def _counted_since(before: tuple[int, int]) -> tuple[int, int]:
    return tuple(now - then for now, then in zip(_fallbacks(), before))


def _reference(index: DeviceIndex, Q: torch.Tensor, pids: torch.Tensor) -> torch.Tensor:
    return reference.maxsim_residual(Q[None].double().cpu(), index.codes.cpu(),
                                     index.residuals.cpu(), index.offsets.cpu(),
                                     index.centroids.double().cpu(),
                                     index.bucket_weights.double().cpu(), index.nbits,
                                     pids.cpu())[0]


def _query(device: torch.device, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(QUERY_LEN, DIM, generator=generator), dim=-1).to(device)


def _assert_close(actual, expected, key):
    rtol, atol = TOLERANCES[key]
    assert not torch.isnan(actual).any()
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=rtol,
                               atol=atol)


@pytest.mark.parametrize("C", [1 << 18, 1 << 19, 1 << 20])
@pytest.mark.parametrize("choice", ["auto", "fp16x2", "fp16"])
def test_fp16_products_kept_at_large_centroid_counts(triton_stage_4, device, monkeypatch,
                                                     caplog, choice, C):
    """A 32-token query at MS MARCO's C = 2**18 and beyond: the fp32 table (32-128 MiB) is over
    the budget, but one query's table is used whole: the fp16 products stay, nothing is
    counted or logged."""
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, choice)
    index = with_centroid_count(small_index(device), C)
    assert not residual.centroid_table_fits(C, QUERY_LEN)
    assert residual.centroid_table_tiles(C, 1, QUERY_LEN) == (1, QUERY_LEN)
    before = _fallbacks()
    with caplog.at_level(logging.INFO):
        assert backends.resolved_products(index, QUERY_LEN) == (
            "fp16x2" if choice == "auto" else choice, False)
        assert backends.products_for(index, QUERY_LEN) == ("fp16x2" if choice == "auto" else choice)
    assert _counted_since(before) == (0, 0)
    assert not caplog.records


@pytest.mark.parametrize("choice", ["auto", "fp16x2", "fp16"])
def test_tf32x3_where_even_the_tiles_do_not_fit(triton_stage_4, device, monkeypatch, caplog,
                                                choice):
    """C = 2**19 and a 96-token query (wider than WHOLE_TABLE_ROWS): a 16-row fp32 tile (32 MiB)
    is over the budget too; an explicit fp16 mode falls back to tf32x3 with one WARNING per
    process and a count per query; "auto" resolves to tf32x3 without either."""
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, choice)
    index = with_centroid_count(small_index(device), 1 << 19)
    assert residual.centroid_table_tiles(1 << 19, 1, 96) is None
    before = _fallbacks()
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            assert backends.products_for(index, 96) == "tf32x3"
    explicit = choice != "auto"
    assert _counted_since(before)[0] == (2 if explicit else 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == int(explicit), warnings
    if explicit:
        assert "stage 4 multiplies as tf32x3" in warnings[0]
        assert f"{1 << 19} centroids" in warnings[0]


@pytest.mark.parametrize("nbits", [pytest.param(n, id=f"nbits{n}") for n in (1, 2, 4)])
@pytest.mark.parametrize("stage_1_table", [pytest.param(False, id="rerank"),
                                           pytest.param(True, id="search")])
def test_fp16x2_in_tiles_is_exact(triton_stage_4, device, monkeypatch, caplog, nbits,
                                  stage_1_table):
    """The budget shrunk so that this small index stands where C = 2**18 stands (24 fp32 rows
    per table) for a query wider than WHOLE_TABLE_ROWS: stage 4 multiplies as fp16x2 in two
    16-token launches, from the fp16 centroids
    (a rerank) or from candidate generation's table (a search), and matches the float64
    reference with an empty document (-inf) and repeated pids; no fallback, no WARNING."""
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, "auto")
    index = small_index(device, nbits)
    Q = _query(device)
    pids = torch.tensor([3, 0, 5, 2, 3, 1, 4], device=device)
    launched = _table_budget(monkeypatch, ROWS_AT_MSMARCO_SCALE)
    table = backends.centroid_table(index, Q) if stage_1_table else None
    before = _fallbacks()
    with caplog.at_level(logging.INFO):
        scores = backends.exact_scores(index, Q, pids, centroid_scores=table)
    assert launched == [(16, True, stage_1_table)] * 2
    assert _counted_since(before) == (0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert torch.isneginf(scores[1]) and bool(scores[0] == scores[4])
    _assert_close(scores, _reference(index, Q, pids), ("maxsim_residual_split", torch.float32))


def test_stage_4_log_line_fires_exactly_on_the_slow_path(triton_stage_4, device, monkeypatch,
                                                         caplog):
    """Tables tiled (24 rows per table): fp16x2, one INFO line of the op, no WARNING. Even a
    16-row tile over the budget (15 rows): fp16x2 asked for, tf32x3 used, centroid rows
    gathered: the plugin's WARNING and the op's, once each however many queries, both slower
    paths counted per query in stats().fallbacks, and the scores still exact."""
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, "fp16x2")
    index = small_index(device)
    Q = _query(device)
    pids = torch.arange(len(DOC_LENGTHS), device=device)
    want = _reference(index, Q, pids)
    launched = _table_budget(monkeypatch, ROWS_AT_MSMARCO_SCALE)
    before = _fallbacks()
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            backends.exact_scores(index, Q, pids)
    assert launched == [(16, True, False)] * 4 and _counted_since(before) == (0, 0)
    assert [(r.levelno, r.name) for r in caplog.records] == [(logging.INFO, residual.__name__)]
    caplog.clear()
    launched = _table_budget(monkeypatch, 15)
    with caplog.at_level(logging.INFO):
        slow = [backends.exact_scores(index, Q, pids) for _ in range(2)]
    assert launched == [(QUERY_LEN, False, False)] * 2
    assert _counted_since(before) == (2, 2)  # tf32x3, and centroid rows gathered
    assert sorted((r.levelno, r.name) for r in caplog.records) == sorted(
        [(logging.WARNING, backends.logger.name), (logging.WARNING, residual.__name__)])
    for scores in slow:
        _assert_close(scores, want, ("maxsim_residual", torch.float32))


@pytest.mark.parametrize("products", ["fp16", "tf32x3"])
@pytest.mark.parametrize("stage_1_table", [pytest.param(False, id="rerank"),
                                           pytest.param(True, id="search")])
def test_other_products_in_tiles_equal_one_table(triton_stage_4, device, monkeypatch, products,
                                                 stage_1_table):
    """The other products in two 16-token launches give one launch's scores (fp16: the query
    rounded once, the centroid part from the fp32 query's table; tf32x3 also against float64)."""
    monkeypatch.setenv(backends.PRODUCTS_ENV_VAR, products)
    index = small_index(device)
    Q = _query(device, 2)
    pids = torch.tensor([5, 0, 3, 3], device=device)
    table = backends.centroid_table(index, Q) if stage_1_table else None
    whole = backends.exact_scores(index, Q, pids, centroid_scores=table)
    launched = _table_budget(monkeypatch, ROWS_AT_MSMARCO_SCALE)
    tiled = backends.exact_scores(index, Q, pids, centroid_scores=table)
    assert launched == [(16, False, True)] * 2  # both modes take the fp32 query's table
    _assert_close(tiled, whole, ("maxsim_residual", torch.float32))
    if products == "tf32x3":
        _assert_close(tiled, _reference(index, Q, pids), ("maxsim_residual", torch.float32))
