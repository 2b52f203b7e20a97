"""Where the one-query packed and residual kernels lose time: interleaved timing and Nsight Compute.

Two modes, on the benchmark's shapes (100k documents of MS MARCO-like lengths, 32 query tokens,
d = 128; residual codes with C = 65,536 and nbits = 2):

    python -m experiments.profile_kernels time [--rounds 10]
        times every variant below in rounds, one after another within a round, so clock and
        thermal drift hit them all alike; prints each variant's median over rounds.
    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python -m experiments.profile_kernels profile
        runs each variant once (after a warm-up launch) between cudaProfilerStart/Stop, so Nsight
        Compute sees exactly one launch per variant. ``gpu_suite.sh profile-kernels`` runs both.

Every variant's output is checked against the float64 reference before it is timed or profiled.
The variants: our packed kernel at the default and neighbouring configurations, flash-maxsim's
packed kernel when installed, the per-document read floors (experiments/packed_read.py), our
residual kernel and its decode floor (experiments/residual_floors.py).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from experiments import harness
from experiments.bench import CHECK_DOCS, Case, make_inputs, max_relative_error, reference_slice
from experiments.bench_compressed import NBITS, make_index, queries
from experiments.packed_read import expected_read, per_document_read
from experiments.residual_floors import expected_floor, residual_floor
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.dense import MaxSimConfig, default_config, maxsim_packed
from tilemaxsim_plaid.ops.pq import PQConfig, maxsim_pq
from tilemaxsim_plaid.ops.residual import ResidualConfig, maxsim_residual, query_centroid_scores

NUM_DOCS = 100_000
QUERY_LEN = 32
DIM = 128
NUM_CENTROIDS = 65_536

PACKED_CONFIGS = {
    "packed 32/2w/2st": MaxSimConfig(block_t=32, num_warps=2, num_stages=2),
    "packed 32/2w/3st": MaxSimConfig(block_t=32, num_warps=2, num_stages=3),
    "packed 32/2w/4st": MaxSimConfig(block_t=32, num_warps=2, num_stages=4),
    "packed 32/4w/2st": MaxSimConfig(block_t=32, num_warps=4, num_stages=2),
    "packed hold 8docs/2st": MaxSimConfig(block_t=32, num_warps=2, num_stages=2,
                                          docs_per_program=8, hold_query=True),
    "packed hold 8docs/3st": MaxSimConfig(block_t=32, num_warps=2, num_stages=3,
                                          docs_per_program=8, hold_query=True),
    # One-warp programs, the residual kernel's winning shape: the held query costs one warp's
    # registers, not two, so holding it across documents need not halve the programs per SM.
    **{f"packed {bt}/1w/{st}st": MaxSimConfig(block_t=bt, num_warps=1, num_stages=st)
       for bt in (16, 32) for st in (2, 3)},
    **{f"packed 1w hold {bt} d{docs}/{st}st": MaxSimConfig(block_t=bt, num_warps=1, num_stages=st,
                                                           docs_per_program=docs, hold_query=True)
       for bt in (16, 32) for docs in (4, 16) for st in (2, 3)},
}

# Register caps (ptxas .maxnreg) trade a few spills for more programs per SM: 32-token tiles at
# 2 warps compile to 156 registers (6 programs per SM), capped at 128 they spill 4 instructions'
# worth, at 120 about 20; 16-token tiles (the default since) need 96 (sm_90, triton 3.6).
RESIDUAL_CONFIGS = {
    "residual 32/2w": ResidualConfig(block_t=32),
    "residual 32/2w maxnreg128": ResidualConfig(block_t=32, maxnreg=128),
    "residual 32/2w maxnreg120": ResidualConfig(block_t=32, maxnreg=120),
    "residual 16/2w maxnreg80": ResidualConfig(block_t=16, maxnreg=80),
    "residual 32/4w": ResidualConfig(block_t=32, num_warps=4),
    "residual 32/4w maxnreg80": ResidualConfig(block_t=32, num_warps=4, maxnreg=80),
    "residual 16/2w loads": ResidualConfig(shuffle_table=False),
    "residual 16/2w tl.load": ResidualConfig(ptx_loads=False),
    "residual 32/2w tl.load": ResidualConfig(block_t=32, ptx_loads=False),
    "residual 16/1w": ResidualConfig(num_warps=1),
    "residual 16/1w loads": ResidualConfig(num_warps=1, shuffle_table=False),
    "residual 16/1w 2docs": ResidualConfig(num_warps=1, docs_per_program=2),
    "residual 16/1w maxnreg96": ResidualConfig(num_warps=1, maxnreg=96),
    "residual 32/1w": ResidualConfig(block_t=32, num_warps=1),
    # One-warp programs around the best of the rounds above: register caps x documents per
    # program, pair table loaded ("ld") or shuffled ("sh").
    **{f"residual 1w r{reg} d{docs} {'sh' if shuffle else 'ld'}":
       ResidualConfig(num_warps=1, maxnreg=reg, docs_per_program=docs, shuffle_table=shuffle)
       for reg in (None, 80, 96, 112) for docs in (1, 2, 4) for shuffle in (True, False)},
    **{f"residual 1w r{reg} d{docs} ld": ResidualConfig(num_warps=1, maxnreg=reg, docs_per_program=docs)
       for reg in (88, 104) for docs in (4, 8)},
    **{f"residual 1w r96 d8 ld": ResidualConfig(num_warps=1, maxnreg=96, docs_per_program=8)},
    "residual 1w r96 d4 persistent": ResidualConfig(num_warps=1, maxnreg=96, docs_per_program=4,
                                                    persistent=True),
    "residual 1w r96 d2 persistent": ResidualConfig(num_warps=1, maxnreg=96, docs_per_program=2,
                                                    persistent=True),
    # The fp16 default's shape with four weights per table lookup (half the lookups, from a 2 KB
    # table; sm_90 SASS: 32 LDG.E.64 against 64 LDG.E per tile body and tail, 64 more PRMT).
    "residual quads 1w r96 d2 persistent pf1": ResidualConfig(num_warps=1, maxnreg=96,
                                                              docs_per_program=2, persistent=True,
                                                              prefetch=1, decode="quads"),
    # No table lookups: two weights per byte permute from registers (sm_90 SASS of the 16-token
    # tile body: 22 LDG against 54, 0 spill loads against 5, 429 instructions against 408).
    **{f"residual permute 1w r{reg} d2 persistent pf1":
       ResidualConfig(num_warps=1, maxnreg=reg, docs_per_program=2, persistent=True, prefetch=1,
                      decode="permute")
       for reg in (80, 96, 112)},
    "residual permute 32/1w r128 d2 persistent pf1": ResidualConfig(
        block_t=32, num_warps=1, maxnreg=128, docs_per_program=2, persistent=True, prefetch=1,
        decode="permute"),
}

# fp32 queries (sm_90, triton 3.6): split_query compiles to 118 / 90 / 128 registers at 16/2w,
# 16/4w, 32/2w; tf32x3 to 200 / 162 / 255 (+ spills) there.
RERANK_CONFIGS = {
    "16/2w": ResidualConfig(block_t=16, num_warps=2),
    "16/4w": ResidualConfig(block_t=16, num_warps=4),
    "32/2w": ResidualConfig(block_t=32, num_warps=2),
    # Pair-table entries loaded by inline PTX instead of looked up by warp shuffle (the GPU
    # default), and tl.load for residual words and entries (their results cross shared memory on
    # every tile).
    "16/2w loads": ResidualConfig(block_t=16, num_warps=2, shuffle_table=False),
    "32/2w loads": ResidualConfig(block_t=32, num_warps=2, shuffle_table=False),
    "16/2w tl.load": ResidualConfig(block_t=16, num_warps=2, ptx_loads=False),
    "32/2w tl.load": ResidualConfig(block_t=32, num_warps=2, ptx_loads=False),
    # One warp per document: no decode repeated across warps (with 2 warps on a 16-token tile
    # both decode the whole tile for their halves of the query columns).
    "16/1w": ResidualConfig(block_t=16, num_warps=1),
    "16/1w loads": ResidualConfig(block_t=16, num_warps=1, shuffle_table=False),
    "32/1w": ResidualConfig(block_t=32, num_warps=1),
    "32/1w loads": ResidualConfig(block_t=32, num_warps=1, shuffle_table=False),
    **{f"1w r{reg} d{docs}": ResidualConfig(block_t=16, num_warps=1, maxnreg=reg,
                                            docs_per_program=docs, shuffle_table=False)
       for reg in (None, 96, 112, 128) for docs in (1, 2)},
    **{f"1w r{reg} d{docs}": ResidualConfig(block_t=16, num_warps=1, maxnreg=reg,
                                            docs_per_program=docs, shuffle_table=False)
       for reg in (120, 128, 144) for docs in (3, 4)},
    "quads 1w r128 d2 persistent": ResidualConfig(num_warps=1, maxnreg=128, docs_per_program=2,
                                                  persistent=True, decode="quads"),
    **{f"permute 1w r{reg} d{docs} persistent": ResidualConfig(
        num_warps=1, maxnreg=reg, docs_per_program=docs, persistent=True, decode="permute")
       for reg, docs in ((96, 2), (128, 2), (128, 4))},
    # The large-set default with a persistent grid (chunks of documents from an atomic counter).
    "1w r128 d4 persistent": ResidualConfig(num_warps=1, maxnreg=128, docs_per_program=4,
                                            persistent=True),
    "1w r144 d4 persistent": ResidualConfig(num_warps=1, maxnreg=144, docs_per_program=4,
                                            persistent=True),
}

# PQ codes (M = 16 and 32): the former one-query default (byte codes, 16-byte sub-vector
# gathers through tl.load) against word gathers (code and codebook words by inline PTX, in the
# tensor-core operand's layout) with the residual kernel's one-warp and persistent shapes.
# One-warp labels hold the query in registers (hold_query None) unless they say nohold; rounds
# before results/compressed/h200-hold-query ran the same labels with the query read per tile.
PQ_CONFIGS = {
    "former 32/2w d16": PQConfig(block_t=32, docs_per_program=16, num_warps=2, word_gather=False),
    **{f"words {bt}/1w bd{bd} r{reg}{' tl.load' if not ptx else ''}":
       PQConfig(block_t=bt, docs_per_program=2, num_warps=1, num_stages=1, maxnreg=reg,
                persistent=True, block_d=bd, ptx_loads=ptx, gather_bytes=4)
       for bt, bd, reg, ptx in ((32, 128, None, True), (32, 64, None, True), (32, 32, None, True),
                                (16, 32, None, True), (16, 64, None, True), (32, 64, 128, True),
                                (16, 32, 96, True), (32, 128, None, False),
                                (32, 64, None, False))},
    # Eight-byte codebook words (the default from run 42): half the gathers
    # (sm_90 SASS: 48 LDG.E.64 against 96 LDG.E per 32-token tile body and tail).
    **{f"words 32/1w bd{bd} rNone g8": PQConfig(block_t=32, docs_per_program=2, num_warps=1,
                                                num_stages=1, persistent=True, block_d=bd,
                                                gather_bytes=8)
       for bd in (64, 128)},
    # Sixteen-byte words, one gather per 8-dimension sub-vector, in the operand's register order
    # (sm_90 SASS of the 32-token tile body: 16 LDG.E.128 against 32 LDG.E.64, 451 instructions
    # against 573). M = 16 only: at M = 32 a sub-vector is half a word.
    **{f"words 32/1w bd{bd} rNone g16": PQConfig(block_t=32, docs_per_program=2, num_warps=1,
                                                 num_stages=1, persistent=True, block_d=bd,
                                                 gather_bytes=16)
       for bd in (64, 128)},
    # The word-gather defaults with the query read back from shared memory before every product,
    # as before hold_query (the labels above hold it in the first operand's registers).
    **{f"words 32/1w bd64 rNone g{g} nohold": PQConfig(block_t=32, docs_per_program=2,
                                                      num_warps=1, num_stages=1, persistent=True,
                                                      block_d=64, gather_bytes=g, hold_query=False)
       for g in (8, 16)},
    # One 128-column chunk with the query held: code words loaded one tile ahead (pipe), also
    # for tails of full tile width (tail32), against per tile (the labels above).
    **{f"words 32/1w bd128 rNone g{g} pipe": PQConfig(block_t=32, docs_per_program=2,
                                                     num_warps=1, num_stages=1, persistent=True,
                                                     gather_bytes=g, pipeline_codes=True)
       for g in (8, 16)},
    **{f"words 32/1w bd128 rNone g{g} tail32": PQConfig(block_t=32, block_t_tail=32,
                                                       docs_per_program=2, num_warps=1,
                                                       num_stages=1, persistent=True,
                                                       gather_bytes=g, pipeline_codes=True)
       for g in (8, 16)},
    # The 16-byte one-warp shape with a register cap (144: 4 spill loads per tile body in sm_90
    # SASS, still 12 programs per SM, as registers are allocated per scheduler; 128: 7 spill
    # loads, 16 programs) or 4 and 8 documents per counter increment.
    **{f"words 32/{dpp}d/1w bd128 r{reg} g16": PQConfig(block_t=32, docs_per_program=dpp,
                                                       num_warps=1, num_stages=1,
                                                       persistent=True, gather_bytes=16,
                                                       maxnreg=reg)
       for dpp, reg in ((2, 144), (2, 128), (4, None), (8, None))},
    # Each tile reduced over its tokens as it comes (reduce_per_tile): 32 fewer live registers,
    # so a cap of 144 has no spills in the tile loop (sm_90 SASS). 4 documents at 144: the
    # default at d = 128, M = 16 and (with 8-byte words) M = 32.
    # With 32-bit codebook parts (each product takes its operand registers as the load wrote
    # them; sm_90 SASS of the M = 16 tile body: 215 instructions against 351) the caps again,
    # 96 (20 programs per SM) and none, and 8 documents per counter increment.
    **{f"words 32/{dpp}d/1w bd128 r{reg} g{g} tilemax": PQConfig(
        block_t=32, docs_per_program=dpp, num_warps=1, num_stages=1, persistent=True,
        gather_bytes=g, maxnreg=reg, reduce_per_tile=True)
       for g, dpp, reg in ((16, 2, None), (16, 2, 144), (16, 2, 128), (16, 4, 144), (16, 4, 128),
                           (16, 4, 96), (16, 4, None), (16, 8, 144), (16, 8, 128), (8, 4, 144),
                           (8, 4, 128), (8, 4, 96), (8, 4, None), (8, 8, 144), (8, 8, 128))},
    # Two skewed codebook copies (skewed_codebook, opt-in) against the codebook as it is (the
    # labels above). Run 4 of results/compressed/h200-register-order timed these when the skew
    # was the default, under the labels above and with "noskew" for the plain layout.
    **{f"words 32/4d/1w bd128 r{reg} g16 tilemax skew": PQConfig(
        block_t=32, docs_per_program=4, num_warps=1, num_stages=1, persistent=True,
        gather_bytes=16, maxnreg=reg, reduce_per_tile=True, skewed_codebook=True)
       for reg in (128, 144)},
    # The default with its documents' code rows past the first tile asked of L2 ahead (pf1; pf2:
    # the next document's too), or each full tile's code words loaded a tile ahead (pipe).
    # Both together ("pipe pf2") and the 8-byte shape with code words a tile ahead: the open
    # predictions of results/PERFORMANCE_LOG.md.
    **{f"words 32/4d/1w bd128 r128 g{g} tilemax {label}": PQConfig(
        block_t=32, docs_per_program=4, num_warps=1, num_stages=1, persistent=True,
        gather_bytes=g, maxnreg=128, reduce_per_tile=True, **extra)
       for g, label, extra in ((16, "pf1", dict(prefetch=1)), (16, "pf2", dict(prefetch=2)),
                               (16, "pipe", dict(pipeline_codes=True)),
                               (16, "pipe pf2", dict(pipeline_codes=True, prefetch=2)),
                               (8, "pipe", dict(pipeline_codes=True)),
                               (8, "pipe pf2", dict(pipeline_codes=True, prefetch=2)))},
    # A chunk's documents as one stream of tiles (stream_tiles): code words always a tile
    # ahead, a document's last tile masked in the same loop; with the codebook words gathered
    # a tile ahead too (ahead), at 16-token tiles (a second tile of gathered words in
    # registers) under caps of 128 (spills in sm_90 SASS), 168 (3 programs per scheduler) and
    # none (194 registers, 2 per scheduler), and with 8 documents per chunk.
    **{f"words {bt}/{dpp}d/1w bd128 r{reg} g{g} stream{' ahead' if ahead else ''}": PQConfig(
        block_t=bt, docs_per_program=dpp, num_warps=1, num_stages=1, persistent=True,
        gather_bytes=g, maxnreg=reg, stream_tiles=True, decode_ahead=ahead)
       for g, bt, dpp, reg, ahead in ((16, 32, 4, 128, False), (16, 16, 4, 128, False),
                                      (16, 16, 4, 128, True), (16, 16, 4, 168, True),
                                      (16, 16, 4, None, True), (16, 16, 8, 168, True),
                                      (16, 32, 4, None, True), (8, 32, 4, 128, False),
                                      (8, 16, 4, 168, True),
                                      # the pipeline restarts at each chunk: longer chunks
                                      (16, 16, 16, 168, True), (16, 16, 32, 168, True),
                                      (16, 16, 16, 128, True), (16, 16, 8, 128, False),
                                      (16, 16, 16, 128, False), (16, 32, 16, 128, False),
                                      (8, 16, 16, 168, True))},
    # Hiding the gathers' latency (stream ahead) left Nsight Compute's L1/TEX at 82-91 %: the
    # stream with the two skewed codebook copies (fewer L1 wavefronts per gather), and the
    # default with them for comparison.
    **{f"words {bt}/{dpp}d/1w bd128 r{reg} g16 stream{' ahead' if ahead else ''} skew": PQConfig(
        block_t=bt, docs_per_program=dpp, num_warps=1, num_stages=1, persistent=True,
        gather_bytes=16, maxnreg=reg, stream_tiles=True, decode_ahead=ahead,
        skewed_codebook=True)
       for bt, dpp, reg, ahead in ((16, 32, 168, True), (16, 16, 128, True), (16, 16, 128, False),
                                   (16, 32, None, True))},
    "words 32/4d/1w bd128 r128 g16 tilemax pipe skew": PQConfig(
        block_t=32, docs_per_program=4, num_warps=1, num_stages=1, persistent=True,
        gather_bytes=16, maxnreg=128, reduce_per_tile=True, pipeline_codes=True,
        skewed_codebook=True),
    # Warps that share one codebook, each scoring its own documents (independent_warps): staged
    # in shared memory (smem; skew: the two skewed copies, 128 KB) or gathered through L1.
    # Registers allow 16 warps per SM at 128 (one program of 16, two of 8, ...); shared
    # memory 3 plain copies or one skewed pair per SM.
    **{f"warps {bt}/{dpp}d/{w}w r{reg} g{g}{' smem' if smem else ''}{' skew' if skew else ''}":
       PQConfig(block_t=bt, docs_per_program=dpp, num_warps=w, num_stages=1, persistent=True,
                gather_bytes=g, maxnreg=reg, independent_warps=True, shared_codebook=smem,
                skewed_codebook=skew)
       for bt, dpp, w, g, smem, skew, reg in (
           (16, 8, 16, 16, True, False, 128), (16, 8, 16, 16, True, True, 128),
           (16, 8, 8, 16, True, False, 128), (16, 16, 8, 16, True, False, 128),
           (16, 8, 4, 16, True, False, 128), (16, 32, 16, 16, True, True, 128),
           (32, 8, 16, 16, True, True, 128), (16, 8, 16, 16, False, False, 128),
           (16, 8, 16, 8, True, False, 128), (16, 8, 8, 8, True, False, 128),
           # fewer documents per warp: less idling behind the warp with the most tiles
           (16, 4, 16, 16, True, True, 128), (16, 2, 16, 16, True, True, 128),
           # larger chunks, cut into runs of equal tiles per warp (fewer restarts per program)
           (16, 16, 16, 16, True, True, 128), (16, 64, 16, 16, True, True, 128),
           (16, 24, 16, 16, True, True, 128), (16, 48, 16, 16, True, True, 128),
           # 32-token tiles at 8 warps (164 registers uncapped: one program of 8 per SM with
           # the skewed copies, three with the plain copy)
           (32, 8, 8, 16, True, True, None), (32, 16, 8, 16, True, True, None),
           (32, 8, 8, 16, True, False, None))},
    # Tensor-core decode with every warp on its own documents, CUDA C++ by NVRTC
    # (scoring="mma", kernels/maxsim_pq_mma.cu; M = 16 only, GPU only): documents a warp takes
    # at a time (g) and warps per block.
    **{f"mma {w}w g{grab}{f' c{chains}' if chains > 1 else ''}": PQConfig(
        scoring="mma", docs_per_program=grab, mma_warps=w, mma_chains=chains)
       for w, grab, chains in ((16, 4, 1), (16, 1, 1), (16, 2, 1), (16, 8, 1), (12, 4, 1),
                               (8, 4, 1), (24, 4, 1), (16, 4, 2), (12, 4, 2))},
    # Tails in full 32-token tiles (masked) instead of 16-token ones.
    **{f"words 32+32/4d/1w bd128 r144 g{g} tilemax": PQConfig(
        block_t=32, block_t_tail=32, docs_per_program=4, num_warps=1, num_stages=1,
        persistent=True, gather_bytes=g, maxnreg=144, reduce_per_tile=True)
       for g in (8, 16)},
    # The codebook staged in shared memory once per program (shared_codebook): gathers served
    # by banks instead of L1 lines, at 64 KB of shared memory per program (3 one-warp programs
    # per SM, 2 of 4 or 8 warps). Each beside the same shape gathering through L1. Multi-warp
    # programs take 8-byte words (16-byte ones do not compile at 4 warps in triton 3.6).
    **{f"words {bt}+{tail}/{w}w bd128 rNone g{g}{' smem' if smem else ''}": PQConfig(
        block_t=bt, block_t_tail=tail, docs_per_program=2, num_warps=w, num_stages=1,
        persistent=True, gather_bytes=g, shared_codebook=smem)
       for bt, tail, w, g in ((32, 16, 1, 16), (64, 16, 4, 8), (64, 64, 4, 8), (128, 32, 8, 8))
       for smem in (True, False)},
    # Per-query lookup tables (scoring="lut"), the textbook design, in row tiles held in L1.
    **{f"lut r{rows} {bt}/{w}w d4": PQConfig(scoring="lut", lut_rows=rows, block_t=bt,
                                             num_warps=w, docs_per_program=4, lut_shared=False)
       for rows, bt, w in ((8, 32, 2), (8, 32, 4), (16, 16, 4), (32, 32, 2), (32, 32, 4))},
    # The same tables held in shared memory (CUDA, lut_shared; GPU only): rows per tile, and
    # documents a warp takes at a time.
    **{f"lut shared r{rows} g{grab}": PQConfig(scoring="lut", lut_rows=rows, lut_shared=True,
                                               docs_per_program=grab)
       for rows, grab in ((8, 4), (4, 4), (8, 1), (8, 16))},
}
# Timed again with every code 0 (no gather conflicts).
PQ_ZERO_CODE_CONFIGS = ("words 32/1w bd128 rNone", "words 32/1w bd64 rNone g8",
                        "words 32/1w bd64 rNone g16", "words 32/1w bd64 rNone g8 nohold",
                        "words 32/1w bd128 rNone g16", "words 32/1w bd128 rNone g16 pipe",
                        "words 32/4d/1w bd128 r128 g16 tilemax",
                        "words 32/4d/1w bd128 r128 g8 tilemax",
                        "words 32/4d/1w bd128 r128 g16 tilemax skew")


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 2e-3) -> None:
    err = max_relative_error(got, want)
    if not err <= tol:
        raise AssertionError(f"{name}: max relative error {err:.2e} > {tol:.0e}")


def packed_variants(num_docs: int = NUM_DOCS, device: str = "cuda") -> dict:
    """{name: (run, check)} for the packed shape; check raises if run's output is wrong."""
    case = Case(f"1q packed N={num_docs} mean70 d=128", 1, QUERY_LEN, num_docs, 0, DIM, packed=True)
    x = make_inputs(case, device=device)
    Q = x.Q[0]
    max_len = int(x.lengths.max())
    ref = reference_slice(case, x)[0]  # float64, the first CHECK_DOCS documents
    n = ref.numel()
    variants = {}
    default = default_config(1, QUERY_LEN, max_len, DIM, variable_lengths=True, num_docs=num_docs)
    configs = {"packed default": default, **PACKED_CONFIGS}
    for name, cfg in configs.items():
        variants[name] = (lambda c=cfg: maxsim_packed(Q, x.D_packed, x.offsets, max_doc_len=max_len,
                                                      config=c, validate=False),
                          lambda out, name=name: _assert_close(name, out[:n], ref))
    try:
        import flash_maxsim
    except ImportError:
        flash_maxsim = None
    if flash_maxsim is not None and device != "cpu":
        cu = x.offsets.to(torch.int32)
        variants["flash_maxsim_packed"] = (
            lambda: flash_maxsim.flash_maxsim_packed(Q, x.D_packed, cu, max_seqlen_d=max_len),
            lambda out: _assert_close("flash_maxsim_packed", out.reshape(-1)[:n], ref))
    per_doc_sum = expected_read(x.D_packed, x.offsets)
    variants["floor read"] = (lambda: per_document_read(x.D_packed, x.offsets),
                              lambda out: _assert_close("floor read", out, per_doc_sum, 1e-2))
    variants["floor bare maxsim"] = (
        lambda: per_document_read(x.D_packed, x.offsets, query=Q, product=True),
        lambda out: _assert_close("floor bare maxsim", out[:n], ref))
    return variants


def residual_variants(num_docs: int = NUM_DOCS, device: str = "cuda",
                      num_centroids: int = NUM_CENTROIDS) -> dict:
    """{name: (run, check)} for the residual shape; check raises if run's output is wrong."""
    device = torch.device(device)
    index = make_index(num_docs, num_centroids, DIM, NBITS, device)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    args = (Q, index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], NBITS)
    n = min(CHECK_DOCS, num_docs)
    ref = reference.maxsim_residual(Q.cpu(), index["codes"].cpu(), index["residuals"].cpu(),
                                    index["offsets"][: n + 1].cpu(), index["centroids"].cpu(),
                                    index["bucket_weights"].cpu(), NBITS)
    scores = query_centroid_scores(Q[None], index["centroids"])
    floor_args = (index["codes"], index["residuals"], index["inv_norms"], index["offsets"], scores,
                  index["bucket_weights"], NBITS)
    floor_ref = expected_floor("decode", *floor_args)
    variants = {}
    for name, cfg in {"residual default": None, **RESIDUAL_CONFIGS}.items():
        variants[name] = (lambda c=cfg: maxsim_residual(*args, inv_norms=index["inv_norms"],
                                                        config=c, validate=False),
                          lambda out, name=name: _assert_close(name, out[:n], ref))
    # The fp16 query's centroid-score table in fp16 (64 B gathered per token instead of 128),
    # built once here ("S fp16") or by the kernel's host per call (the default, half_table).
    # The variants above take the fp32 table (half_table=False).
    half_scores = scores.half()
    prefetching = {f"residual {bt}/1w r{reg} d{docs} persistent pf{pf}":
                   ResidualConfig(block_t=bt, num_warps=1, maxnreg=reg, docs_per_program=docs,
                                  persistent=True, prefetch=pf, half_table=False)
                   for bt, reg, docs, pf in ((16, 96, 2, 0), (16, 96, 2, 1), (16, 104, 2, 1),
                                             (16, 112, 2, 1), (16, 96, 1, 1), (16, 96, 3, 1),
                                             (32, 128, 2, 1), (32, None, 2, 1))}
    for name, cfg in prefetching.items():
        variants[name] = (lambda c=cfg: maxsim_residual(*args, inv_norms=index["inv_norms"],
                                                        config=c, validate=False),
                          lambda out, name=name: _assert_close(name, out[:n], ref))
    for name, cfg in (("residual default S fp16", None),
                      *((f"{name} S fp16", cfg) for name, cfg in prefetching.items())):
        variants[name] = (lambda c=cfg: maxsim_residual(*args, inv_norms=index["inv_norms"],
                                                        centroid_scores=half_scores, config=c,
                                                        validate=False),
                          lambda out, name=name: _assert_close(name, out[:n], ref))
    # PLAID's rerank path: an fp32 query, every document once in shuffled order (pids), with
    # the two ways of multiplying fp32 (ops/residual.py: fp16x2 = split_query, tf32x3).
    Q32 = Q.float()
    pids = torch.randperm(num_docs, generator=torch.Generator().manual_seed(2)).to(device)
    ref_pids = reference.maxsim_residual(Q32.cpu(), index["codes"].cpu(), index["residuals"].cpu(),
                                         index["offsets"].cpu(), index["centroids"].cpu(),
                                         index["bucket_weights"].cpu(), NBITS, pids[:n].cpu())
    rerank_args = (Q32, *args[1:], pids)
    for products, split in (("fp16x2", True), ("tf32x3", False), ("fp16", None)):
        for label, cfg in RERANK_CONFIGS.items():
            if products == "tf32x3" and cfg.decode in ("quads", "permute"):
                continue  # these decoders emit 16-bit weights; tf32x3 decodes fp32
            name = f"rerank {products} {label}"
            if split is None:  # the plugin's fp16 mode: fp32 centroid table, fp16-rounded query
                run = (lambda c=cfg: maxsim_residual(
                    Q32.half(), *rerank_args[1:], inv_norms=index["inv_norms"],
                    centroid_scores=query_centroid_scores(Q32[None], index["centroids"]),
                    config=c, validate=False))
            else:
                run = (lambda c=cfg, split=split: maxsim_residual(
                    *rerank_args, inv_norms=index["inv_norms"], split_query=split, config=c,
                    validate=False))
            variants[name] = (run,
                              lambda out, name=name: _assert_close(name, out[:n], ref_pids))
    return {
        **variants,
        "residual floor decode": (lambda: residual_floor("decode", *floor_args),
                                  lambda out: torch.testing.assert_close(
                                      out.double(), floor_ref, rtol=1e-4, atol=1e-2)),
    }


def pq_variants(num_docs: int = NUM_DOCS, device: str = "cuda",
                subquantizers: tuple = (16, 32)) -> dict:
    """{name: (run, check)} for PQ codes on the residual shape's documents: uniform random codes
    and codebooks (the gathers' addresses are as scattered as a trained codec's). "zero codes"
    repeats a variant with every code 0, so every gather of a warp hits the same words: what is
    left is the kernel without gather conflicts."""
    device = torch.device(device)
    offsets = make_index(num_docs, 64, DIM, NBITS, device)["offsets"]
    num_tokens = int(offsets[-1])
    g = torch.Generator().manual_seed(3)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    n = min(CHECK_DOCS, num_docs)
    variants = {}
    for M in subquantizers:
        codes = torch.randint(0, 256, (num_tokens, M), generator=g, dtype=torch.uint8).to(device)
        books = (torch.randn(M, 256, DIM // M, generator=g) / DIM**0.5).to(device)
        for codes_name, c in (("", codes), (" zero codes", torch.zeros_like(codes))):
            ref = reference.maxsim_pq(Q.cpu(), c.cpu(), offsets[: n + 1].cpu(), books.cpu())
            for label, cfg in PQ_CONFIGS.items():
                if codes_name and label not in PQ_ZERO_CODE_CONFIGS:
                    continue
                if cfg.gather_bytes and (DIM // M) % (cfg.gather_bytes // 2):
                    continue  # a sub-vector is not whole words of that width
                if cfg.scoring == "mma" and (M != 16 or device.type != "cuda"):
                    continue  # the CUDA kernel: M = 16 on a GPU (tests/kernels/test_maxsim_pq_mma.py)
                if cfg.lut_shared and (M * cfg.lut_rows > 227 or device.type != "cuda"):
                    continue  # the CUDA kernel: a GPU, a table tile within 227 KB
                name = f"pq{M}{codes_name} {label}"
                variants[name] = (lambda c=c, b=books, cfg=cfg: maxsim_pq(
                                      Q, c, offsets, b, config=cfg, validate=False),
                                  lambda out, name=name, ref=ref: _assert_close(name, out[:n], ref))
    return variants


def time_rounds(variants: dict, rounds: int, rep_ms: int) -> dict:
    """{name: [median ms of each round]}: every round times every variant once, in order."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (run, _check) in variants.items():
            times[name].append(harness.time_ms(run, rep_ms=rep_ms)[0])
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.profile_kernels",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("time", "profile"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=50)
    parser.add_argument("--only", default="", help="comma-separated substrings of variant names "
                        "(a key starting with '=' is a whole name)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_kernels times GPU kernels and needs a CUDA device")
    variants = {**packed_variants(), **residual_variants(), **pq_variants()}
    if args.only:
        keys = [k.strip() for k in args.only.split(",")]
        variants = {n: v for n, v in variants.items()
                    if any(n == k[1:] if k.startswith("=") else k in n for k in keys)}
    for name, (run, check) in variants.items():
        check(run())  # also the warm-up (compile) launch
        print(f"checked {name}", flush=True)
    torch.cuda.synchronize()
    if args.mode == "profile":
        for name, (run, _check) in variants.items():
            torch.cuda.profiler.start()
            run()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"profiled {name}", flush=True)
        return
    times = time_rounds(variants, args.rounds, args.rep_ms)
    print(f"\n{'variant':<28} {'median ms':>10} {'min':>8} {'max':>8}   ({args.rounds} rounds)")
    for name, values in times.items():
        print(f"{name:<28} {statistics.median(values):>10.4f} {min(values):>8.4f} {max(values):>8.4f}")


if __name__ == "__main__":
    main()
