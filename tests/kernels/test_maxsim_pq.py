"""Fused PQ-code MaxSim (decode and lookup-table scorings) against the float64 reference of the
decoded vectors. Host-side rules (input checks, refusals, config choice) are tests/ops/test_pq.py;
the CUDA kernels are tests/kernels/test_maxsim_pq_mma.py and test_maxsim_pq_lut_shared.py.

On the CPU the kernels run under the interpreter on small indexes; on a GPU the documents are
longer (LONG), so that every program walks several full tiles and chunks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kernels.test_maxsim_residual import DOC_LENGTHS, poisoned_outputs  # noqa: F401
from tests.conftest import ON_GPU, property_examples, rows_in_order
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.pq import MANY_DOCS, PQConfig, default_pq_config, maxsim_pq

# PQ codes of embeddings, or of PLAID residuals over centroids (inverse norms included).
residual_modes = pytest.mark.parametrize("residual_mode", [pytest.param(False, id="embeddings"),
                                                           pytest.param(True, id="residuals")])
# Documents of 0 and 1 token, exactly one and two 32-token tiles, one past, tails; on a GPU also
# longer ones (several full tiles each).
TILE_LENGTHS = [0, 1, 31, 32, 33, 64, 65, 17, 70] + ([96, 128, 130, 300] if ON_GPU else [])


def random_pq_index(device, dim, num_subquantizers, lengths=DOC_LENGTHS, num_centroids=0):
    """Random codebooks scaled like sub-vectors of unit embeddings, random codes."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    T = int(offsets[-1])
    sub_dim = dim // num_subquantizers
    index = dict(
        pq_codes=torch.randint(0, 256, (T, num_subquantizers), dtype=torch.uint8),
        offsets=offsets,
        codebooks=torch.randn(num_subquantizers, 256, sub_dim) / dim**0.5,
    )
    if num_centroids:
        index["centroid_codes"] = torch.randint(0, num_centroids, (T,), dtype=torch.int32)
        index["centroids"] = F.normalize(torch.randn(num_centroids, dim), dim=-1).half()
        index["inv_norms"] = 1.0 / (1.0 + torch.rand(T))
    return {k: v.to(device) for k, v in index.items()}


def split(index):
    extra = {k: index[k] for k in ("centroid_codes", "centroids", "inv_norms") if k in index}
    return (index["pq_codes"], index["offsets"], index["codebooks"]), extra


def unit_queries(B, Lq, dim, dtype, device):
    return F.normalize(torch.randn(B, Lq, dim), dim=-1).to(dtype).to(device)


def shuffled_pids(num_docs, device):
    """Every document once in a random order, and two repeats."""
    order = torch.randperm(num_docs)
    return torch.cat([order, order[:2]]).to(device)


@pytest.mark.parametrize("dim,num_subquantizers", [
    pytest.param(128, 16, id="d128-M16"),
    pytest.param(128, 32, id="d128-M32"),
    pytest.param(128, 64, id="d128-M64"),
    pytest.param(96, 16, id="d96-M16-dsub6"),
    pytest.param(384, 16, id="d384-M16-dsub24"),
    pytest.param(384, 48, id="d384-M48"),
])
@residual_modes
def test_random_codes_fp16(device, poisoned_outputs, dim, num_subquantizers, residual_mode):
    """4-warp programs (the query read per product): word gathers of every width where they
    apply, byte gathers where they do not (d/M = 6 or 24), one to four chunks of sub-quantizers."""
    index = random_pq_index(device, dim, num_subquantizers, num_centroids=29 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(2, 31, dim, torch.float16, device)
    query_lengths = torch.tensor([31, 4], device=device)
    out = maxsim_pq(Q, *args, query_lengths=query_lengths, **extra,
                    config=PQConfig(block_t=32, block_t_tail=16))
    assert out.shape == (2, len(DOC_LENGTHS))
    assert_close(out, reference.maxsim_pq(Q, *args, query_lengths=query_lengths, **extra),
                 "maxsim_pq", torch.float16)
    assert torch.isneginf(out[:, 0]).all()


@pytest.mark.parametrize("dim,num_subquantizers", [
    pytest.param(64, 1, id="d64-M1"),
    pytest.param(64, 2, id="d64-M2"),
    pytest.param(96, 2, id="d96-M2-dsub48"),
    pytest.param(384, 6, id="d384-M6-dsub64"),
    pytest.param(768, 16, id="d768-M16-dsub48"),
])
@residual_modes
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.float32, id="fp32")])
def test_chunks_narrower_than_a_code_word(device, poisoned_outputs, dim, num_subquantizers,
                                          residual_mode, dtype):
    """Chunks of fewer sub-quantizers than a 32-bit code word holds (M < 4, or d/M > 32, so
    M_BLOCK < 4): byte gathers, by 4-warp programs and by one-warp ones that hold the query."""
    index = random_pq_index(device, dim, num_subquantizers, [0, 1, 17, 40, 5, 16],
                            num_centroids=7 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(2, 9, dim, dtype, device)
    query_lengths = torch.tensor([9, 3], device=device)
    want = reference.maxsim_pq(Q, *args, query_lengths=query_lengths, **extra)
    for config in (None, PQConfig(block_t=16, num_warps=1, docs_per_program=2)):
        out = maxsim_pq(Q, *args, query_lengths=query_lengths, **extra, config=config)
        assert_close(out, want, "maxsim_pq", dtype)
        assert torch.isneginf(out[:, 0]).all()


@residual_modes
def test_fp32_query_in_32_token_launches(device, poisoned_outputs, residual_mode):
    """The default scores an fp32 query of 40 tokens in launches of 32 and 8 tokens
    (ops/pq.FP32_QUERY_CHUNK): the launches' sums are the whole query's score."""
    index = random_pq_index(device, 384, 48, [0, 1, 17, 40, 5, 16],
                            num_centroids=7 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(2, 40, 384, torch.float32, device)
    query_lengths = torch.tensor([40, 35], device=device)
    want = reference.maxsim_pq(Q, *args, query_lengths=query_lengths, **extra)
    assert_close(maxsim_pq(Q, *args, query_lengths=query_lengths, **extra), want, "maxsim_pq",
                 torch.float32)


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bf16"),
                                   pytest.param(torch.float32, id="fp32")])
def test_other_dtypes(device, poisoned_outputs, dtype):
    index = random_pq_index(device, 128, 16)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, dtype, device)
    assert_close(maxsim_pq(Q, *args), reference.maxsim_pq(Q, *args), "maxsim_pq", dtype)


def test_pids_in_place_2d_query_and_long_query(device, poisoned_outputs):
    index = random_pq_index(device, 64, 8, num_centroids=11)
    args, extra = split(index)
    pids = torch.tensor([5, 5, 0, 3], device=device)
    Q = unit_queries(1, 20, 64, torch.float16, device)[0]
    out = maxsim_pq(Q, *args, pids, **extra)
    assert out.shape == (4,)
    assert_close(out, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq", torch.float16)
    Q_long = unit_queries(2, 150, 64, torch.float16, device)
    lengths = torch.tensor([150, 0], device=device)
    out = maxsim_pq(Q_long, *args, query_lengths=lengths)
    assert_close(out, reference.maxsim_pq(Q_long, *args, query_lengths=lengths),
                 "maxsim_pq", torch.float16)
    assert torch.equal(out[1].cpu(), torch.zeros(len(DOC_LENGTHS)))


def strided(x):
    """x's values as a non-contiguous view: every other row of a tensor twice as long."""
    return torch.stack([x, torch.zeros_like(x)], 1)[:, 0]


@pytest.mark.parametrize("scoring", ["decode", "lut"] + (["mma"] if ON_GPU else []))
@residual_modes
def test_strided_views_of_every_argument_score_as_contiguous(device, poisoned_outputs, scoring,
                                                             residual_mode):
    """Every tensor argument passed as a non-contiguous view (offsets, pids, query_lengths,
    centroid_codes, inv_norms, centroids, codebooks, Q with doubled row strides; pq_codes with
    doubled row stride, and with strided columns) gives the scores of the contiguous tensors."""
    if scoring == "mma" and residual_mode:
        pytest.skip("the mma kernel scores PQ codes of embeddings only")
    lengths = [0, 7, 0, 13, 1, 19, 33]
    index = random_pq_index(device, 128, 16, lengths, num_centroids=9 if residual_mode else 0)
    (codes, offsets, codebooks), extra = split(index)
    Q = unit_queries(2, 12, 128, torch.float16, device)
    pids = torch.tensor([5, 0, 3, 3, 6, 1], device=device)
    query_lengths = torch.tensor([12, 5], device=device)
    config = None if scoring == "decode" else PQConfig(scoring=scoring, block_t=16)
    want = maxsim_pq(Q, codes, offsets, codebooks, pids, query_lengths=query_lengths, **extra,
                     config=config)
    assert_close(want, reference.maxsim_pq(Q, codes, offsets, codebooks, pids,
                                           query_lengths=query_lengths, **extra),
                 "maxsim_pq", torch.float32 if scoring == "lut" else torch.float16)
    column_strided = torch.stack([codes, torch.zeros_like(codes)], 2)[:, :, 0]
    for strided_codes in (strided(codes), column_strided):
        views = dict(pq_codes=strided_codes, offsets=strided(offsets),
                     codebooks=strided(codebooks), pids=strided(pids),
                     query_lengths=strided(query_lengths),
                     **{name: strided(value) for name, value in extra.items()})
        assert not any(view.is_contiguous() for view in views.values())
        assert torch.equal(views["pq_codes"], codes) and torch.equal(views["offsets"], offsets)
        got = maxsim_pq(strided(Q), **views, config=config)
        assert torch.equal(got, want)


@settings(max_examples=property_examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.sampled_from([(128, 16), (96, 16), (64, 32), (128, 64)]),
    residual_mode=st.booleans(),
    B=st.integers(1, 3),
    block_t=st.sampled_from([8, 16, 32, 64]),
    block_t_tail=st.sampled_from([8, 16, 32]),
    queries_per_block=st.sampled_from([1, 2]),
    docs_per_program=st.integers(1, 5),
    with_pids=st.booleans(),
    persistent=st.booleans(),
    scoring=st.sampled_from(["decode", "lut"]),
    num_warps=st.sampled_from([1, 2]),
    pipeline_codes=st.booleans(),
    reduce_per_tile=st.booleans(),
)
def test_any_config_is_exact_or_refused(device, poisoned_outputs, shape, residual_mode, B, block_t,
                                        block_t_tail, queries_per_block, docs_per_program, with_pids,
                                        persistent, scoring, num_warps, pipeline_codes,
                                        reduce_per_tile):
    """Over the PQConfig space: a launch matches the float64 reference of the decoded vectors in
    every element or is refused with a ValueError naming the config."""
    dim, num_subquantizers = shape
    index = random_pq_index(device, dim, num_subquantizers, num_centroids=23 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(B, 11, dim, torch.float16, device)
    pids = torch.tensor([5, 0, 3, 3, 1], device=device) if with_pids else None
    config = PQConfig(block_t=block_t, block_t_tail=block_t_tail, queries_per_block=queries_per_block,
                      docs_per_program=docs_per_program, persistent=persistent, scoring=scoring,
                      num_warps=num_warps, pipeline_codes=pipeline_codes,
                      reduce_per_tile=reduce_per_tile)
    try:
        out = maxsim_pq(Q, *args, pids=pids, **extra, config=config)
    except ValueError as error:
        assert "config" in str(error)
        return
    assert_close(out, reference.maxsim_pq(Q, *args, pids=pids, **extra), "maxsim_pq", torch.float16)


# Where word gathers apply (16-bit queries, even power-of-two d/M, whole chunks of a multiple of
# 4 sub-quantizers), with the codebook word each takes in one-warp programs (the query held) and
# in 2-warp ones: d/M = 8 16 or 8 bytes (d = 64: one 64-column chunk; d = 384: three chunks, so
# query chunks past the two loaded once), d/M = 4 paired or plain 8 bytes, d/M = 2 4 bytes.
# d/M = 6 takes byte gathers.
DECODE_SHAPES = [pytest.param(128, 16, id="d128-M16-g16"), pytest.param(128, 32, id="d128-M32-g8"),
                 pytest.param(128, 64, id="d128-M64-g4"), pytest.param(64, 8, id="d64-M8-g16"),
                 pytest.param(384, 48, id="d384-M48-3chunks"),
                 pytest.param(96, 16, id="d96-M16-bytes")]


@pytest.mark.parametrize("dim,num_subquantizers", DECODE_SHAPES)
@pytest.mark.parametrize("dtype,residual_mode", [
    pytest.param(torch.float16, True, id="fp16-residuals"),
    pytest.param(torch.bfloat16, False, id="bf16-embeddings")])
def test_held_and_read_query_every_gather_width(device, poisoned_outputs, dim, num_subquantizers,
                                                dtype, residual_mode):
    """The query held in the first operand's registers (one warp: a product with the identity
    and two column relabellings; with 16-byte or paired 8-byte words, columns in the operand's
    register order) and the query read per product (two warps) both score as the reference:
    odd query lengths, two queries per block, full tiles, tails and empty documents. fp16 and
    bf16 differ only in the weights' bit split; the centroid table and inverse norms ride along
    with fp16."""
    lengths = [0, 1, 16, 17, 40, 83, 5, 32]
    index = random_pq_index(device, dim, num_subquantizers, lengths,
                            num_centroids=13 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(2, 13, dim, dtype, device)
    query_lengths = torch.tensor([13, 6], device=device)
    want = reference.maxsim_pq(Q, *args, query_lengths=query_lengths, **extra)
    for num_warps, queries_per_block in ((1, 1), (1, 2), (2, 1)):
        config = PQConfig(block_t=32, block_t_tail=16, num_warps=num_warps, docs_per_program=3,
                          queries_per_block=queries_per_block)
        out = maxsim_pq(Q, *args, query_lengths=query_lengths, **extra, config=config)
        assert_close(out, want, "maxsim_pq", dtype)
        assert torch.isneginf(out[:, 0]).all()


def test_codebook_off_16_byte_alignment(device, poisoned_outputs):
    """A codebook 8 bytes past a 16-byte boundary is gathered in 8-byte words (16-byte ones
    need the alignment) and scores as the reference."""
    index = random_pq_index(device, 128, 16)
    codes, offsets, codebooks = split(index)[0]
    buffer = torch.empty(codebooks.numel() + 4, dtype=torch.float16, device=device)
    shifted = buffer[4:].view_as(codebooks).copy_(codebooks)
    assert shifted.data_ptr() % 16 == 8
    Q = unit_queries(1, 8, 128, torch.float16, device)
    config = PQConfig(block_t=32, num_warps=1, num_stages=1, persistent=True)
    assert_close(maxsim_pq(Q, codes, offsets, shifted, config=config),
                 reference.maxsim_pq(Q, codes, offsets, codebooks), "maxsim_pq", torch.float16)


@pytest.mark.parametrize("num_subquantizers,num_warps,block_t_tail", [
    pytest.param(16, 1, 16, id="M16-g16-tail16"), pytest.param(16, 1, 32, id="M16-g16-tail32"),
    pytest.param(16, 2, 32, id="M16-g8-2warps-tail32"), pytest.param(32, 1, 32, id="M32-g8-paired"),
    pytest.param(64, 1, 16, id="M64-g4")])
@residual_modes
def test_code_words_loaded_a_tile_ahead_are_exact(device, poisoned_outputs, num_subquantizers,
                                                  num_warps, block_t_tail, residual_mode):
    """Each full tile's code words loaded while the tile before it is scored (and the tail's,
    with tails of full tile width) score as the reference: documents of 0, 1, exactly one and
    two tiles, one past, a last document ending at the array's end, pids with repeats on a
    persistent grid, every codebook word width."""
    index = random_pq_index(device, 128, num_subquantizers, TILE_LENGTHS,
                            num_centroids=11 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    pids = shuffled_pids(len(TILE_LENGTHS), device)
    config = PQConfig(block_t=32, block_t_tail=block_t_tail, num_warps=num_warps, num_stages=1,
                      docs_per_program=2, persistent=True, pipeline_codes=True)
    out = maxsim_pq(Q, *args, pids, **extra, config=config)
    assert_close(out, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq", torch.float16)
    assert torch.isneginf(out[:, pids == 0]).all()  # document 0 is empty


@pytest.mark.parametrize("num_subquantizers", [16, 32])
@residual_modes
def test_tiles_reduced_as_they_come_are_exact(device, poisoned_outputs, num_subquantizers,
                                              residual_mode):
    """Each full tile reduced over its tokens as it comes (reduce_per_tile) scores as the
    elementwise running max reduced once per document: documents of 0 to 4 full tiles and
    tails, the default's register cap included."""
    index = random_pq_index(device, 128, num_subquantizers, TILE_LENGTHS + [128],
                            num_centroids=7 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 27, 128, torch.float16, device)
    want = reference.maxsim_pq(Q, *args, **extra)
    base = default_pq_config(1, 27, MANY_DOCS)
    per_tile = maxsim_pq(Q, *args, **extra,
                         config=dataclasses.replace(base, reduce_per_tile=True, maxnreg=144))
    running = maxsim_pq(Q, *args, **extra,
                        config=dataclasses.replace(base, reduce_per_tile=False, maxnreg=None))
    assert_close(per_tile, want, "maxsim_pq", torch.float16)
    assert_close(per_tile, running, "maxsim_pq", torch.float16)
    assert torch.isneginf(per_tile[:, 0]).all()


@pytest.mark.parametrize("docs_per_program", [1, 5])
def test_persistent_programs_are_exact(device, poisoned_outputs, docs_per_program):
    """A persistent grid (programs taking chunks from an atomic counter) scores every document
    once: pids with repeats, more chunks than programs, a last chunk part empty."""
    lengths = [3, 0, 70, 16, 33, 1, 48, 64, 9, 120, 17]
    index = random_pq_index(device, 128, 16, lengths, num_centroids=19)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    pids = torch.tensor([4, 2, 10, 0, 2, 7, 9, 1, 3], device=device)
    config = PQConfig(block_t=32, block_t_tail=16, num_warps=1, docs_per_program=docs_per_program,
                      persistent=True)
    out = maxsim_pq(Q, *args, pids, **extra, config=config)
    assert_close(out, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq", torch.float16)


@residual_modes
@pytest.mark.parametrize("num_subquantizers", [16, 32, 64])
def test_many_documents_default_is_exact(device, poisoned_outputs, residual_mode, num_subquantizers):
    """The large-set default for the codebook's shape (persistent one-warp programs, one
    128-column chunk, word gathers; at M = 16 and 32 tiles reduced as they come under a
    register cap, at M = 16 code words a tile ahead; at M = 64 none of these) on a small index:
    full tiles, tails, empty documents, repeated pids."""
    index = random_pq_index(device, 128, num_subquantizers, TILE_LENGTHS,
                            num_centroids=17 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    pids = shuffled_pids(len(TILE_LENGTHS), device)
    config = default_pq_config(1, 32, MANY_DOCS, num_subquantizers=num_subquantizers,
                               sub_dim=128 // num_subquantizers)
    out = maxsim_pq(Q, *args, pids, **extra, config=config)
    assert_close(out, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq", torch.float16)


@pytest.mark.parametrize("dim,num_subquantizers", [
    pytest.param(128, 16, id="d128-M16"),
    pytest.param(96, 16, id="d96-M16-dsub6"),
    pytest.param(384, 48, id="d384-M48"),
    pytest.param(60, 5, id="d60-M5-odd"),
])
@residual_modes
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.bfloat16, id="bf16"),
                                   pytest.param(torch.float32, id="fp32")])
def test_lookup_tables_match_the_reference(device, poisoned_outputs, dim, num_subquantizers,
                                           residual_mode, dtype):
    """scoring="lut": per-query tables in row tiles (a tile straddling a query's end, an empty
    query, repeated pids, empty documents) against the float64 reference of the decoded
    vectors. The tables are fp32 from the unrounded codebooks, so every dtype meets the fp32
    decode path's tolerance."""
    lengths = [0, 1, 17, 40, 83, 5, 16]
    index = random_pq_index(device, dim, num_subquantizers, lengths,
                            num_centroids=13 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(3, 11, dim, dtype, device)
    query_lengths = torch.tensor([11, 0, 6], device=device)
    pids = torch.tensor([6, 0, 3, 3, 1], device=device)
    want = reference.maxsim_pq(Q, *args, pids, query_lengths=query_lengths, **extra)
    # On a GPU: the tables in shared memory (CUDA, where a tile fits) and through L1 (Triton).
    for shared in ((None, False) if ON_GPU else (None,)):
        for rows in (4, 8):
            config = PQConfig(scoring="lut", lut_rows=rows, block_t=16, docs_per_program=2,
                              lut_shared=shared)
            out = maxsim_pq(Q, *args, pids, query_lengths=query_lengths, **extra, config=config)
            assert_close(out, want, "maxsim_pq", torch.float32)
    assert torch.equal(out[1].cpu(), torch.zeros(len(pids)))
    assert torch.isneginf(out[0, 1]) and torch.isneginf(out[2, 1])


@pytest.mark.parametrize("block_t", [1, 2, 8])
def test_lookup_tables_in_tiles_under_16_tokens(device, poisoned_outputs, block_t):
    """The lookup-table kernel has no tensor-core product: tiles of any power of two."""
    index = random_pq_index(device, 64, 8, [0, 1, 3, 9, 17])
    args, _ = split(index)
    Q = unit_queries(2, 5, 64, torch.float16, device)
    out = maxsim_pq(Q, *args, config=PQConfig(scoring="lut", block_t=block_t, lut_shared=False))
    assert_close(out, reference.maxsim_pq(Q, *args), "maxsim_pq", torch.float32)


def test_lookup_tables_for_a_long_query(device, poisoned_outputs):
    """A query longer than one launch's rows is scored in chunks, each with its own tables."""
    index = random_pq_index(device, 64, 8)
    args, _ = split(index)
    Q = unit_queries(1, 150, 64, torch.float16, device)
    out = maxsim_pq(Q, *args, config=PQConfig(scoring="lut", lut_rows=32))
    assert_close(out, reference.maxsim_pq(Q, *args), "maxsim_pq", torch.float32)


# Every scoring that reads packed offsets: the decode kernel (few- and many-document defaults),
# the lookup tables through L1; on a GPU the tables in shared memory and the mma kernel too.
END_BEFORE_START = [pytest.param(dict(scoring="decode"), id="decode-default"),
                    pytest.param(dict(scoring="many"), id="many-documents-default"),
                    pytest.param(dict(scoring="lut", lut_shared=False), id="lut")]
if ON_GPU:
    END_BEFORE_START += [pytest.param(dict(scoring="lut", lut_shared=True), id="lut-shared"),
                         pytest.param(dict(scoring="mma"), id="mma")]


@pytest.mark.parametrize("how", END_BEFORE_START)
def test_an_end_before_its_start_is_an_empty_document(device, poisoned_outputs, how):
    """Offsets out of order but inside the rows (what a check judged after the launch gives
    the kernel before the call raises): a document whose end is before its start scores -inf,
    every other as the reference of its own rows."""
    index = random_pq_index(device, 128, 16, [5, 9, 40, 33, 2, 17])
    offsets = index["offsets"].clone()
    offsets[2] = offsets[4] + 1  # document 1 runs into document 3's rows; document 2 is empty
    take, ordered = rows_in_order(offsets)
    codes, codebooks = index["pq_codes"], index["codebooks"]
    Q = unit_queries(1, 32, 128, torch.float16, device)
    if how["scoring"] == "decode":
        config = None
    elif how["scoring"] == "many":
        config = default_pq_config(1, 32, MANY_DOCS, num_subquantizers=16, sub_dim=8)
    else:
        config = PQConfig(**how)
    pids = torch.tensor([3, 1, 2, 0, 4], device=device)
    for args in ({}, {"pids": pids}):
        got = maxsim_pq(Q, codes, offsets, codebooks, **args, config=config, validate=False)
        want = reference.maxsim_pq(Q, codes[take], ordered, codebooks, **args)
        assert_close(got, want, "maxsim_pq",
                     torch.float32 if how["scoring"] == "lut" else torch.float16)
        assert (got[:, 2] == float("-inf")).all()  # document 2 (pids[2] is document 2 too)
