"""Fused PQ-code MaxSim against the float64 reference of the decoded vectors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kernels.test_maxsim_residual import DOC_LENGTHS, poisoned_outputs  # noqa: F401
from tests.conftest import ON_GPU, property_examples
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import pq as pq_ops
from tilemaxsim_plaid.ops.pq import (MANY_DOCS, PQConfig, default_pq_config, maxsim_pq,
                                     skewed_codebook)


# PQ codes of embeddings, or of PLAID residuals over centroids (inverse norms included).
residual_modes = pytest.mark.parametrize("residual_mode", [pytest.param(False, id="embeddings"),
                                                           pytest.param(True, id="residuals")])


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


def test_bad_inputs_name_the_argument(device):
    index = random_pq_index(device, 128, 16, num_centroids=5)
    args, extra = split(index)
    Q = unit_queries(1, 8, 128, torch.float16, device)
    with pytest.raises(ValueError, match="codebooks"):
        maxsim_pq(Q, args[0], args[1], args[2][:, :128])
    with pytest.raises(ValueError, match="pq_codes"):
        maxsim_pq(Q, args[0][:, :8], args[1], args[2])
    with pytest.raises(ValueError, match="centroid_codes and centroids"):
        maxsim_pq(Q, *args, centroid_codes=extra["centroid_codes"])
    with pytest.raises(TypeError, match="pq_codes"):
        maxsim_pq(Q, args[0].to(torch.int32), args[1], args[2])


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
    word_gather=st.sampled_from([None, False, True]),
    persistent=st.booleans(),
    block_d=st.sampled_from([None, 32, 64]),
    gather_bytes=st.sampled_from([None, 4, 8, 16]),
    scoring=st.sampled_from(["decode", "lut"]),
    num_warps=st.sampled_from([1, 2]),
    hold_query=st.sampled_from([None, False, True]),
    pipeline_codes=st.sampled_from([None, False, True]),
    reduce_per_tile=st.booleans(),
    shared_codebook=st.booleans(),
)
def test_any_config_is_exact_or_refused(device, poisoned_outputs, shape, residual_mode, B, block_t,
                                        block_t_tail, queries_per_block, docs_per_program, with_pids,
                                        word_gather, persistent, block_d, gather_bytes, scoring,
                                        num_warps, hold_query, pipeline_codes, reduce_per_tile,
                                        shared_codebook):
    """Over the PQConfig space: a launch matches the float64 reference of the decoded vectors in
    every element or is refused with a ValueError naming the config."""
    dim, num_subquantizers = shape
    index = random_pq_index(device, dim, num_subquantizers, num_centroids=23 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(B, 11, dim, torch.float16, device)
    pids = torch.tensor([5, 0, 3, 3, 1], device=device) if with_pids else None
    config = PQConfig(block_t=block_t, block_t_tail=block_t_tail, queries_per_block=queries_per_block,
                      docs_per_program=docs_per_program, word_gather=word_gather,
                      persistent=persistent, block_d=block_d, gather_bytes=gather_bytes,
                      scoring=scoring, num_warps=num_warps, hold_query=hold_query,
                      pipeline_codes=pipeline_codes, reduce_per_tile=reduce_per_tile,
                      shared_codebook=shared_codebook)
    try:
        out = maxsim_pq(Q, *args, pids=pids, **extra, config=config)
    except ValueError as error:
        assert "config" in str(error)
        return
    assert_close(out, reference.maxsim_pq(Q, *args, pids=pids, **extra), "maxsim_pq", torch.float16)


# Shapes where word gathers apply (16-bit queries, even power-of-two d/M, whole chunks of a
# multiple of 4 sub-quantizers): M = 8 at d = 64 is one chunk of 8, M = 48 at d = 384 three of 16.
WORD_SHAPES = [pytest.param(128, 16, id="d128-M16"), pytest.param(128, 32, id="d128-M32"),
               pytest.param(64, 8, id="d64-M8"), pytest.param(384, 48, id="d384-M48")]


@pytest.mark.parametrize("dim,num_subquantizers", WORD_SHAPES)
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.bfloat16, id="bf16")])
@residual_modes
def test_word_gathers_equal_byte_gathers_and_reference(device, poisoned_outputs, dim,
                                                       num_subquantizers, dtype, residual_mode):
    """Codes and codebook read as 32-bit words decode to the same tile as byte and sub-vector
    gathers: the scores equal the other path's and the float64 reference's, full tiles, tails
    and empty documents alike."""
    lengths = [0, 1, 16, 17, 40, 83, 5, 32]
    index = random_pq_index(device, dim, num_subquantizers, lengths,
                            num_centroids=13 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 29, dim, dtype, device)
    shape = dict(block_t=16, block_t_tail=16, num_warps=1, docs_per_program=3)
    words = maxsim_pq(Q, *args, **extra, config=PQConfig(**shape, word_gather=True))
    gathers = maxsim_pq(Q, *args, **extra, config=PQConfig(**shape, word_gather=False))
    assert_close(words, reference.maxsim_pq(Q, *args, **extra), "maxsim_pq", dtype)
    assert_close(words, gathers, "maxsim_pq", dtype)
    assert torch.isneginf(words[:, 0]).all()
    for gather_bytes in (8, 16):
        if (dim // num_subquantizers) % (gather_bytes // 2) == 0:
            # Eight- and sixteen-byte codebook words (4 or 8 weights each) decode to the same
            # tile; with 16 its columns and the query's come in the operand's register order.
            wide = maxsim_pq(Q, *args, **extra, config=PQConfig(**shape, gather_bytes=gather_bytes))
            assert_close(wide, words, "maxsim_pq", dtype)
            assert_close(wide, reference.maxsim_pq(Q, *args, **extra), "maxsim_pq", dtype)


@pytest.mark.parametrize("dim,num_subquantizers", WORD_SHAPES + [
    pytest.param(96, 16, id="d96-M16-dsub6"), pytest.param(128, 64, id="d128-M64")])
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.bfloat16, id="bf16")])
@residual_modes
def test_held_query_equals_the_query_read_per_tile(device, poisoned_outputs, dim, num_subquantizers,
                                                   dtype, residual_mode):
    """A query held in the first operand's registers (a product with the identity and two
    column relabellings) scores exactly as the query given to every product as it is: odd query
    lengths, two queries per block, chunks past the two held ones (d = 384), byte and word
    gathers, full tiles, tails and empty documents."""
    lengths = [0, 1, 16, 17, 40, 83, 5, 32]
    index = random_pq_index(device, dim, num_subquantizers, lengths,
                            num_centroids=13 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(2, 13, dim, dtype, device)
    query_lengths = torch.tensor([13, 6], device=device)
    want = reference.maxsim_pq(Q, *args, query_lengths=query_lengths, **extra)
    for queries_per_block, block_d in ((1, None), (2, 64)):
        shape = dict(block_t=32, block_t_tail=16, num_warps=1, docs_per_program=3,
                     queries_per_block=queries_per_block, block_d=block_d)
        held = maxsim_pq(Q, *args, query_lengths=query_lengths, **extra,
                         config=PQConfig(**shape, hold_query=True))
        per_tile = maxsim_pq(Q, *args, query_lengths=query_lengths, **extra,
                             config=PQConfig(**shape, hold_query=False))
        assert_close(held, want, "maxsim_pq", dtype)
        assert_close(held, per_tile, "maxsim_pq", dtype)
        assert torch.isneginf(held[:, 0]).all()


@pytest.mark.parametrize("num_subquantizers,gather_bytes", [(16, 16), (16, 8), (32, 8), (64, 4)])
@pytest.mark.parametrize("block_t_tail", [16, 32])
@residual_modes
def test_code_words_loaded_a_tile_ahead_are_exact(device, poisoned_outputs, num_subquantizers,
                                                  gather_bytes, block_t_tail, residual_mode):
    """Each full tile's code words loaded while the tile before it is scored (and the tail's,
    with tails of full tile width) give the scores of loading them per tile: documents of 0, 1,
    exactly one and two tiles, one past, a last document ending at the array's end, pids with
    repeats on a persistent grid."""
    lengths = [0, 1, 31, 32, 33, 64, 65, 96, 17, 70]
    index = random_pq_index(device, 128, num_subquantizers, lengths,
                            num_centroids=11 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    pids = torch.tensor([9, 3, 3, 0, 5, 6, 1, 8, 2, 4, 7], device=device)
    want = reference.maxsim_pq(Q, *args, pids, **extra)
    shape = dict(block_t=32, block_t_tail=block_t_tail, num_warps=1, num_stages=1,
                 docs_per_program=2, persistent=True, gather_bytes=gather_bytes)
    ahead = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape, pipeline_codes=True))
    per_tile = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape, pipeline_codes=False))
    assert_close(ahead, want, "maxsim_pq", torch.float16)
    assert_close(ahead, per_tile, "maxsim_pq", torch.float16)
    assert torch.isneginf(ahead[:, 3]).all()  # pid 0 is the empty document


@pytest.mark.parametrize("num_subquantizers", [16, 32])
@residual_modes
def test_tiles_reduced_as_they_come_are_exact(device, poisoned_outputs, num_subquantizers,
                                              residual_mode):
    """Each full tile reduced over its tokens as it comes (reduce_per_tile) scores as the
    elementwise running max reduced once per document: documents of 0 to 4 full tiles and
    tails, the default's register cap included."""
    lengths = [0, 1, 31, 32, 33, 64, 65, 96, 128, 17, 70]
    index = random_pq_index(device, 128, num_subquantizers, lengths,
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


@pytest.mark.parametrize("num_subquantizers,gather_bytes,num_warps,block_t", [
    (16, 16, 1, 32), (16, 8, 1, 32), (32, 8, 4, 64), (64, 4, 1, 32), (16, 8, 8, 128)])
@residual_modes
def test_codebook_in_shared_memory_is_exact(device, poisoned_outputs, num_subquantizers,
                                            gather_bytes, num_warps, block_t, residual_mode):
    """Gathers from a codebook staged in shared memory (shared_codebook; on a GPU, inline PTX
    past Triton's own buffers, with as many programs as fit) score as gathers through L1 and as
    the reference: every word width, one to eight warps, pids with repeats, more chunks than
    programs, an empty document."""
    lengths = [0, 1, 31, 32, 33, 64, 65, 96, 128, 17, 70, 130]
    index = random_pq_index(device, 128, num_subquantizers, lengths,
                            num_centroids=13 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    pids = torch.tensor([9, 3, 3, 0, 5, 6, 1, 8, 2, 4, 7, 11, 10], device=device)
    shape = dict(block_t=block_t, block_t_tail=16, num_warps=num_warps, num_stages=1,
                 docs_per_program=1, persistent=True, gather_bytes=gather_bytes)
    staged = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape, shared_codebook=True))
    through_l1 = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape))
    assert_close(staged, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq", torch.float16)
    assert_close(staged, through_l1, "maxsim_pq", torch.float16)
    assert torch.isneginf(staged[:, 3]).all()  # pid 0 is the empty document


@pytest.mark.parametrize("num_subquantizers,gather_bytes,block_t,num_warps,decode_ahead", [
    (16, 16, 32, 1, False), (16, 16, 16, 1, True), (32, 8, 16, 1, False), (32, 8, 32, 1, True),
    (16, 8, 16, 2, False), (64, 4, 16, 1, True)])
@pytest.mark.parametrize("docs_per_program", [1, 3])
@residual_modes
def test_tile_stream_is_exact(device, poisoned_outputs, num_subquantizers, gather_bytes, block_t,
                              num_warps, decode_ahead, docs_per_program, residual_mode):
    """A persistent program's documents walked as one stream of tiles (stream_tiles, with and
    without the codebook words gathered a tile ahead) score as the reference and as document by
    document: empty documents first, in a row and last, documents of exactly one and two tiles,
    one token past, pids with repeats, chunks that end past the last document."""
    lengths = [0, 0, 1, 15, 16, 17, 31, 32, 33, 64, 65, 70, 0, 3, 96]
    index = random_pq_index(device, 128, num_subquantizers, lengths,
                            num_centroids=11 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 29, 128, torch.float16, device)
    pids = torch.tensor([0, 9, 3, 3, 14, 1, 5, 6, 12, 8, 2, 4, 7, 10, 11, 13, 0],
                        device=device)
    shape = dict(block_t=block_t, block_t_tail=16, num_warps=num_warps, num_stages=1,
                 docs_per_program=docs_per_program, persistent=True, gather_bytes=gather_bytes)
    stream = maxsim_pq(Q, *args, pids, **extra,
                       config=PQConfig(**shape, stream_tiles=True, decode_ahead=decode_ahead))
    per_document = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape))
    assert_close(stream, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq",
                 torch.float16)
    assert_close(stream, per_document, "maxsim_pq", torch.float16)
    assert torch.isneginf(stream[:, [0, 16]]).all()  # pid 0 is an empty document


def test_tile_stream_with_skewed_codebook_and_every_document(device, poisoned_outputs):
    """The tile stream without pids (every document in order), 16-token tiles with the
    codebook words gathered ahead from the two skewed codebook copies."""
    lengths = [5, 0, 40, 16, 0, 0, 100, 7, 32, 1]
    index = random_pq_index(device, 128, 16, lengths)
    args, _ = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    config = PQConfig(block_t=16, num_warps=1, num_stages=1, docs_per_program=2,
                      persistent=True, gather_bytes=16, skewed_codebook=True, stream_tiles=True,
                      decode_ahead=True)
    out = maxsim_pq(Q, *args, config=config)
    assert_close(out, reference.maxsim_pq(Q, *args), "maxsim_pq", torch.float16)
    assert torch.isneginf(out[:, [1, 4, 5]]).all()
    assert torch.isfinite(out[:, [0, 2, 3, 6, 7, 8, 9]]).all()


@pytest.mark.parametrize("num_subquantizers,gather_bytes,num_warps,skewed", [
    (16, 16, 4, False), (16, 16, 2, True), (32, 8, 4, False), (64, 4, 2, False)])
@pytest.mark.parametrize("docs_per_program,block_t", [(1, 16), (3, 32)])
def test_independent_warps_are_exact(device, poisoned_outputs, num_subquantizers, gather_bytes,
                                     num_warps, skewed, docs_per_program, block_t):
    """Warps that share one codebook and each score their own documents (independent_warps;
    on a GPU the codebook staged in shared memory) score as the reference and as the one-warp
    kernel: empty documents first, in a row and last, documents of exactly one and two tiles,
    one token past, pids with repeats, a 29-token query, chunks that end past the last
    document and warps with no documents."""
    lengths = [0, 0, 1, 15, 16, 17, 31, 32, 33, 64, 65, 70, 0, 3, 96]
    index = random_pq_index(device, 128, num_subquantizers, lengths)
    args, _ = split(index)
    Q = unit_queries(1, 29, 128, torch.float16, device)
    pids = torch.tensor([0, 9, 3, 3, 14, 1, 5, 6, 12, 8, 2, 4, 7, 10, 11, 13, 0],
                        device=device)
    config = PQConfig(block_t=block_t, num_warps=num_warps, num_stages=1,
                      docs_per_program=docs_per_program, persistent=True,
                      gather_bytes=gather_bytes, independent_warps=True,
                      shared_codebook=device.type == "cuda", skewed_codebook=skewed)
    out = maxsim_pq(Q, *args, pids, config=config)
    one_warp = maxsim_pq(Q, *args, pids, config=PQConfig(block_t=32, num_warps=1, num_stages=1,
                                                          persistent=True))
    assert_close(out, reference.maxsim_pq(Q, *args, pids), "maxsim_pq", torch.float16)
    assert_close(out, one_warp, "maxsim_pq", torch.float16)
    assert torch.isneginf(out[:, [0, 16]]).all()  # pid 0 is an empty document


def test_independent_warps_every_document_and_query_lengths(device, poisoned_outputs):
    """Without pids (every document in order) and with a query length below the query's rows."""
    lengths = [5, 0, 40, 16, 0, 0, 100, 7, 32, 1, 50]
    index = random_pq_index(device, 128, 16, lengths)
    args, _ = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    q_len = torch.tensor([20], device=device)
    config = PQConfig(block_t=16, num_warps=4, num_stages=1, docs_per_program=2,
                      persistent=True, independent_warps=True,
                      shared_codebook=device.type == "cuda")
    out = maxsim_pq(Q, *args, query_lengths=q_len, config=config)
    assert_close(out, reference.maxsim_pq(Q, *args, query_lengths=q_len), "maxsim_pq",
                 torch.float16)
    assert torch.isneginf(out[:, [1, 4, 5]]).all()


@pytest.mark.parametrize("dim,num_subquantizers,block_d", [
    pytest.param(128, 16, None, id="d128-M16"),
    pytest.param(128, 16, 64, id="d128-M16-two-chunks"),
    pytest.param(256, 32, None, id="d256-M32-two-chunks"),
])
@residual_modes
def test_skewed_codebook_is_exact(device, poisoned_outputs, dim, num_subquantizers, block_d,
                                  residual_mode):
    """Gathers from the two skewed codebook copies (skewed_codebook) score exactly as from the
    codebook as it is, and as the reference: both token parities, sub-quantizers past the
    first chunk, pids with repeats, an empty document."""
    lengths = [0, 1, 31, 32, 33, 64, 65, 96, 17, 70, 130]
    index = random_pq_index(device, dim, num_subquantizers, lengths,
                            num_centroids=11 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 32, dim, torch.float16, device)
    pids = torch.tensor([9, 3, 3, 0, 5, 6, 1, 8, 2, 4, 7, 10], device=device)
    shape = dict(block_t=32, block_t_tail=16, num_warps=1, num_stages=1, docs_per_program=2,
                 persistent=True, gather_bytes=16, block_d=block_d)
    skewed = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape, skewed_codebook=True))
    plain = maxsim_pq(Q, *args, pids, **extra, config=PQConfig(**shape, skewed_codebook=False))
    assert_close(skewed, reference.maxsim_pq(Q, *args, pids, **extra), "maxsim_pq", torch.float16)
    assert torch.equal(skewed, plain)  # the same weights, multiplied in the same order
    assert torch.isneginf(skewed[:, 3]).all()  # pid 0 is the empty document


@pytest.mark.parametrize("num_subquantizers,m_block", [(16, 16), (32, 16), (32, 32)])
def test_skewed_codebook_layout(num_subquantizers, m_block):
    """Each entry sits once in each copy, and the 8 gathers of a quarter-warp (sub-quantizers
    G t + g of one chunk, t = 0 .. 3, for a token of either parity) fall in 8 different 16-byte
    bank groups whatever their codes."""
    books = torch.randn(num_subquantizers, 256, 8)
    books[:, :, 0] = torch.arange(num_subquantizers * 256).reshape(-1, 256)  # each row's id
    table = skewed_codebook(books, m_block)
    assert table.shape == (2 * num_subquantizers * 256, 8)
    ids = table[:, 0].long()
    assert (torch.bincount(ids, minlength=num_subquantizers * 256) == 2).all()
    assert torch.equal(table, books.reshape(-1, 8)[ids])
    slot_of = {}  # row id -> [slot in copy 0, slot in copy 1]
    for slot, row in enumerate(ids.tolist()):
        slot_of.setdefault(row, []).append(slot)
    groups = m_block // 4
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        chunk = int(torch.randint(0, num_subquantizers // m_block, (1,), generator=g))
        first = int(torch.randint(0, groups, (1,), generator=g))
        codes = torch.randint(0, 256, (2, 4), generator=g)
        banks = {slot_of[(chunk * m_block + groups * t + first) * 256 + int(codes[p, t])][p] % 8
                 for p in range(2) for t in range(4)}
        assert len(banks) == 8


@pytest.mark.parametrize("docs_per_program", [1, 2, 5])
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


def test_configs_that_cannot_apply_are_refused(device):
    index = random_pq_index(device, 96, 16)
    args, _ = split(index)
    Q = unit_queries(2, 8, 96, torch.float16, device)
    with pytest.raises(ValueError, match="config.word_gather"):
        maxsim_pq(Q, *args, config=PQConfig(word_gather=True))  # d/M = 6
    index = random_pq_index(device, 128, 16)
    args, _ = split(index)
    with pytest.raises(ValueError, match="config.word_gather"):
        maxsim_pq(unit_queries(1, 8, 128, torch.float32, device), *args,
                  config=PQConfig(word_gather=True))
    with pytest.raises(ValueError, match="config.gather_bytes"):
        maxsim_pq(unit_queries(1, 8, 128, torch.float16, device), *args,
                  config=PQConfig(gather_bytes=2))
    with pytest.raises(ValueError, match="config.gather_bytes"):
        maxsim_pq(unit_queries(1, 8, 128, torch.float16, device), *args,
                  config=PQConfig(word_gather=False, gather_bytes=8))
    index32 = random_pq_index(device, 128, 32)  # d/M = 4: half a 16-byte word per sub-vector
    args32, _ = split(index32)
    with pytest.raises(ValueError, match="config.gather_bytes=16"):
        maxsim_pq(unit_queries(1, 8, 128, torch.float16, device), *args32,
                  config=PQConfig(gather_bytes=16))
    # A codebook 8 bytes past a 16-byte boundary: 8-byte words apply, 16-byte ones are refused.
    codes, offsets, codebooks = args[:3]
    buffer = torch.empty(codebooks.numel() + 4, dtype=torch.float16, device=device)
    shifted = buffer[4:].view_as(codebooks).copy_(codebooks)
    assert shifted.data_ptr() % 16 == 8
    Q1 = unit_queries(1, 8, 128, torch.float16, device)
    assert_close(maxsim_pq(Q1, codes, offsets, shifted, config=PQConfig(gather_bytes=8)),
                 reference.maxsim_pq(Q1, codes, offsets, codebooks), "maxsim_pq", torch.float16)
    with pytest.raises(ValueError, match="config.gather_bytes=16"):
        maxsim_pq(Q1, codes, offsets, shifted, config=PQConfig(gather_bytes=16))
    for Q_bad, config in ((unit_queries(1, 8, 128, torch.float32, device), PQConfig(num_warps=1)),
                          (Q1, PQConfig(num_warps=2))):
        with pytest.raises(ValueError, match="config.hold_query=True"):
            maxsim_pq(Q_bad, codes, offsets, codebooks,
                      config=dataclasses.replace(config, hold_query=True))
    index48 = random_pq_index(device, 384, 48)  # three chunks of 16 sub-quantizers
    with pytest.raises(ValueError, match="config.pipeline_codes=True"):
        maxsim_pq(unit_queries(1, 8, 384, torch.float16, device), *split(index48)[0],
                  config=PQConfig(pipeline_codes=True))
    with pytest.raises(ValueError, match="config.pipeline_codes=True"):
        maxsim_pq(Q1, codes, offsets, codebooks,
                  config=PQConfig(word_gather=False, pipeline_codes=True))
    with pytest.raises(ValueError, match="config.persistent"):
        maxsim_pq(unit_queries(2, 32, 128, torch.float16, device), *args,
                  config=PQConfig(queries_per_block=1, persistent=True))
    for config in (PQConfig(shared_codebook=True),  # not persistent
                   PQConfig(persistent=True, word_gather=False, shared_codebook=True),
                   PQConfig(persistent=True, ptx_loads=False, shared_codebook=True)):
        with pytest.raises(ValueError, match="config.shared_codebook=True"):
            maxsim_pq(Q1, codes, offsets, codebooks, config=config)
    one_warp = dict(block_t=32, num_warps=1, num_stages=1, persistent=True)
    for config in (PQConfig(**one_warp, gather_bytes=8, skewed_codebook=True),
                   PQConfig(**one_warp, hold_query=False, skewed_codebook=True),
                   PQConfig(**one_warp, gather_bytes=16, shared_codebook=True,
                            skewed_codebook=True)):
        with pytest.raises(ValueError, match="config.skewed_codebook=True"):
            maxsim_pq(Q1, *args, config=config)
    with pytest.raises(ValueError, match="config.skewed_codebook=True"):
        maxsim_pq(unit_queries(1, 8, 128, torch.float16, device), *args32,
                  config=PQConfig(**one_warp, skewed_codebook=True))  # d/M = 4
    with pytest.raises(ValueError, match="config.decode_ahead=True needs config.stream_tiles"):
        maxsim_pq(Q1, *args, config=PQConfig(**one_warp, decode_ahead=True))
    for Q_x, args_x, config in (
            (Q1, args, PQConfig(block_t=32, num_warps=1, stream_tiles=True)),  # not persistent
            (Q1, args, PQConfig(**one_warp, word_gather=False, stream_tiles=True)),
            (unit_queries(1, 8, 384, torch.float16, device), split(index48)[0],
             PQConfig(**one_warp, stream_tiles=True))):  # three chunks of sub-quantizers
        with pytest.raises(ValueError, match="config.stream_tiles=True"):
            maxsim_pq(Q_x, *args_x, config=config)
    warps = dict(block_t=16, num_warps=4, num_stages=1, persistent=True, independent_warps=True)
    residual_index = random_pq_index(device, 128, 16, num_centroids=5)
    residual_args, residual_extra = split(residual_index)
    for Q_x, args_x, extra_x, config in (
            (Q1, args, {}, PQConfig(**{**warps, "persistent": False})),
            (Q1, args, {}, PQConfig(**warps, word_gather=False)),
            (unit_queries(2, 8, 128, torch.float16, device), args, {}, PQConfig(**warps)),
            (Q1, residual_args, residual_extra, PQConfig(**warps)),  # PLAID residual codes
            (unit_queries(1, 8, 384, torch.float16, device), split(index48)[0], {},
             PQConfig(**warps))):
        with pytest.raises(ValueError, match="config.independent_warps=True"):
            maxsim_pq(Q_x, *args_x, **extra_x, config=config)


def test_independent_warps_refuse_rows_past_int32(device, monkeypatch):
    """The independent-warps kernel keeps token rows and document indices in int32: an index
    with more rows than that is refused, not scored at wrapped rows. The limit is lowered to
    the test index's size rather than building 2**31 rows."""
    index = random_pq_index(device, 128, 16, [5, 9, 3])
    args, _ = split(index)
    Q = unit_queries(1, 8, 128, torch.float16, device)
    config = PQConfig(block_t=16, num_warps=4, num_stages=1, docs_per_program=1,
                      persistent=True, independent_warps=True,
                      shared_codebook=device.type == "cuda")
    monkeypatch.setattr(pq_ops, "INT32_ROWS", 16)
    with pytest.raises(ValueError, match="independent_warps=True addresses token rows"):
        maxsim_pq(Q, *args, config=config)
    monkeypatch.setattr(pq_ops, "INT32_ROWS", 64)  # 17 rows, 3 documents + one chunk
    assert_close(maxsim_pq(Q, *args, config=config), reference.maxsim_pq(Q, *args),
                 "maxsim_pq", torch.float16)


def test_default_config_by_number_of_documents():
    many = default_pq_config(1, 32, MANY_DOCS)
    assert many.persistent and many.num_warps == 1 and many.block_d is None
    assert not default_pq_config(1, 32, MANY_DOCS - 1).persistent
    assert not default_pq_config(1, 32, MANY_DOCS, element_size=4).persistent
    assert not default_pq_config(4, 32, MANY_DOCS).persistent  # several query blocks
    # d = 128 in 16 or 32 sub-quantizers: tiles reduced as they come under a register cap.
    for num_subquantizers in (16, 32):
        d128 = default_pq_config(1, 32, MANY_DOCS, num_subquantizers=num_subquantizers,
                                 sub_dim=128 // num_subquantizers)
        assert d128.reduce_per_tile and d128.maxnreg == 128 and d128.docs_per_program == 4
        # M = 16 also loads each full tile's code words a tile ahead.
        assert d128.pipeline_codes == (num_subquantizers == 16)
        assert dataclasses.replace(d128, docs_per_program=2, reduce_per_tile=False,
                                   maxnreg=None, pipeline_codes=False) == many
    assert not default_pq_config(1, 32, MANY_DOCS, num_subquantizers=64, sub_dim=2).reduce_per_tile


@residual_modes
@pytest.mark.parametrize("num_subquantizers", [16, 32])
def test_many_documents_default_is_exact(device, poisoned_outputs, residual_mode, num_subquantizers):
    """The large-set default for the codebook's shape (persistent one-warp programs, one
    128-column chunk, word gathers; at M = 16 and 32 tiles reduced as they come under a
    register cap, at M = 16 code words a tile ahead) on a small index: full tiles, tails, empty
    documents, repeated pids."""
    lengths = [0, 1, 31, 32, 33, 70, 96, 15, 64, 2]
    index = random_pq_index(device, 128, num_subquantizers, lengths,
                            num_centroids=17 if residual_mode else 0)
    args, extra = split(index)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    pids = torch.tensor([9, 3, 3, 0, 5, 6, 1, 8], device=device)
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


def test_lookup_tables_for_a_long_query(device, poisoned_outputs):
    """A query longer than one launch's rows is scored in chunks, each with its own tables."""
    index = random_pq_index(device, 64, 8)
    args, _ = split(index)
    Q = unit_queries(1, 150, 64, torch.float16, device)
    out = maxsim_pq(Q, *args, config=PQConfig(scoring="lut", lut_rows=32))
    assert_close(out, reference.maxsim_pq(Q, *args), "maxsim_pq", torch.float32)


def test_lookup_table_configs_that_cannot_apply_are_refused(device):
    index = random_pq_index(device, 128, 16)
    args, _ = split(index)
    Q = unit_queries(1, 8, 128, torch.float16, device)
    for config, match in ((PQConfig(scoring="tables"), "config.scoring"),
                          (PQConfig(scoring="lut", lut_rows=3), "config.lut_rows"),
                          (PQConfig(scoring="lut", persistent=True), "config.scoring='lut'"),
                          (PQConfig(scoring="lut", gather_bytes=8), "config.scoring='lut'"),
                          (PQConfig(scoring="lut", shared_codebook=True),
                           "config.scoring='lut'"),
                          (PQConfig(scoring="lut", stream_tiles=True), "config.scoring='lut'"),
                          (PQConfig(scoring="lut", independent_warps=True),
                           "config.scoring='lut'"),
                          # 512 KB of table per tile on a GPU; no GPU on the CPU
                          (PQConfig(scoring="lut", lut_rows=32, lut_shared=True),
                           "config.lut_shared=True does not cover: .*(lower lut_rows|a CUDA GPU)")):
        with pytest.raises(ValueError, match=match):
            maxsim_pq(Q, *args, config=config)
