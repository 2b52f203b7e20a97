"""Every kernel path that only a GPU runs compiles for sm_90a, on the CPU, within the shared
memory one block may use.

The interpreter (tests/conftest.py sets TRITON_INTERPRET without a GPU) runs no inline PTX: the
residual and PQ kernels' PTX loads, byte permutes and the paths behind them are compiled only on
a GPU. Here each op's launch is captured as its host code makes it on a GPU (no kernel runs) and
compiled with triton's bundled ptxas (experiments/sass_budget), in a subprocess without
TRITON_INTERPRET: a kernel that does not build (a helper called with the wrong arguments, a bad
asm constraint, staging buffers past the block's shared memory) fails here, not on a user's
GPU.
"""

import textwrap

import pytest

from tests.conftest import compiled_mode_json

_COMPILE = textwrap.dedent("""
    import json, sys
    import torch
    from experiments import sass_budget as sb
    from tilemaxsim_plaid.kernels.maxsim_dense import (_maxsim_dense_kernel,
                                                       _maxsim_packed_flat_kernel,
                                                       _maxsim_packed_slots_kernel)
    from tilemaxsim_plaid.ops import dense, residual_mma
    from tilemaxsim_plaid.kernels.maxsim_pq import _maxsim_pq_kernel
    from tilemaxsim_plaid.kernels.maxsim_pq_lut import _maxsim_pq_lut_kernel
    from tilemaxsim_plaid.kernels.maxsim_residual import (_maxsim_residual_kernel,
                                                          _query_centroid_scores_kernel)
    from tilemaxsim_plaid.ops.dense import (MANY_DOCS, MaxSimConfig, default_config, maxsim_packed,
                                            maxsim_padded)
    from tilemaxsim_plaid.ops.pq import PQConfig, maxsim_pq
    from tilemaxsim_plaid.ops.residual import ResidualConfig, maxsim_residual

    lengths, offsets = sb.benchmark_offsets()
    T, g = sb.CAPTURE_TOKENS, torch.Generator().manual_seed(1)
    max_len = int(lengths.max())
    Q = torch.randn(32, 128, generator=g).half()
    calls = {}
    # The held query in one chunk (rows past a document's end repeated at d = 64, masked at 128)
    # and in 64-column chunks.
    for d in (64, 128, 256):
        Qd, D = torch.randn(32, d, generator=g).half(), sb.packed_rows(offsets, d)
        calls[f"dense d={d}"] = (_maxsim_dense_kernel, lambda Qd=Qd, D=D: maxsim_packed(
            Qd, D, offsets, max_doc_len=max_len, validate=False), ())
    # Several query blocks a program on per-document tiles (a constexpr assigned in their loop
    # fails only when compiled), and short padded documents' default: the held query over a
    # running max.
    Q4, D = torch.randn(4, 64, 128, generator=g).half(), sb.packed_rows(offsets, 128)
    qb2 = MaxSimConfig(block_t=64, queries_per_block=2, q_blocks_per_program=2)
    calls["dense B=4 q_blocks_per_program=2"] = (_maxsim_dense_kernel, lambda: maxsim_packed(
        Q4, D, offsets, max_doc_len=max_len, config=qb2, validate=False), ())
    # Several queries' defaults, rows past a document's end repeated: the held 128-row block
    # (a head holding its tail), documents side by side (slots: eight for a full 128-row block,
    # four otherwise, in order of length) and single tiles of padded documents.
    calls["dense B=4 held"] = (_maxsim_dense_kernel, lambda: maxsim_packed(
        Q4[:, :32], D, offsets, max_doc_len=max_len, validate=False,
        config=dense.default_config(4, 32, max_len, 128, True, offsets.numel() - 1,
                                    joins_tail=True)), ())
    calls["dense B=4 slots"] = (_maxsim_packed_slots_kernel, lambda: maxsim_packed(
        Q4[:, :32], D, offsets, max_doc_len=max_len, validate=False), ())
    Q16 = torch.randn(16, 16, 128, generator=g).half()
    calls["dense B=16 slots"] = (_maxsim_packed_slots_kernel, lambda: maxsim_packed(
        Q16, D, offsets, validate=False), ())
    Q8 = torch.randn(8, 32, 128, generator=g).half()  # two query blocks share each tile
    calls["dense B=8 padded single tile"] = (_maxsim_dense_kernel, lambda: maxsim_padded(
        Q8, torch.zeros(8, 64, 128, dtype=torch.float16), torch.full((8,), 40),
        validate=False), ())
    # The held query's documents walked as one loop (the default for one query's short
    # documents), one query and four (their held 128-row block).
    def flat(Qf):
        saved = dense._flat_documents
        dense._flat_documents = lambda q, cfg, packed, tail, mean: dense._flat_applies(
            cfg, packed, tail)
        config = None if Qf.dim() == 2 else dense.default_config(
            Qf.shape[0], Qf.shape[1], max_len, 128, True, offsets.numel() - 1, joins_tail=True)
        try:
            return maxsim_packed(Qf, D, offsets, max_doc_len=max_len, config=config,
                                 validate=False)
        finally:
            dense._flat_documents = saved
    for name, Qf in (("dense flat documents", Q), ("dense B=4 flat documents", Q4[:, :32])):
        calls[name] = (_maxsim_packed_flat_kernel, lambda Qf=Qf: flat(Qf), ())
    padded = torch.zeros(1, 64, 128, dtype=torch.float16)
    held = default_config(1, 32, 64, 128, num_docs=MANY_DOCS)
    calls["dense padded 64 held"] = (_maxsim_dense_kernel, lambda: maxsim_padded(
        Q, padded, config=held, validate=False), ())
    codes, books = torch.zeros(T, 16, dtype=torch.uint8), torch.randn(16, 256, 8, generator=g)
    calls["pq decode"] = (_maxsim_pq_kernel, lambda: maxsim_pq(Q, codes, offsets, books,
                                                               validate=False), ())
    # Chunks of fewer sub-quantizers than a code word over wide d, fp32 (8 chunks of 2 x 48).
    Q768 = torch.randn(2, 9, 768, generator=g)
    books768 = torch.randn(16, 256, 48, generator=g)
    calls["pq decode fp32 d=768"] = (_maxsim_pq_kernel, lambda: maxsim_pq(
        Q768, codes, offsets, books768, validate=False), ())
    # Several fp32 queries, and one of 64 tokens, at d = 384 as 48 x 8 (three chunks).
    Q384, books384 = torch.randn(4, 64, 384, generator=g), torch.randn(48, 256, 8, generator=g)
    codes48 = torch.zeros(T, 48, dtype=torch.uint8)
    calls["pq decode fp32 d=384 B=4 Lq=64"] = (_maxsim_pq_kernel, lambda: maxsim_pq(
        Q384, codes48, offsets, books384, validate=False), ())
    calls["pq lut"] = (_maxsim_pq_lut_kernel, lambda: maxsim_pq(
        Q, codes, offsets, books, config=PQConfig(scoring="lut"), validate=False), ())
    centroids = torch.randn(4096, 128, generator=g).half()
    for nbits in (1, 2, 4):
        rc = torch.zeros(T, dtype=torch.int32)
        res = torch.zeros(T, 128 * nbits // 8, dtype=torch.uint8)
        w = torch.sort(torch.randn(1 << nbits, generator=g) * 0.03).values
        for decode in ("pairs", "select") + (("permute",) if nbits != 1 else ()):
            for table in (True, False):
                cfg = ResidualConfig(decode=decode, centroid_table=table)
                calls[f"residual nbits={nbits} {decode} table={table}"] = (
                    _maxsim_residual_kernel,
                    lambda rc=rc, res=res, w=w, nbits=nbits, cfg=cfg: maxsim_residual(
                        Q, rc, res, offsets, centroids, w, nbits, inv_norms=torch.ones(T),
                        config=cfg, validate=False),
                    (_query_centroid_scores_kernel,))
        # Codes a tile ahead, on the one-warp persistent launch of the many-document default.
        decode = "pairs" if nbits == 1 else "permute"
        cfg = ResidualConfig(decode=decode, num_warps=1, persistent=True, docs_per_program=2,
                             pipeline_codes=True)
        calls[f"residual nbits={nbits} {decode} table=True pipelined"] = (
            _maxsim_residual_kernel,
            lambda rc=rc, res=res, w=w, nbits=nbits, cfg=cfg: maxsim_residual(
                Q, rc, res, offsets, centroids, w, nbits, inv_norms=torch.ones(T), config=cfg,
                validate=False),
            (_query_centroid_scores_kernel,))
    # The mma kernel's table: query rows read in its column order (PERMUTE_32).
    calls["centroid table permuted"] = (
        _query_centroid_scores_kernel,
        lambda: residual_mma.permuted_table(Q[None, :7], centroids, torch.float16), ())
    from tilemaxsim_plaid.kernels.value_range import OFFSETS, RANGE, _stats_kernel
    for dtype in (torch.int32, torch.int64):  # the ops' range checks of index tensors
        for clamp in (False, True):
            calls[f"value range {dtype} clamp={clamp}"] = (
                _stats_kernel, lambda dtype=dtype, clamp=clamp: _stats_kernel[(1,)](
                    torch.zeros(8, dtype=dtype), torch.zeros(2, dtype=torch.int64),
                    torch.zeros(8, dtype=dtype), 8, 0, 5, 1,
                    torch.zeros(8, dtype=dtype), torch.zeros(2, dtype=torch.int64),
                    torch.zeros(8, dtype=dtype), 8, 0, 5, BLOCK=4096, KIND_A=RANGE,
                    CLAMP_A=clamp, KIND_B=0, CLAMP_B=False), ())
    for clamp in (False, True):
        calls[f"offsets stats clamp={clamp}"] = (
            _stats_kernel, lambda clamp=clamp: _stats_kernel[(1,)](
                torch.arange(8), torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.int64),
                8, 0, 5, 1, torch.arange(8), torch.zeros(4, dtype=torch.int64),
                torch.zeros(8, dtype=torch.int64), 8, 0, 5, BLOCK=4096, KIND_A=OFFSETS,
                CLAMP_A=clamp, KIND_B=0, CLAMP_B=False), ())
    calls["offsets and codes stats in one launch"] = (  # a deferred pair (checks._launch_stats)
        _stats_kernel, lambda: _stats_kernel[(2,)](
            torch.arange(8), torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.int64),
            8, 0, 5, 1, torch.zeros(8, dtype=torch.int32), torch.zeros(2, dtype=torch.int64),
            torch.zeros(8, dtype=torch.int32), 8, 0, 5, BLOCK=4096, KIND_A=OFFSETS,
            CLAMP_A=True, KIND_B=RANGE, CLAMP_B=False, WIDE=False), ())
    out = {}
    for name, (kernel, call, skip) in calls.items():
        launch = sb.capture_launch(kernel, call, name, skip=skip)
        compiled = sb.compile_launch(launch)
        out[name] = {"registers": compiled.registers, "cubin_bytes": len(compiled.cubin),
                     "shared_bytes": compiled.shared_bytes,
                     "opcodes": [i.opcode + (".IDX" if "SHFL.IDX" in i.text else "")
                                 for i in sb.parse_sass(sb.sass_text(compiled.cubin))],
                     "ptx_loads": launch.constexprs.get("PTX_LOADS"),
                     "decode_group": launch.constexprs.get("DECODE_GROUP"),
                     "centroid_table": launch.constexprs.get("CENTROID_TABLE"),
                     "running_max": launch.constexprs.get("RUNNING_MAX"),
                     "repeat_rows": launch.constexprs.get("REPEAT_ROWS"),
                     "single_tile": launch.constexprs.get("SINGLE_TILE"),
                     "pipeline_codes": launch.constexprs.get("PIPELINE_CODES")}
    json.dump(out, open(sys.argv[1], "w"))
""")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compiled_mode_json(_COMPILE, tmp_path_factory, timeout=900)


# Shared memory one block may use on sm_90 (227 KB, opted in); a launch past it fails on the
# GPU with OutOfResources.
SM90_SHARED_PER_BLOCK = 232_448


def test_every_gpu_path_compiles_and_fits_an_sm90_block(compiled):
    # dense: 5, 3 several-query defaults and 2 flat; pq: 4; residual: 8 decoder choices x
    # table / gather, 3 pipelined; the mma kernel's permuted table; last: value range (2 dtypes x
    # clamp), offsets stats (clamp), the two in one launch
    assert len(compiled) == 5 + 3 + 2 + 4 + 2 * 8 + 3 + 1 + 2 * 2 + 2 + 2
    for name, kernel in compiled.items():
        assert kernel["registers"] > 0 and kernel["cubin_bytes"] > 0, name
        assert kernel["shared_bytes"] <= SM90_SHARED_PER_BLOCK, name
    # The short padded documents' default is the held query over a running max.
    assert compiled["dense padded 64 held"]["running_max"] is True
    # Several queries repeat the rows past a document's end, on every path; one query masks.
    for name in ("dense B=4 held", "dense B=4 slots", "dense B=16 slots",
                 "dense B=8 padded single tile", "dense B=4 q_blocks_per_program=2"):
        assert compiled[name]["repeat_rows"] is True, name
    assert compiled["dense B=8 padded single tile"]["single_tile"] is True
    assert compiled["dense d=128"]["repeat_rows"] is False


def test_the_ptx_paths_are_the_ones_compiled(compiled):
    """The residual and PQ decode launches take their GPU code (PTX loads), each decoder, both
    centroid paths and codes a tile ahead as named."""
    assert compiled["pq decode"]["ptx_loads"] is True
    groups = {"pairs": 2, "select": 1, "permute": 0}
    for name, kernel in compiled.items():
        if name.startswith("residual"):
            _, _, decode, table, *pipelined = name.split()
            assert kernel["ptx_loads"] is True, name
            assert kernel["decode_group"] == groups[decode], name
            assert kernel["centroid_table"] == (table == "table=True"), name
            assert kernel["pipeline_codes"] == bool(pipelined), name
