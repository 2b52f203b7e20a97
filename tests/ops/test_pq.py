"""Host side of maxsim_pq (ops/pq.py, ops/pq_mma.py): input checks, refusals, and the rules
that choose a scoring, a config and the launch's internal choices. No kernel runs here unless a
test says so: launches are recorded by a stand-in kernel. Exactness is tests/kernels/."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import ON_GPU
from tests.kernels.test_maxsim_pq import random_pq_index, split, unit_queries
from tilemaxsim_plaid.ops import pq as pq_ops
from tilemaxsim_plaid.ops import pq_mma
from tilemaxsim_plaid.ops.pq import (MANY_DOCS, MMA_DEFAULT, PQConfig, default_pq_config,
                                     maxsim_pq)


class RecordedLaunches:
    """Stands in for _maxsim_pq_kernel and pq_mma.launch_pq_mma: records each launch's grid
    and keyword arguments (the kernel's constexprs and num_warps / num_stages / maxnreg)."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(dict(kind="decode", grid=grid, **kwargs))
        return launch

    def mma(self, Q3, pq_codes, offsets, codebooks, pids, query_lengths, num_out_docs, **kwargs):
        self.launches.append(dict(kind="mma", **kwargs))
        return torch.zeros(Q3.shape[0], num_out_docs)


@pytest.fixture
def recorded(monkeypatch):
    """Launches recorded, not run, as on a GPU (inline-PTX loads on) where the mma kernel is
    available only if a test says so (mma_available)."""
    record = RecordedLaunches()
    monkeypatch.setattr(pq_ops, "_maxsim_pq_kernel", record)
    monkeypatch.setattr(pq_ops, "interpreting", lambda: False)
    monkeypatch.setattr(pq_mma, "launch_pq_mma", record.mma)
    # The centroid-score table of residual mode is built by a real kernel: on a GPU machine it
    # could not read these CPU tensors, so it is stood in for by a table of the right shape.
    monkeypatch.setattr(pq_ops, "query_centroid_scores",
                        lambda Q3, centroids, *args: torch.zeros(centroids.shape[0], Q3.shape[0] * Q3.shape[1]))
    return record


def mma_available(monkeypatch):
    monkeypatch.setattr(pq_mma, "reasons_not_to_apply", lambda *args: [])
    monkeypatch.setattr(pq_mma, "check_applies", lambda *args: None)
    monkeypatch.setattr(pq_ops.nvrtc, "available", lambda: True)


def index_of(num_docs, dim, num_subquantizers, residual_mode=False):
    """num_docs documents of 2 tokens, zero codes: enough for the host to choose a launch."""
    offsets = torch.arange(num_docs + 1, dtype=torch.int64) * 2
    index = dict(pq_codes=torch.zeros(2 * num_docs, num_subquantizers, dtype=torch.uint8),
                 offsets=offsets,
                 codebooks=torch.zeros(num_subquantizers, 256, dim // num_subquantizers))
    if residual_mode:
        index.update(centroid_codes=torch.zeros(2 * num_docs, dtype=torch.int32),
                     centroids=torch.zeros(3, dim, dtype=torch.float16),
                     inv_norms=torch.ones(2 * num_docs))
    return index


def default_launch(recorded, B, Lq, num_docs, dim, num_subquantizers, dtype=torch.float16,
                   residual_mode=False):
    index = index_of(num_docs, dim, num_subquantizers, residual_mode)
    args, extra = split(index)
    recorded.launches.clear()
    maxsim_pq(torch.zeros(B, Lq, dim, dtype=dtype), *args, **extra, validate=False)
    (launch,) = recorded.launches
    return launch


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


def test_decode_configs_that_cannot_apply_are_refused(device):
    Q = unit_queries(1, 8, 128, torch.float16, device)
    args = split(random_pq_index(device, 128, 16))[0]
    for config, match in ((PQConfig(block_t=24), "config.block_t "),
                          (PQConfig(block_t_tail=8), "config.block_t_tail"),
                          (PQConfig(maxnreg=8), "config.maxnreg")):
        with pytest.raises(ValueError, match=match):
            maxsim_pq(Q, *args, config=config)
    # Code words a tile ahead need word gathers and one chunk of sub-quantizers.
    with pytest.raises(ValueError, match="config.pipeline_codes=True"):
        maxsim_pq(unit_queries(1, 8, 384, torch.float16, device),
                  *split(random_pq_index(device, 384, 48))[0], config=PQConfig(pipeline_codes=True))
    with pytest.raises(ValueError, match="config.pipeline_codes=True"):  # d/M = 6: byte gathers
        maxsim_pq(unit_queries(1, 8, 96, torch.float16, device),
                  *split(random_pq_index(device, 96, 16))[0], config=PQConfig(pipeline_codes=True))
    with pytest.raises(ValueError, match="config.pipeline_codes=True"):  # fp32: byte gathers
        maxsim_pq(Q.float(), *args, config=PQConfig(pipeline_codes=True))
    # M = 24 of d/M = 8: chunks of 16, which M is not a multiple of (byte gathers).
    with pytest.raises(ValueError, match="M a multiple of the chunk's sub-quantizer count.*"
                                         "2 chunks of 16 sub-quantizers"):
        maxsim_pq(unit_queries(1, 8, 192, torch.float16, device),
                  *split(random_pq_index(device, 192, 24))[0], config=PQConfig(pipeline_codes=True))
    with pytest.raises(ValueError, match="config.persistent"):
        maxsim_pq(unit_queries(2, 32, 128, torch.float16, device), *args,
                  config=PQConfig(queries_per_block=1, persistent=True))


def test_lookup_table_configs_that_cannot_apply_are_refused(device):
    index = random_pq_index(device, 128, 16)
    args, _ = split(index)
    Q = unit_queries(1, 8, 128, torch.float16, device)
    for config, match in ((PQConfig(scoring="tables"), "config.scoring"),
                          (PQConfig(scoring="lut", lut_rows=3), "config.lut_rows"),
                          (PQConfig(scoring="lut", persistent=True), "config.scoring='lut'"),
                          (PQConfig(scoring="lut", pipeline_codes=True), "config.scoring='lut'"),
                          (PQConfig(scoring="lut", reduce_per_tile=True), "config.scoring='lut'"),
                          (PQConfig(scoring="lut", maxnreg=128), "config.scoring='lut'"),
                          # 512 KB of table per tile on a GPU; no GPU on the CPU
                          (PQConfig(scoring="lut", lut_rows=32, lut_shared=True),
                           "config.lut_shared=True does not cover: .*(lower lut_rows|a CUDA GPU)")):
        with pytest.raises(ValueError, match=match):
            maxsim_pq(Q, *args, config=config)


@pytest.mark.parametrize("config,match", [
    pytest.param(PQConfig(block_t=0), "config.block_t must be a power of two", id="block_t0"),
    pytest.param(PQConfig(block_t=8), "config.block_t .*scoring='decode'", id="decode-block_t8"),
    pytest.param(PQConfig(block_t_tail=12), "config.block_t_tail", id="tail12"),
    pytest.param(PQConfig(queries_per_block=6), "config.queries_per_block", id="qpb6"),
    pytest.param(PQConfig(docs_per_program=-1), "config.docs_per_program", id="docs-1"),
    pytest.param(PQConfig(num_warps=6), "config.num_warps", id="warps6"),
    pytest.param(PQConfig(num_stages=0), "config.num_stages", id="stages0"),
    pytest.param(PQConfig(persistent=1), "config.persistent must be True or False",
                 id="persistent-int"),
    pytest.param(PQConfig(reduce_per_tile=None), "config.reduce_per_tile", id="reduce-None"),
    pytest.param(PQConfig(pipeline_codes="no"), "config.pipeline_codes", id="pipeline-str"),
    pytest.param(PQConfig(maxnreg=256), "config.maxnreg", id="maxnreg256"),
    pytest.param(PQConfig(lut_rows=12), r"config.lut_rows must be one of \(4, 8, 16, 32\)",
                 id="lut_rows12"),
    pytest.param(PQConfig(scoring="lut", lut_shared=0), "config.lut_shared", id="shared-int"),
    pytest.param(PQConfig(scoring="lut", block_t=48), "config.block_t", id="lut-block_t48"),
    pytest.param(PQConfig(scoring="mma", docs_per_program=0), "config.docs_per_program",
                 id="mma-docs0"),
])
def test_every_config_field_is_checked(config, match):
    """check_config names the field and what it takes; maxsim_pq refuses the same config
    before it looks at the documents (here: none)."""
    with pytest.raises(ValueError, match=match):
        pq_ops.check_config(config)
    Q = torch.zeros(1, 4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=match):
        maxsim_pq(Q, **index_of(0, 64, 8), config=config)


def test_config_rules_name_every_field_and_take_the_defaults():
    assert set(pq_ops.CONFIG_FIELDS) == {f.name for f in dataclasses.fields(PQConfig)}
    assert set(pq_ops.DECODE_ONLY) <= set(pq_ops.CONFIG_FIELDS)
    pq_ops.check_config(PQConfig())
    pq_ops.check_config(MMA_DEFAULT)
    for B, Lq, num_docs, element_size, (M, sub_dim) in [
            (1, 32, 100, 2, (16, 8)), (1, 32, MANY_DOCS, 2, (16, 8)), (1, 32, MANY_DOCS, 2, (32, 4)),
            (1, 32, MANY_DOCS, 2, (48, 8)), (8, 32, MANY_DOCS, 2, (16, 8)), (3, 1, 5, 4, (2, 32))]:
        pq_ops.check_config(default_pq_config(B, Lq, num_docs, element_size, M, sub_dim))
    # Lookup tables sum on the CUDA cores: tiles of any power of two.
    for block_t in (1, 2, 8):
        pq_ops.check_config(PQConfig(scoring="lut", block_t=block_t))


def test_mma_refusals_name_what_does_not_apply(device):
    index = random_pq_index(device, 96, 16)
    args, _ = split(index)
    mma = PQConfig(scoring="mma")
    with pytest.raises(ValueError, match="d = 96"):
        maxsim_pq(unit_queries(1, 8, 96, torch.float16, device), *args, config=mma)
    index = random_pq_index(device, 128, 16, num_centroids=7)
    args, extra = split(index)
    Q = unit_queries(1, 8, 128, torch.float16, device)
    with pytest.raises(ValueError, match="centroid codes"):
        maxsim_pq(Q, *args, **extra, config=mma)
    with pytest.raises(ValueError, match="fp16 or bf16"):
        maxsim_pq(Q.float(), *args, config=mma)
    # Strided codes are made contiguous by maxsim_pq; a contiguous view off 16-byte alignment
    # is refused.
    buffer = torch.zeros(args[0].numel() + 1, dtype=torch.uint8, device=device)
    codes = buffer[1:].view(args[0].shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        maxsim_pq(Q, codes, *args[1:], config=mma)
    if not ON_GPU:
        with pytest.raises(ValueError, match="a CUDA GPU"):
            maxsim_pq(Q, *args, config=mma)


def test_default_config_by_number_of_documents():
    many = default_pq_config(1, 32, MANY_DOCS)
    assert many.persistent and many.num_warps == 1 and many.block_t == 32
    assert (many.docs_per_program, many.reduce_per_tile, many.maxnreg) == (2, False, None)
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
    few = default_pq_config(1, 32, 100)
    assert (few.block_t, few.docs_per_program, few.num_warps, few.persistent) == (32, 16, 2, False)
    wide = default_pq_config(8, 32, MANY_DOCS)
    assert (wide.block_t, wide.queries_per_block, wide.num_warps, wide.docs_per_program) == (
        64, 2, 4, 2)
    assert default_pq_config(2, 32, MANY_DOCS).docs_per_program == 4


def test_codebook_word_width_and_held_query_follow_the_shape(monkeypatch):
    """Word gathers where 16-bit queries meet an even power-of-two d/M in whole chunks of a
    multiple of 4 sub-quantizers; the widest codebook word that divides d/M and the codebook's
    alignment allows, 16 bytes only with the query held; the query held in one-warp programs
    of 16-bit queries (with a triton that compiles it: tests/test_triton_support.py)."""
    monkeypatch.setattr(pq_ops, "triton_version", lambda: pq_ops.HOLD_QUERY_MIN_TRITON)
    assert pq_ops._hold_query(1, torch.float16, 32, 128)
    assert pq_ops._hold_query(1, torch.bfloat16, 16, 64)
    assert not pq_ops._hold_query(2, torch.float16, 32, 128)
    assert not pq_ops._hold_query(1, torch.float32, 32, 128)

    def words(dim, num_subquantizers, held, dtype=torch.float16, codebooks=None):
        index = index_of(4, dim, num_subquantizers)
        books = (codebooks if codebooks is not None
                 else index["codebooks"].to(dtype).contiguous())
        m_block = pq_ops.subquantizer_blocking(num_subquantizers, dim // num_subquantizers)[0]
        return pq_ops._word_gather(torch.zeros(1, 1, dim, dtype=dtype), index["pq_codes"], books,
                                   num_subquantizers, dim // num_subquantizers, m_block, held)

    assert words(128, 16, True) == (True, 16)
    assert words(128, 16, False) == (True, 8)
    assert words(128, 32, True) == (True, 8)
    assert words(128, 64, True) == (True, 4)
    assert words(384, 48, True) == (True, 16)
    assert words(96, 16, True)[0] is False  # d/M = 6
    assert words(128, 16, True, torch.float32)[0] is False
    buffer = torch.empty(16 * 256 * 8 + 4, dtype=torch.float16)
    shifted = buffer[4:].view(16, 256, 8)
    assert words(128, 16, True, codebooks=shifted) == (True, 8)
    assert pq_ops.subquantizer_blocking(48, 8) == (16, 3, 8)
    assert pq_ops.subquantizer_blocking(16, 24) == (4, 4, 32)


@pytest.mark.parametrize("residual_mode", [False, True])
def test_default_launches_per_input_class(recorded, monkeypatch, residual_mode):
    """What maxsim_pq launches with config=None, per input class (as on a GPU without the mma
    kernel, with a triton that compiles the held query; the mma kernel's own choice is the next
    test)."""
    monkeypatch.setattr(pq_ops, "triton_version", lambda: pq_ops.HOLD_QUERY_MIN_TRITON)
    # One query, many documents, d = 128 as M = 16: one-warp persistent programs, the query
    # held, 16-byte codebook words, code words a tile ahead, tiles reduced as they come, 128
    # registers.
    launch = default_launch(recorded, 1, 32, MANY_DOCS, 128, 16, residual_mode=residual_mode)
    assert (launch["BLOCK_T"], launch["BLOCK_T_TAIL"], launch["DOCS_PER_PROGRAM"]) == (32, 16, 4)
    assert (launch["num_warps"], launch["num_stages"], launch["maxnreg"]) == (1, 1, 128)
    assert launch["PERSISTENT"] and launch["HOLD_QUERY"] and launch["WORD_GATHER"]
    assert launch["PTX_LOADS"] and launch["PIPELINE_CODES"] and launch["REDUCE_PER_TILE"]
    assert (launch["GATHER_BYTES"], launch["M_BLOCK"], launch["NUM_M_BLOCKS"]) == (16, 16, 1)
    assert launch["CENTROID_TABLE"] == launch["PRECOMPUTED_NORMS"] == residual_mode
    # M = 32: paired 8-byte words, no code words ahead.
    launch = default_launch(recorded, 1, 32, MANY_DOCS, 128, 32, residual_mode=residual_mode)
    assert (launch["GATHER_BYTES"], launch["PIPELINE_CODES"], launch["REDUCE_PER_TILE"]) == (
        8, False, True)
    # Other shapes of many documents: one-warp persistent programs of 2 documents per chunk.
    launch = default_launch(recorded, 1, 32, MANY_DOCS, 128, 64, residual_mode=residual_mode)
    assert (launch["GATHER_BYTES"], launch["DOCS_PER_PROGRAM"], launch["maxnreg"]) == (4, 2, None)
    assert launch["PERSISTENT"] and not launch["REDUCE_PER_TILE"]
    launch = default_launch(recorded, 1, 32, MANY_DOCS, 96, 16, residual_mode=residual_mode)
    assert not launch["WORD_GATHER"] and not launch["PTX_LOADS"] and launch["HOLD_QUERY"]
    # Few documents: 2-warp programs of 16 documents, the query read per product.
    launch = default_launch(recorded, 1, 32, 100, 128, 16, residual_mode=residual_mode)
    assert (launch["num_warps"], launch["DOCS_PER_PROGRAM"], launch["GATHER_BYTES"]) == (2, 16, 8)
    assert not launch["PERSISTENT"] and not launch["HOLD_QUERY"]
    # fp32 queries: byte gathers, never persistent.
    launch = default_launch(recorded, 1, 32, MANY_DOCS, 128, 16, torch.float32, residual_mode)
    assert not launch["WORD_GATHER"] and not launch["PERSISTENT"]
    # Several queries: 64-token tiles, 4 warps, queries stacked per block.
    launch = default_launch(recorded, 8, 32, MANY_DOCS, 128, 16, residual_mode=residual_mode)
    assert (launch["BLOCK_T"], launch["num_warps"], launch["QUERIES_PER_BLOCK"]) == (64, 4, 2)
    # fp32, several queries: 32-token tiles, one query a block (shared memory).
    launch = default_launch(recorded, 8, 32, MANY_DOCS, 384, 48, torch.float32, residual_mode)
    assert (launch["BLOCK_T"], launch["QUERIES_PER_BLOCK"]) == (32, 1)


def test_fp32_queries_past_32_tokens_launch_in_32_token_chunks(recorded):
    """An fp32 query of more than FP32_QUERY_CHUNK tokens is scored in launches of that many
    (a 64-row block of fp32 chunks does not fit a block's shared memory at d = 384); 16-bit
    queries and explicit configs take one launch."""
    assert pq_ops.FP32_QUERY_CHUNK == 32
    for Lq, launches in ((32, 1), (33, 2), (64, 2), (70, 3)):
        default_launch_count = _launch_count(recorded, 2, Lq, 384, 48, torch.float32)
        assert default_launch_count == launches, Lq
    assert _launch_count(recorded, 2, 64, 384, 48, torch.float16) == 1
    assert _launch_count(recorded, 2, 64, 384, 48, torch.float32, PQConfig(block_t=32)) == 1


def _launch_count(recorded, B, Lq, dim, num_subquantizers, dtype, config=None):
    args, extra = split(index_of(MANY_DOCS, dim, num_subquantizers))
    recorded.launches.clear()
    maxsim_pq(torch.zeros(B, Lq, dim, dtype=dtype), *args, **extra, config=config,
              validate=False)
    return len(recorded.launches)


def test_mma_is_the_default_where_it_applies(recorded, monkeypatch):
    """MMA_DEFAULT from MANY_DOCS scored documents on, where the mma kernel applies and NVRTC
    loads; below that, or where it does not apply, the decode kernel."""
    assert MMA_DEFAULT.scoring == "mma" and MMA_DEFAULT.docs_per_program == 4
    # On this machine's inputs (CPU tensors, or without NVRTC) it never applies.
    assert default_launch(recorded, 1, 32, MANY_DOCS, 128, 16)["kind"] == "decode"
    mma_available(monkeypatch)
    assert default_launch(recorded, 1, 32, MANY_DOCS, 128, 16) == dict(kind="mma", grab=4)
    assert default_launch(recorded, 3, 32, MANY_DOCS, 128, 16, torch.bfloat16)["kind"] == "mma"
    assert default_launch(recorded, 1, 32, MANY_DOCS - 1, 128, 16)["kind"] == "decode"
    pids = torch.zeros(MANY_DOCS, dtype=torch.int64)  # scored documents count, not stored ones
    args, _ = split(index_of(10, 128, 16))
    recorded.launches.clear()
    maxsim_pq(torch.zeros(1, 32, 128, dtype=torch.float16), *args, pids, validate=False)
    assert recorded.launches[0]["kind"] == "mma"


def test_mma_applies_only_to_its_shape():
    Q = torch.zeros(1, 32, 128, dtype=torch.float16)
    args, extra = split(index_of(4, 128, 16, residual_mode=True))
    reasons = pq_mma.reasons_not_to_apply(Q.float(), args[0], args[2], extra["centroid_codes"],
                                          None)
    assert any("fp16 or bf16" in r for r in reasons)
    assert any("centroid codes" in r for r in reasons)
    assert any("CUDA GPU" in r for r in reasons)
    args32 = split(index_of(4, 128, 32))[0]
    assert any("d = 128 as M = 16" in r
               for r in pq_mma.reasons_not_to_apply(Q, args32[0], args32[2], None, None))
