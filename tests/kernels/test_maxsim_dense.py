"""Dense TileMaxSim kernels against the float64 reference (CPU interpreter or GPU)."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import property_examples
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import dense
from tilemaxsim_plaid.ops.dense import MaxSimConfig, maxsim_packed, maxsim_padded

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
    # Chunks smaller than a tile, a document longer than a chunk, boundaries inside tiles.
    pytest.param(MaxSimConfig(block_t=16, stream=True, chunk_tokens=8), id="stream-16-chunk8"),
    pytest.param(MaxSimConfig(block_t=32, queries_per_block=2, stream=True, chunk_tokens=40),
                 id="stream-32-2q-chunk40"),
    # One query tile held across tiles and documents: several documents per program, several
    # query blocks (programs) per document.
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, hold_query=True), id="hold-query-3docs"),
    pytest.param(MaxSimConfig(block_t=32, queries_per_block=2, docs_per_program=2, hold_query=True),
                 id="hold-query-2q-2docs"),
    # The large packed sets' default: one warp, the query held across 16 documents (here more
    # slots than documents, so most of the program's slots are empty).
    pytest.param(MaxSimConfig(block_t=16, num_warps=1, num_stages=3, docs_per_program=16,
                              hold_query=True), id="one-warp-hold-16docs"),
]


# The single-tile and hold-query paths take d <= 128 only (test_d_limited_configs_reject_wide_d).
CONFIG_DIMS = [pytest.param(c.values[0], d, id=f"{c.id}-d{d}") for c in CONFIGS for d in (128, 384)
               if not ((c.values[0].single_tile or c.values[0].hold_query) and d > 128)]


@pytest.mark.parametrize("config,d", CONFIG_DIMS)
def test_every_config_path_is_exact(config, d, device):
    """Each kernel path a config can select computes the same function, with and without pids."""
    lengths = [3, 0, 50, 1, 17, 64, 2]
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(5, 31, d, dtype=torch.float16, device=device)
    out = maxsim_packed(Q, D, offsets, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)
    pids = torch.tensor([6, 2, 1, 2], device=device)
    if config.stream:  # every document, in corpus order, or nothing
        with pytest.raises(ValueError, match="config.stream"):
            maxsim_packed(Q, D, offsets, pids, config=config)
        return
    out = maxsim_packed(Q, D, offsets, pids, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense", torch.float16)


@pytest.mark.parametrize("config", [
    pytest.param(MaxSimConfig(block_t=48), id="block_t-not-pow2"),
    pytest.param(MaxSimConfig(queries_per_block=3), id="queries-not-pow2"),
    pytest.param(MaxSimConfig(docs_per_program=0), id="no-docs"),
    pytest.param(MaxSimConfig(block_t=4, docs_per_program=2, slots=True), id="slot-tile-too-small"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, slots=True), id="slots-not-pow2"),
    pytest.param(MaxSimConfig(stream=True, chunk_tokens=0), id="stream-empty-chunks"),
    pytest.param(MaxSimConfig(stream=True, slots=True, docs_per_program=2), id="stream-and-slots"),
    pytest.param(MaxSimConfig(stream=True, q_blocks_per_program=2), id="stream-2qblocks"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=2, slots=True, q_blocks_per_program=2),
                 id="slots-2qblocks"),
    pytest.param(MaxSimConfig(hold_query=True, q_blocks_per_program=2), id="hold-query-2qblocks"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=2, slots=True, hold_query=True),
                 id="hold-query-and-slots"),
    pytest.param(MaxSimConfig(hold_query=True, stream=True), id="hold-query-and-stream"),
])
def test_bad_config_is_rejected_before_launch(config, device):
    D, offsets = _packed_from_lengths([5, 7], 64, torch.float16, device)
    Q = _rand(1, 8, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="config"):
        maxsim_packed(Q, D, offsets, config=config)


def test_d_limited_configs_reject_wide_d(device):
    D, offsets = _packed_from_lengths([5, 7], 384, torch.float16, device)
    Q = _rand(1, 8, 384, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="hold_query"):
        maxsim_packed(Q, D, offsets, config=MaxSimConfig(hold_query=True))


def test_default_config_by_number_of_documents():
    from tilemaxsim_plaid.ops.dense import MANY_DOCS, default_config

    many = default_config(1, 32, 180, 128, variable_lengths=True, num_docs=MANY_DOCS)
    assert (many.num_warps, many.block_t, many.docs_per_program, many.hold_query) == (1, 16, 16, True)
    few = default_config(1, 32, 180, 128, variable_lengths=True, num_docs=MANY_DOCS - 1)
    assert (few.num_warps, few.hold_query) == (2, False)
    # The held query is one d chunk: wider embeddings keep the per-document default, and so do
    # fp32 inputs (twice the registers for the held tile; not timed).
    assert not default_config(1, 32, 180, 384, variable_lengths=True, num_docs=MANY_DOCS).hold_query
    assert not default_config(1, 32, 180, 128, variable_lengths=True, num_docs=MANY_DOCS,
                              element_size=4).hold_query


def test_hold_query_padded(device):
    """The padded layout takes the held query too (documents of several tiles, doc lengths)."""
    Q = _rand(3, 9, 96, dtype=torch.float16, device=device)
    D = _rand(7, 40, 96, dtype=torch.float16, device=device)
    lengths = torch.tensor([40, 0, 1, 17, 33, 16, 39], device=device)
    out = maxsim_padded(Q, D, lengths, config=MaxSimConfig(block_t=16, docs_per_program=2, hold_query=True))
    assert_close(out, reference.maxsim_padded(Q, D, lengths), "maxsim_dense", torch.float16)


def test_single_tile_config_rejects_long_documents(device):
    D, offsets = _packed_from_lengths([100], 128, torch.float16, device)
    Q = _rand(1, 8, 128, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="single_tile"):
        maxsim_packed(Q, D, offsets, config=MaxSimConfig(block_t=64, single_tile=True))


def test_empty_inputs(device):
    Q = _rand(2, 4, 64, dtype=torch.float16, device=device)
    assert maxsim_padded(Q, _rand(0, 5, 64, dtype=torch.float16, device=device)).shape == (2, 0)
    D = _rand(3, 5, 64, dtype=torch.float16, device=device)
    assert maxsim_padded(Q[:0], D).shape == (0, 3)
    # A query with no tokens scores 0 (the empty sum), never NaN.
    assert torch.equal(maxsim_padded(Q[:, :0], D), torch.zeros(2, 3, device=device))
    empty_offsets = torch.zeros(1, dtype=torch.int64, device=device)
    assert maxsim_packed(Q, D[0], empty_offsets).shape == (2, 0)
    pids = torch.empty(0, dtype=torch.int64, device=device)
    offsets = torch.tensor([0, 5], device=device)
    assert maxsim_packed(Q, D[0], offsets, pids).shape == (2, 0)


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


@settings(max_examples=property_examples(30), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    B=st.integers(1, 3),
    Lq=st.integers(0, 40),
    lengths=st.lists(st.integers(0, 80), min_size=0, max_size=12),
    d=st.sampled_from([16, 96, 128, 200]),
    block_t=st.sampled_from([16, 32, 64]),
    chunk_tokens=st.integers(1, 150),
)
def test_stream_property(B, Lq, lengths, d, block_t, chunk_tokens, device):
    """The stream path over any lengths (empty documents first, last, in runs; documents longer
    than a chunk; boundaries anywhere in a tile) and any chunking: exact and never NaN."""
    D, offsets = _packed_from_lengths(lengths, d, torch.float16, device)
    Q = _rand(B, Lq, d, dtype=torch.float16, device=device)
    config = MaxSimConfig(block_t=block_t, stream=True, chunk_tokens=chunk_tokens)
    out = maxsim_packed(Q, D, offsets, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)


def test_stream_plan_gives_each_document_to_one_program(device):
    """Programs own consecutive documents by first row; trailing empty ones go to the last."""
    offsets = torch.tensor([0, 0, 5, 30, 30, 31, 64, 64, 64], device=device)
    plan = dense._stream_plan(offsets, num_rows=64 + 3, chunk_tokens=16)
    # 5 programs for 67 rows; first rows 0,0,5 | 30,30,31 | none | none | 64,64 (rows 64-66).
    assert plan.tolist() == [0, 3, 6, 6, 6, 8]
    # Trailing empty documents past the last chunk still go to the last program.
    assert dense._stream_plan(offsets, num_rows=64, chunk_tokens=16).tolist() == [0, 3, 6, 6, 8]
    empty = dense._stream_plan(torch.zeros(1, dtype=torch.int64, device=device), 0, 16)
    assert empty.tolist() == [0, 0]


@settings(max_examples=property_examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    B=st.integers(1, 5),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=7),
    block_t=st.sampled_from([4, 16, 32, 64]),
    queries_per_block=st.sampled_from([1, 2, 4]),
    q_blocks_per_program=st.integers(1, 3),
    docs_per_program=st.integers(1, 4),
    kind=st.sampled_from(["plain", "single_tile", "slots", "stream", "hold_query"]),
    chunk_tokens=st.integers(1, 64),
    with_pids=st.booleans(),
)
def test_any_config_is_exact_or_refused(B, lengths, block_t, queries_per_block, q_blocks_per_program,
                                        docs_per_program, kind, chunk_tokens, with_pids, device):
    """Over the whole MaxSimConfig space: a launch either matches the float64 reference in every
    element or is refused with a ValueError naming the config, never a silent partial result."""
    D, offsets = _packed_from_lengths(lengths, 64, torch.float16, device)
    Q = _rand(B, 13, 64, dtype=torch.float16, device=device)
    pids = torch.randint(0, len(lengths), (len(lengths) + 1,), device=device) if with_pids else None
    config = MaxSimConfig(block_t=block_t, queries_per_block=queries_per_block,
                          q_blocks_per_program=q_blocks_per_program, docs_per_program=docs_per_program,
                          single_tile=kind == "single_tile", slots=kind == "slots",
                          stream=kind == "stream", chunk_tokens=chunk_tokens,
                          hold_query=kind == "hold_query")
    try:
        out = maxsim_packed(Q, D, offsets, pids, config=config)
    except ValueError as error:
        assert "config" in str(error)
        return
    assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense", torch.float16)
