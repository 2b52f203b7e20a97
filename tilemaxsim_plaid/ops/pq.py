"""Host side of fused PQ-code MaxSim: check inputs, allocate, pick a config, launch."""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton

from tilemaxsim_plaid.kernels.maxsim_pq import (PTX_FROM_GLOBAL, PTX_FROM_SHARED,
                                               _maxsim_pq_kernel)
from tilemaxsim_plaid.kernels.maxsim_pq_lut import _maxsim_pq_lut_kernel
from tilemaxsim_plaid.kernels.maxsim_pq_warps import _maxsim_pq_warps_kernel
from tilemaxsim_plaid.ops import checks, nvrtc, pq_lut_shared, pq_mma
from tilemaxsim_plaid.ops.launch import (document_grid, dot_precision, interpreter_upcast,
                                         interpreting, launch_in_query_chunks,
                                         persistent_programs, prepare_shared_buffer)
from tilemaxsim_plaid.ops.residual import MAX_MAXNREG, MIN_MAXNREG, query_centroid_scores

__all__ = ["PQConfig", "default_pq_config", "maxsim_pq"]

# Decoded columns per tensor-core product: 128 (M_BLOCK sub-quantizers of DSUB_PAD elements).
MAX_BLOCK_D = 128
MIN_DOT_DIM = 16
# PQ codes are bytes: 256 centroids per sub-quantizer.
CODEBOOK_SIZE = 256
# From this many scored documents on, one query is scored by a persistent grid of one-warp
# programs (default_pq_config), as in ops/residual.py.
MANY_DOCS = 16384
# Word gathers read codes and codebooks as 32-bit words: 4 codes, or two 16-bit weights.
WORD_BYTES = 4
# Codebook bytes per gather: 2, 4 or 8 16-bit weights.
GATHER_BYTES = (4, 8, 16)
# The independent-warps kernel keeps token rows and document indices in int32.
INT32_ROWS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class PQConfig:
    """One fixed launch configuration for :func:`maxsim_pq`.

    Attributes:
        block_t: tokens per main tile; block_t_tail: tokens per tile of a document's remainder.
        queries_per_block: queries stacked into one tensor-core product.
        docs_per_program: documents one program walks (with persistent, per chunk); with
            independent_warps, documents per warp in a chunk at most (chunks are sized so
            that each program takes the same number).
        num_warps, num_stages: Triton launch parameters.
        block_d: decoded columns per tensor-core product (32, 64 or 128; None: 128); the
            query's first two chunks stay held. With the query held (hold_query) one 128-column
            chunk is the faster one on the H200: 0.416 against 0.493 ms (M = 16, 16-byte words;
            all of a tile's gathers are in flight before its one product). Before hold_query,
            64 columns ran 1-2 % faster; at 32 the compiler's schedule collapses (4x slower).
        word_gather: read codes and codebook as 32-bit words, two weights per gather
            (kernels/maxsim_pq.py). None: wherever it applies (16-bit queries, an even
            power-of-two sub-dimension, whole chunks of a multiple of 4 sub-quantizers, 4-byte
            aligned code rows); True where it does not is refused.
        scoring: "decode" (decode each token's sub-vectors in registers and multiply on the
            tensor cores, kernels/maxsim_pq.py) or "lut" (per-query lookup tables built once per
            call, M entries summed per token and query row, kernels/maxsim_pq_lut.py; uses
            block_t, docs_per_program, num_warps, num_stages and lut_rows only), or "mma"
            (kernels/maxsim_pq_mma.cu, CUDA C++ compiled by NVRTC: every warp walks its own
            documents, the codebook staged once per block in a shared-memory layout free of
            bank conflicts, each gather landing in the tensor-core operand's registers; covers
            d = 128 as M = 16, fp16/bf16 queries of at most 32 tokens, PQ codes of embeddings,
            on compute capability 8.0 or later; uses docs_per_program as the documents a warp
            takes at a time and mma_warps only; GPU only, ops/pq_mma.py).
        mma_warps: with scoring="mma", warps per block (one block per SM, 128 KB of codebook).
        mma_chains: with scoring="mma", independent accumulations per product (1 or 2).
        lut_rows: with scoring="lut", query rows per table tile (4, 8, 16 or 32): a tile's
            table is M * 256 * lut_rows fp32 entries (128 KB at M = 16, 8 rows).
        lut_shared: with scoring="lut", hold each tile's table in a block's shared memory
            (kernels/maxsim_pq_lut_shared.cu, CUDA C++ by NVRTC; docs_per_program documents
            per grab, 16 warps per block) instead of reading it through L1 from the Triton
            kernel. None: wherever it applies (a GPU with NVRTC, a tile's table within the
            block's shared memory: M * lut_rows <= 227 at 227 KB); True where it does not is
            refused. On the H200 (M = 16, 100k documents, results/compressed/h200-pq-mma run 8)
            it took 1.78 ms at 8 rows and 1.56 at 4, against 3.68 and 1.16 ms for the Triton
            kernel at 8 and 32 rows, and 0.21-0.22 for the decode on tensor cores (mma): the
            tables' M * 4 B per query row and token is the cost either way.
        gather_bytes: with word_gather, the codebook word read per gather: 4 (two weights), 8
            (four, half the gathers; d/M a multiple of 4) or 16 (eight: one gather per
            sub-vector at d/M = 8, weights in the operand's register order). None: the widest
            that applies, 16 only with the query held. On the H200 (one-warp default, M = 16)
            4 -> 8 bytes took 0.611 to 0.513 ms (results/compressed/h200-wide-gathers); 8 -> 16
            bytes gained nothing with the query read from shared memory (0.530 -> 0.526 ms) and
            5 % with it held (0.439 -> 0.416 ms; results/compressed/h200-hold-query).
        ptx_loads: with word_gather, read the words by inline PTX in the tensor-core operand's
            layout. None: on a GPU; the CPU interpreter runs no PTX, so there it is always off.
        persistent: a fixed grid of programs (ops.launch.document_grid)
            taking chunks of docs_per_program documents from an atomic counter. One query
            block only.
        prefetch: 0, or 1: each document's code rows past its first tile are prefetched into
            L2 (inline PTX) before its tiles are walked; 2: the next document's too. GPU only
            (a hint: the interpreter skips it).
        maxnreg: a cap on registers per thread (ptx .maxnreg), or None for the compiler's
            choice. Registers are allocated per scheduler (16,384 each on an H200, a warp
            on one), so a one-warp program's cap buys occupancy only in steps: 168 and 144
            registers fit 3 warps per scheduler, 128 fits 4. At 128 the one-warp default
            spilled and ran 9 % slower; with reduce_per_tile it did not lose (below).
        hold_query: hold the query's first two chunks in registers in the tensor cores'
            first-operand layout (kernels/maxsim_pq._hold_as_first_operand) instead of reading
            them back from shared memory before every product. None: wherever it applies
            (one warp, 16-bit queries, query blocks and chunks of multiples of 16 rows and
            columns).
        pipeline_codes: load each full tile's code words while the tile before it is scored,
            instead of at the tile's start (word gathers, all sub-quantizers in one chunk:
            block_d covering d). On the H200 it first cost 3 % at M = 16 (0.413 -> 0.425 ms,
            16-byte words; 0.436 -> 0.544 with 8-byte words, 186 registers) and gained 3 % at
            M = 32 (0.548 -> 0.530; results/compressed/h200-hold-query): only a document's
            second and later full tiles are covered, at 15 % more instructions. With the
            shorter tile body of 32-bit codebook parts and 128 registers it gains 10 % at
            M = 16 (0.388 -> 0.349; results/compressed/h200-register-order), the default
            there since.
        reduce_per_tile: reduce each full tile's scores over its tokens as it comes, instead
            of an elementwise running max reduced once per document: 32 fewer live registers
            per lane at 32 x 32 tiles, 8 more shuffles per tile. Meant for a register cap
            (maxnreg): sm_90 SASS of the 16-byte default at maxnreg=144 has no spills in the
            tile loop. On the H200 (M = 16, 2 documents per chunk): 0.406 ms at 144 (still 12
            warps per SM, Nsight Compute), 0.404 at 128 (16 warps), against 0.419 for the
            running max uncapped and 0.472 for this without a cap
            (results/compressed/h200-shared-codebook). The default at d = 128, M = 16 or 32.
        shared_codebook: stage the codebook (256 * d 16-bit weights, 64 KB at d = 128) in
            shared memory once per program and gather from there by inline PTX, instead of
            through L1 (kernels/maxsim_pq._stage_codebook_in_shared): shared-memory banks
            serve a warp's 16-byte gathers in a few wavefronts, L1 in one per distinct line.
            Needs word gathers and a persistent grid (a program stages it once for all its
            documents); the grid is as many programs as fit by shared memory. GPU only: the CPU
            interpreter runs no PTX and gathers through tl.load. Opt-in, and slower on the H200
            (results/compressed/h200-shared-codebook, M = 16): each program needs its own copy,
            so 3 one-warp programs fit an SM (1.007 ms against 0.415 through L1; at that
            quarter of the warps a warp issued every 6.6 cycles against 9.8); programs of 4 or
            8 warps split each tile's products and ran 1.32-2.93 ms (1.18-3.16 through L1).
        skewed_codebook: gather from two copies of the codebook laid out so that the eight
            16-byte gathers a quarter-warp issues together fall in eight different bank groups
            (kernels/maxsim_pq._skewed_slot, skewed_codebook below): 128 KB at d = 128 instead
            of 64, built once per launch by one index_select. Needs 16-byte words of
            8-dimension sub-vectors, the query held and the codebook not staged in shared
            memory. Opt-in: on the H200 (M = 16, the default shape, results/compressed/
            h200-register-order) it took Nsight Compute's L1/TEX throughput from 84 % to 62 %
            and the time did not follow (0.382 against 0.374 ms in rounds: the kernel waits on
            load latency, not on L1 bandwidth). With every code 0, where the plain layout puts
            a quarter-warp's gathers in one bank group, it ran 0.340 against 0.418.
        stream_tiles: walk all of a persistent program's documents as one stream of
            block_t-token tiles (kernels/maxsim_pq._score_pq_stream) instead of document by
            document: every tile, a document's first included, has its code words loaded while
            the tile before it is multiplied, and a document's last tile is a masked tile of the
            same loop rather than a tail loop of its own (block_t_tail, pipeline_codes,
            reduce_per_tile and prefetch are then unused). Needs word gathers, one chunk of
            sub-quantizers (block_d covering d) and a persistent grid.
        decode_ahead: with stream_tiles, gather each tile's codebook words while the tile
            before it is multiplied (code words two tiles ahead): a second decoded tile in
            registers, so meant for 16-token tiles.
            Both opt-in: on the H200 (M = 16, results/compressed/h200-tile-stream) no stream
            variant beat the default by more than run-to-run spread. The stream alone took
            0.359-0.376 ms, with words gathered ahead 0.350-0.388 (best: 16-token tiles, 32
            documents per chunk, 168 registers), against 0.354-0.356 for the default. Nsight
            Compute: the wait on loads fell from 4.3 to 1.3 cycles per issued instruction,
            and the L1 data pipe's wavefronts of the codebook gathers (82-91 % busy in both)
            then held the time where it was.
        independent_warps: programs of num_warps warps that share one codebook (staged in
            shared memory with shared_codebook, optionally as skewed copies), each warp scoring
            its own run of the program's chunk as a stream of block_t-token tiles
            (kernels/maxsim_pq_warps.py); a chunk is cut into runs of about equal tiles per
            warp. Meant to take the codebook gathers off the L1 data pipe without a copy per
            warp. Needs word gathers, one chunk of sub-quantizers, one query, PQ codes of
            embeddings (no centroid codes or inverse norms), a persistent grid, and token rows
            and documents that fit int32. Opt-in: on the H200 (M = 16,
            results/compressed/h200-tile-stream/run11) it ties the default, 0.351 ms at its
            best (16 warps, chunks of up to 24 or 32 documents per warp, the skewed copies
            staged) against 0.356; smaller chunks are slower (8 per warp: 0.460, a pipeline
            restart and a cut per chunk), and so is one chunk per program (0.396). The skewed
            copies take the gathers' wavefronts down (L1 data pipe 49 % under Nsight Compute,
            91 % for the default), but the per-warp document streams execute 1.6x the
            default's instructions (145 M against 91 M: per-warp bounds recomputed in each
            layout that uses them, each tile's maxima summed and sent through shared memory to
            the store) at 47 % issue. Earlier forms: 64-bit rows and spills at the 128
            registers a 16-warp program allows, 0.489 ms (run 7); int32, 0.407 (run 9); the
            plain copy 0.620 (bank conflicts: data pipe 82 %).
    """

    block_t: int = 64
    block_t_tail: int = 16
    queries_per_block: int = 1
    docs_per_program: int = 4
    num_warps: int = 4
    num_stages: int = 2
    block_d: int | None = None
    word_gather: bool | None = None
    gather_bytes: int | None = None
    scoring: str = "decode"
    lut_rows: int = 8
    lut_shared: bool | None = None
    mma_warps: int = 16
    mma_chains: int = 1
    ptx_loads: bool | None = None
    persistent: bool = False
    prefetch: int = 0
    maxnreg: int | None = None
    hold_query: bool | None = None
    pipeline_codes: bool = False
    reduce_per_tile: bool = False
    shared_codebook: bool = False
    skewed_codebook: bool = False
    stream_tiles: bool = False
    decode_ahead: bool = False
    independent_warps: bool = False


# The default where scoring="mma" applies (d = 128 as M = 16, fp16/bf16, PQ codes of
# embeddings, a GPU with NVRTC) and at least MANY_DOCS documents are scored. H200, 100k
# documents of mean 70 tokens, one 32-token query, interleaved rounds (results/compressed/
# h200-pq-mma, run 4): 0.201 ms with two accumulation chains, 0.206 with one, against 0.363 for
# the Triton default and 0.449 for dense packed scoring of the same documents. Run 2: 1, 2, 4 or
# 8 documents per grab within 1 %; 12 warps 0.238 ms, 8 warps 0.602, 24 warps 0.897.
MMA_DEFAULT = PQConfig(scoring="mma", docs_per_program=4, mma_warps=16, mma_chains=2)


def _pow2(x: int) -> int:
    return 1 if x <= 1 else triton.next_power_of_2(x)


def default_pq_config(num_queries: int, Lq: int, num_docs: int = 0,
                      element_size: int = 2, num_subquantizers: int | None = None,
                      sub_dim: int | None = None) -> PQConfig:
    """Same shape logic as the residual kernel: up to 64 query rows per block.

    One query (H200, interleaved rounds of experiments/profile_kernels.py, 100k documents of MS
    MARCO-like lengths, d = 128; results/compressed/h200-pq-words):
    * at least MANY_DOCS documents with 16-bit queries: word gathers in one-warp programs of
      32-token tiles, on a persistent grid taking 2 documents at a time. In two 64-column
      chunks: M = 16 0.612 ms, M = 32 0.784 ms, against 1.567 / 2.823 ms for the former
      default; with 8-byte codebook words 0.513 / 0.617 ms (results/compressed/
      h200-wide-gathers). Now one 128-column chunk with the query held in registers and
      16-byte words where they apply: M = 16 **0.412 ms**, M = 32 0.552 (bench_compressed,
      results/compressed/h200-hold-query).
      At d = 128 with M = 16 or 32 also 4 documents per chunk and each tile reduced as it
      comes (reduce_per_tile) under a cap of 144 registers: M = 16 0.397 against 0.419 ms in
      rounds (0.412 with 4 documents alone), M = 32 0.486 against 0.556; bench M = 16
      **0.397 ms**, M = 32 0.484 (results/compressed/h200-shared-codebook). A cap of 128 fits
      16 programs per SM instead of 12 and gained nothing sure (0.399 against 0.411 at M = 16,
      0.492 against 0.485 at M = 32). With the codebook read in 32-bit parts in the
      products' register order (kernels/maxsim_pq._decode_pq_words; sm_90 SASS of the tile
      body 351 -> 215 instructions at M = 16) the time moved little, and 128 registers now
      gain: M = 16 0.375 against 0.387 ms at 144, M = 32 0.421 against 0.441, in five
      interleaved rounds (results/compressed/h200-register-order). So the cap is 128. What
      is left is load latency (Nsight Compute at M = 16: 7.5 of a warp's 17 cycles between
      instructions wait on loads, L1/TEX 84 %; skewing the codebook out of bank conflicts took
      L1/TEX to 62 % and gained nothing): code words loaded a tile ahead (pipeline_codes) now
      gain at M = 16, 0.349 against 0.388 ms in rounds (L2 prefetches of the code rows:
      0.360-0.364), so M = 16 takes them; M = 32 was not re-timed with them.
      A 2-warp program splits a tile's products by query rows, so both warps gather the
      whole tile (16-token tiles: 1.03 ms); 16-token one-warp tiles took 0.695 ms. Nsight
      Compute on the earlier 144-register default: issue on 31 % of cycles, 12 one-warp
      programs per SM, L1/TEX 80 % (84 % with 16 programs at 128 registers), a warp's
      instructions 9.3 cycles apart, 2.9 of them waiting on loads.
    * otherwise 32-token tiles, 16 documents per program and 2 warps (results/compressed/
      h200-final: 1.56 ms against 2.66 ms for 64-token tiles, 4 documents, 4 warps, M = 16).
    """
    lq = _pow2(Lq)
    queries_per_block = max(1, min(_pow2(num_queries), max(MIN_DOT_DIM, 64) // lq))
    if num_queries * lq <= 32:
        if num_docs >= MANY_DOCS and element_size == 2:
            one_warp = PQConfig(block_t=32, block_t_tail=16, queries_per_block=queries_per_block,
                                docs_per_program=2, num_warps=1, num_stages=1, persistent=True)
            if (num_subquantizers, sub_dim) in ((16, 8), (32, 4)):
                return dataclasses.replace(one_warp, docs_per_program=4, reduce_per_tile=True,
                                           maxnreg=128,
                                           pipeline_codes=num_subquantizers == 16)
            return one_warp
        return PQConfig(block_t=32, queries_per_block=queries_per_block, docs_per_program=16,
                        num_warps=2)
    return PQConfig(queries_per_block=queries_per_block,
                    docs_per_program=4 if num_queries * lq <= 64 else 2)


def subquantizer_blocking(num_subquantizers: int, sub_dim: int,
                          block_d: int = MAX_BLOCK_D) -> tuple[int, int, int]:
    """(M_BLOCK, NUM_M_BLOCKS, DSUB_PAD): sub-quantizers per decoded chunk of <= block_d columns."""
    dsub_pad = _pow2(sub_dim)
    m_block = min(_pow2(num_subquantizers), max(1, block_d // dsub_pad))
    m_block = max(m_block, triton.cdiv(MIN_DOT_DIM, dsub_pad))
    return m_block, triton.cdiv(num_subquantizers, m_block), dsub_pad


def _word_gather(cfg: PQConfig, Q3, pq_codes, codebooks, num_subquantizers, sub_dim,
                 m_block, held_query) -> tuple[bool, int]:
    """(word gathers on, codebook bytes per gather) for cfg, or a ValueError naming the field."""
    applies = (Q3.element_size() == 2 and sub_dim % 2 == 0 and sub_dim & (sub_dim - 1) == 0
               and m_block % 4 == 0 and num_subquantizers % m_block == 0
               and pq_codes.stride(0) % WORD_BYTES == 0 and pq_codes.data_ptr() % WORD_BYTES == 0
               and codebooks.data_ptr() % WORD_BYTES == 0)
    if cfg.word_gather and not applies:
        raise ValueError(
            "config.word_gather=True needs 16-bit queries, an even power-of-two sub-dimension, "
            "whole chunks of a multiple of 4 sub-quantizers and 4-byte aligned code rows and "
            f"codebook; got {Q3.dtype} queries, M={num_subquantizers}, d/M={sub_dim}, {m_block} "
            f"sub-quantizers per chunk, code row stride {pq_codes.stride(0)}")
    words = applies if cfg.word_gather is None else cfg.word_gather

    def wide_applies(gather_bytes):
        # Whole words per sub-vector and an aligned codebook; 16-byte words fill the operand's
        # 32-column groups (kernels/maxsim_pq._decode_pq_words), so a chunk is whole groups.
        return (words and sub_dim % (gather_bytes // 2) == 0
                and codebooks.data_ptr() % gather_bytes == 0
                and (gather_bytes < 16 or m_block * sub_dim % 32 == 0))

    if cfg.gather_bytes is None:
        # The widest word that applies; 16-byte words only with the query held (hold_query),
        # where they beat 8-byte ones at both chunk widths (H200, M = 16: 0.416 against
        # 0.439 ms at 128 columns, 0.493 against 0.526 at 64; results/compressed/
        # h200-hold-query). Without it they were no faster (0.522 against 0.517 ms).
        widths = GATHER_BYTES if held_query else GATHER_BYTES[:-1]
        return words, next(g for g in widths[::-1] if g == WORD_BYTES or wide_applies(g))
    if cfg.gather_bytes not in GATHER_BYTES:
        raise ValueError(f"config.gather_bytes must be None or one of {GATHER_BYTES}, got "
                         f"{cfg.gather_bytes}")
    if cfg.gather_bytes > WORD_BYTES and not wide_applies(cfg.gather_bytes):
        raise ValueError(
            f"config.gather_bytes={cfg.gather_bytes} needs word gathers, d/M a multiple of "
            f"{cfg.gather_bytes // 2}, a {cfg.gather_bytes}-byte aligned codebook (and for 16, "
            f"chunks of whole 32 columns); got word gathers {'on' if words else 'off'}, "
            f"d/M={sub_dim}, {m_block * sub_dim}-column chunks")
    return words, cfg.gather_bytes


def _hold_query(cfg: PQConfig, dtype: torch.dtype, block_q: int, chunk_cols: int) -> bool:
    """Whether the held query chunks sit in the first operand's registers
    (kernels/maxsim_pq._hold_as_first_operand), or a ValueError for an explicit True that
    cannot apply."""
    # One warp: with more, the products' layouts split rows over warps differently from the
    # identity product's (2 warps: shared-memory loads per tile again), and at 4 warps (wgmma)
    # triton 3.6 fails to compile it.
    applies = (cfg.num_warps == 1 and dtype in (torch.float16, torch.bfloat16)
               and block_q % MIN_DOT_DIM == 0 and chunk_cols % MIN_DOT_DIM == 0)
    if cfg.hold_query and not applies:
        raise ValueError(f"config.hold_query=True needs one warp, a 16-bit query and query blocks "
                         f"and chunks of multiples of {MIN_DOT_DIM}; got num_warps="
                         f"{cfg.num_warps}, {dtype}, {block_q} query rows, {chunk_cols}-column "
                         f"chunks")
    return applies if cfg.hold_query is None else cfg.hold_query


def _pipeline_codes(cfg: PQConfig, words: bool, num_m_blocks: int) -> bool:
    """Whether full tiles' code words are loaded one tile ahead (opt-in), or a ValueError for
    an explicit True that cannot apply."""
    applies = words and num_m_blocks == 1
    if cfg.pipeline_codes and not applies:
        raise ValueError(f"config.pipeline_codes=True needs word gathers and one chunk of "
                         f"sub-quantizers (block_d covering d); got word gathers "
                         f"{'on' if words else 'off'}, {num_m_blocks} chunks")
    return bool(cfg.pipeline_codes)


def _stream_tiles(cfg: PQConfig, words: bool, num_m_blocks: int) -> tuple[bool, bool]:
    """(stream_tiles, decode_ahead) as launched (opt-in), or a ValueError for a config that
    cannot take them."""
    if cfg.decode_ahead and not cfg.stream_tiles:
        raise ValueError("config.decode_ahead=True needs config.stream_tiles=True")
    if cfg.stream_tiles and not (words and num_m_blocks == 1 and cfg.persistent):
        raise ValueError(f"config.stream_tiles=True needs word gathers, one chunk of "
                         f"sub-quantizers (block_d covering d) and a persistent grid; got word "
                         f"gathers {'on' if words else 'off'}, {num_m_blocks} chunks, "
                         f"persistent={cfg.persistent}")
    return cfg.stream_tiles, cfg.decode_ahead


def _shared_codebook(cfg: PQConfig, words: bool) -> bool:
    """Whether the codebook is staged in shared memory (opt-in), or a ValueError for a
    config that cannot take it."""
    if cfg.shared_codebook and not (words and cfg.persistent and cfg.ptx_loads is not False):
        raise ValueError(f"config.shared_codebook=True needs word gathers, PTX loads and a "
                         f"persistent grid; got word gathers {'on' if words else 'off'}, "
                         f"ptx_loads={cfg.ptx_loads}, persistent={cfg.persistent}")
    return cfg.shared_codebook


def _skewed_codebook(cfg: PQConfig, gather_bytes: int, sub_dim: int, held_query: bool,
                     book_in_shared: bool) -> bool:
    """Whether the kernel gathers from two skewed codebook copies, or a ValueError for a config
    that cannot take them."""
    applies = gather_bytes == 16 and sub_dim == 8 and held_query and not book_in_shared
    if cfg.skewed_codebook and not applies:
        raise ValueError("config.skewed_codebook=True needs 16-byte codebook words of "
                         "8-dimension sub-vectors, the query held and the codebook not in shared "
                         f"memory; got gather_bytes={gather_bytes}, d/M={sub_dim}, query held: "
                         f"{held_query}, shared_codebook={book_in_shared}")
    return cfg.skewed_codebook


@functools.lru_cache(maxsize=16)
def _skewed_sources(num_subquantizers: int, m_block: int, device: torch.device) -> torch.Tensor:
    """int64 [2 * M * 256]: the codebook row ([M * 256, d / M] flattened) in each slot of
    skewed_codebook's layout."""
    sub = torch.arange(num_subquantizers)
    chunk, local = sub // m_block, sub % m_block
    groups = m_block // 4
    code = torch.arange(CODEBOOK_SIZE)
    # kernels/maxsim_pq._skewed_slot for copy 0; copy 1 is 4 slots on.
    slot = (chunk[:, None] * (2 * CODEBOOK_SIZE * m_block)
            + 8 * (code[None, :] * groups + (local % groups)[:, None]) + (local // groups)[:, None])
    rows = torch.arange(num_subquantizers * CODEBOOK_SIZE)
    sources = torch.empty(2 * num_subquantizers * CODEBOOK_SIZE, dtype=torch.int64)
    sources[slot.reshape(-1)] = rows
    sources[slot.reshape(-1) + 4] = rows
    return sources.to(device)


def skewed_codebook(codebooks: torch.Tensor, m_block: int) -> torch.Tensor:
    """[M, 256, 8] -> [2 * M * 256, 8]: two copies of the codebook, entry (m, k) of copy p in
    the slot kernels/maxsim_pq._skewed_slot reads it from for tokens of parity p. A copy puts
    each sub-quantizer's entries in one 16-byte bank group (of 8), so the gathers one
    quarter-warp issues together do not collide."""
    M, _, sub_dim = codebooks.shape
    sources = _skewed_sources(M, m_block, codebooks.device)
    return codebooks.reshape(-1, sub_dim).index_select(0, sources)


def _launch(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
            query_lengths, num_out_docs, config):
    def launch(Q_chunk, chunk_lengths):
        return _launch_kernel(Q_chunk, pq_codes, offsets, codebooks, pids, centroid_codes,
                              centroids, inv_norms, chunk_lengths, num_out_docs, config)

    return launch_in_query_chunks(Q3, query_lengths, num_out_docs, launch)


SCORING = ("decode", "lut", "mma")
LUT_ROWS = (4, 8, 16, 32)


def _launch_lut(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
                query_lengths, num_out_docs, cfg):
    """Lookup-table scoring: tables of each tile of cfg.lut_rows query rows, one program per
    (row tile, chunk of documents), row tiles summed per query here."""
    if (cfg.persistent or cfg.word_gather or cfg.gather_bytes is not None
            or cfg.shared_codebook or cfg.stream_tiles or cfg.independent_warps):
        raise ValueError("config.scoring='lut' takes no persistent grid, word_gather, "
                         "gather_bytes, shared_codebook, stream_tiles or independent_warps "
                         "(those are the decode kernel's)")
    if cfg.lut_rows not in LUT_ROWS:
        raise ValueError(f"config.lut_rows must be one of {LUT_ROWS}, got {cfg.lut_rows}")
    B, Lq, dim = Q3.shape
    M, _, sub_dim = codebooks.shape
    rows = cfg.lut_rows
    tiles = triton.cdiv(Lq, rows)
    padded = tiles * rows
    device = Q3.device
    Q_padded = torch.zeros(B, padded, dim, dtype=torch.float64, device=device)
    Q_padded[:, :Lq] = Q3.double()
    # [B * tiles, M * 256, rows], in float64 then fp32: the query's own precision, whatever
    # torch's TF32 settings.
    lut = torch.einsum("btrmj,mkj->btmkr", Q_padded.view(B, tiles, rows, M, sub_dim),
                       codebooks.double())
    lut = lut.reshape(B * tiles, M * CODEBOOK_SIZE, rows).float().contiguous()
    token = torch.arange(padded, device=device)
    lengths = (query_lengths.to(device) if query_lengths is not None
               else torch.full((B,), Lq, device=device))
    row_valid = (token[None, :] < lengths[:, None]).to(torch.int32).reshape(-1)
    row_query = (torch.arange(B, device=device)[:, None] * Lq
                 + token.clamp(max=Lq - 1)[None, :]).to(torch.int32).reshape(-1)
    use_table = centroid_codes is not None
    scores_table = query_centroid_scores(Q3, centroids) if use_table else None
    partial = torch.empty(B * tiles, num_out_docs, dtype=torch.float32, device=device)
    shared_reasons = (pq_lut_shared.reasons_not_to_apply(Q3, M, rows)
                      if cfg.lut_shared is not False else None)
    if cfg.lut_shared and shared_reasons:
        raise ValueError("config.lut_shared=True does not cover: " + "; ".join(shared_reasons))
    if cfg.lut_shared is not False and not shared_reasons:
        pq_lut_shared.launch(lut, pq_codes, offsets, pids, centroid_codes, scores_table,
                             inv_norms, row_query, row_valid, partial, rows,
                             grab=cfg.docs_per_program)
        return partial.view(B, tiles, num_out_docs).sum(1)
    dummy = partial
    grid = (B * tiles * triton.cdiv(num_out_docs, cfg.docs_per_program),)
    _maxsim_pq_lut_kernel[grid](
        lut, pq_codes, offsets, pids if pids is not None else dummy,
        centroid_codes if use_table else dummy, scores_table if use_table else dummy,
        inv_norms if inv_norms is not None else dummy, row_query, row_valid, partial,
        num_out_docs, M, B * tiles, pq_codes.stride(0),
        scores_table.stride(0) if use_table else 0, partial.stride(0), partial.stride(1),
        BLOCK_T=cfg.block_t, M_PAD=_pow2(M), LQ_TILE=rows, DOCS_PER_PROGRAM=cfg.docs_per_program,
        HAS_PIDS=pids is not None, CENTROID_TABLE=use_table,
        PRECOMPUTED_NORMS=inv_norms is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return partial.view(B, tiles, num_out_docs).sum(1)


def _grid_with_staged_codebook(kernel, grid, num_chunks, ptx_loads, codebooks, args, constants):
    """(programs, shared-memory offset of the codebook) of a launch: with the codebook staged
    in shared memory, as many programs as fit by shared memory (its bytes reserved past the
    kernel's own, ops/launch.prepare_shared_buffer), and no more than num_chunks unless it is
    None; otherwise grid and 0."""
    if ptx_loads != PTX_FROM_SHARED.value:
        return grid, 0
    book_bytes = codebooks.numel() * codebooks.element_size()
    try:
        book_offset, per_sm = prepare_shared_buffer(kernel, book_bytes, "book_shared_offset",
                                                    *args, **constants)
    except ValueError as error:  # the codebook does not fit (d = 384: 192 KB)
        raise ValueError(f"config.shared_codebook=True: {error}") from None
    programs = per_sm * torch.cuda.get_device_properties(codebooks.device).multi_processor_count
    return (programs if num_chunks is None else min(num_chunks, programs)), book_offset


def _launch_kernel(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
                   query_lengths, num_out_docs, config):
    B, Lq, dim = Q3.shape
    num_subquantizers, _, sub_dim = codebooks.shape
    cfg = config or default_pq_config(B, Lq, num_out_docs, Q3.element_size(),
                                      num_subquantizers, sub_dim)
    if cfg.scoring not in SCORING:
        raise ValueError(f"config.scoring must be one of {SCORING}, got {cfg.scoring!r}")
    if cfg.scoring == "lut":
        return _launch_lut(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids,
                           inv_norms, query_lengths, num_out_docs, cfg)
    if cfg.scoring == "mma":
        pq_mma.check_applies(Q3, pq_codes, codebooks, centroid_codes, inv_norms)
        if not 1 <= cfg.mma_warps <= pq_mma.MAX_WARPS:
            raise ValueError(f"config.mma_warps must be in [1, {pq_mma.MAX_WARPS}], "
                             f"got {cfg.mma_warps}")
        return pq_mma.launch_pq_mma(Q3, pq_codes, offsets, codebooks, pids, query_lengths,
                                    num_out_docs, grab=cfg.docs_per_program,
                                    warps=cfg.mma_warps, chains=cfg.mma_chains)
    out = torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    for name in ("block_t", "block_t_tail"):
        value = getattr(cfg, name)
        if value < MIN_DOT_DIM or value & (value - 1):
            raise ValueError(f"config.{name} must be a power of two >= {MIN_DOT_DIM}, got {value}")
    if cfg.maxnreg is not None and not MIN_MAXNREG <= cfg.maxnreg <= MAX_MAXNREG:
        raise ValueError(f"config.maxnreg must be None or in [{MIN_MAXNREG}, {MAX_MAXNREG}], "
                         f"got {cfg.maxnreg}")
    if cfg.block_d not in (None, 32, 64, MAX_BLOCK_D):
        raise ValueError(f"config.block_d must be None, 32, 64 or {MAX_BLOCK_D}, got {cfg.block_d}")
    m_block, num_m_blocks, dsub_pad = subquantizer_blocking(num_subquantizers, sub_dim,
                                                            cfg.block_d or MAX_BLOCK_D)
    if cfg.independent_warps:
        return _launch_warps(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, inv_norms,
                             query_lengths, num_out_docs, cfg, m_block, num_m_blocks)
    lq = _pow2(Lq)
    queries_per_block = max(cfg.queries_per_block, triton.cdiv(MIN_DOT_DIM, lq))
    num_qblocks = triton.cdiv(B, queries_per_block)
    use_table = centroid_codes is not None
    scores_table = query_centroid_scores(Q3, centroids) if use_table else None
    held_query = _hold_query(cfg, Q3.dtype, lq * queries_per_block, m_block * dsub_pad)
    words, gather_bytes = _word_gather(cfg, Q3, pq_codes, codebooks, num_subquantizers,
                                       sub_dim, m_block, held_query)
    book_in_shared = _shared_codebook(cfg, words)
    stream_tiles, decode_ahead = _stream_tiles(cfg, words, num_m_blocks)
    book_copies = 2 if _skewed_codebook(cfg, gather_bytes, sub_dim, held_query,
                                        book_in_shared) else 1
    if book_copies == 2:
        codebooks = skewed_codebook(codebooks, m_block)
    ptx_loads = 0
    if words and not interpreting() and cfg.ptx_loads is not False:
        ptx_loads = (PTX_FROM_SHARED if book_in_shared else PTX_FROM_GLOBAL).value
    dummy = out
    num_chunks = triton.cdiv(num_out_docs, cfg.docs_per_program)
    grid, counter = document_grid(cfg, num_chunks, num_qblocks, queries_per_block, B, Q3.device)
    args = (
        Q3, pq_codes, offsets,
        pids if pids is not None else dummy,
        codebooks,
        centroid_codes if use_table else dummy,
        inv_norms if inv_norms is not None else dummy,
        scores_table if use_table else dummy,
        query_lengths if query_lengths is not None else dummy,
        out, counter if counter is not None else dummy,
        num_out_docs, B, Lq, num_subquantizers, num_qblocks, num_chunks,
        Q3.stride(0), Q3.stride(1), Q3.stride(2),
        pq_codes.stride(0) // WORD_BYTES if words else pq_codes.stride(0),
        scores_table.stride(0) if use_table else 0,
        out.stride(0), out.stride(1),
    )
    constants = dict(
        LQ=lq, QUERIES_PER_BLOCK=queries_per_block,
        BLOCK_T=cfg.block_t, BLOCK_T_TAIL=cfg.block_t_tail,
        M_BLOCK=m_block, NUM_M_BLOCKS=num_m_blocks, DSUB=sub_dim, DSUB_PAD=dsub_pad,
        DOCS_PER_PROGRAM=cfg.docs_per_program,
        HAS_PIDS=pids is not None, HAS_QUERY_LENGTHS=query_lengths is not None,
        CENTROID_TABLE=use_table, PRECOMPUTED_NORMS=inv_norms is not None,
        INPUT_PRECISION=dot_precision(Q3.dtype), UPCAST=interpreter_upcast(Q3.dtype),
        WORD_GATHER=words, PTX_LOADS=ptx_loads,
        GATHER_BYTES=gather_bytes,
        HOLD_QUERY=held_query,
        PIPELINE_CODES=_pipeline_codes(cfg, words, num_m_blocks),
        REDUCE_PER_TILE=cfg.reduce_per_tile,
        BOOK_COPIES=book_copies,
        STREAM_TILES=stream_tiles, DECODE_AHEAD=decode_ahead,
        PERSISTENT=cfg.persistent,
        PREFETCH=0 if interpreting() else cfg.prefetch,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
    )
    grid, book_offset = _grid_with_staged_codebook(_maxsim_pq_kernel, grid, num_chunks,
                                                   ptx_loads, codebooks, args, constants)
    _maxsim_pq_kernel[(grid,)](*args, book_shared_offset=book_offset, **constants)
    return out


def _launch_warps(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, inv_norms,
                  query_lengths, num_out_docs, cfg, m_block, num_m_blocks):
    """maxsim_pq with independent warps sharing one codebook (kernels/maxsim_pq_warps.py)."""
    B, Lq, _ = Q3.shape
    num_subquantizers, _, sub_dim = codebooks.shape
    words, gather_bytes = _word_gather(cfg, Q3, pq_codes, codebooks, num_subquantizers, sub_dim,
                                       m_block, True)
    if not (words and num_m_blocks == 1 and B == 1 and centroid_codes is None
            and inv_norms is None and cfg.persistent):
        raise ValueError(
            f"config.independent_warps=True needs word gathers, one chunk of sub-quantizers "
            f"(block_d covering d), one query, PQ codes of embeddings (no centroid codes or "
            f"inverse norms) and a persistent grid; got word gathers {'on' if words else 'off'}, "
            f"{num_m_blocks} chunks, {B} queries, centroid codes "
            f"{'given' if centroid_codes is not None else 'none'}, inverse norms "
            f"{'given' if inv_norms is not None else 'none'}, persistent={cfg.persistent}")
    num_tokens = pq_codes.shape[0]
    if max(num_tokens, num_out_docs + cfg.num_warps * cfg.docs_per_program) > INT32_ROWS:
        raise ValueError(
            f"config.independent_warps=True addresses token rows and documents in int32: got "
            f"{num_tokens} token rows and {num_out_docs} documents, more than {INT32_ROWS}")
    book_in_shared = _shared_codebook(cfg, words)
    book_copies = 2 if _skewed_codebook(cfg, gather_bytes, sub_dim, True, False) else 1
    if book_copies == 2:
        codebooks = skewed_codebook(codebooks, m_block)
    ptx_loads = 0
    if not interpreting() and cfg.ptx_loads is not False:
        ptx_loads = (PTX_FROM_SHARED if book_in_shared else PTX_FROM_GLOBAL).value
    out = torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    counter = torch.zeros(1, dtype=torch.int32, device=Q3.device)
    docs_per_chunk = cfg.num_warps * cfg.docs_per_program
    constants = dict(
        LQ=max(_pow2(Lq), MIN_DOT_DIM), BLOCK_T=cfg.block_t, M_BLOCK=m_block, DSUB=sub_dim,
        WARPS=cfg.num_warps, CHUNK_BLOCK=triton.next_power_of_2(docs_per_chunk),
        HAS_PIDS=pids is not None, HAS_QUERY_LENGTHS=query_lengths is not None,
        INPUT_PRECISION=dot_precision(Q3.dtype), UPCAST=interpreter_upcast(Q3.dtype),
        PTX_LOADS=ptx_loads, GATHER_BYTES=gather_bytes, BOOK_COPIES=book_copies,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg)

    def launch_args(num_chunks, chunk_docs):
        return (Q3, pq_codes, offsets, pids if pids is not None else out, codebooks,
                query_lengths if query_lengths is not None else out, out, counter,
                num_out_docs, Lq, num_subquantizers, num_chunks, chunk_docs,
                Q3.stride(1), Q3.stride(2), pq_codes.stride(0) // WORD_BYTES, out.stride(1))

    # Programs resident at once, then chunks of at most docs_per_chunk documents, equal in
    # size and a whole number per program, so that the grid ends with every program busy. The
    # placeholder chunking compiles the kernel that runs: it is not specialized on chunking.
    programs, book_offset = _grid_with_staged_codebook(
        _maxsim_pq_warps_kernel, persistent_programs(Q3.device), None, ptx_loads, codebooks,
        launch_args(3, 3), constants)
    rounds = triton.cdiv(num_out_docs, programs * docs_per_chunk)
    chunk_docs = triton.cdiv(num_out_docs, min(programs * rounds, num_out_docs))
    num_chunks = triton.cdiv(num_out_docs, chunk_docs)
    grid = min(num_chunks, programs)
    args = launch_args(num_chunks, chunk_docs)
    _maxsim_pq_warps_kernel[(grid,)](*args, book_shared_offset=book_offset, **constants)
    return out


def maxsim_pq(
    Q: torch.Tensor,
    pq_codes: torch.Tensor,
    offsets: torch.Tensor,
    codebooks: torch.Tensor,
    pids: torch.Tensor | None = None,
    *,
    centroid_codes: torch.Tensor | None = None,
    centroids: torch.Tensor | None = None,
    inv_norms: torch.Tensor | None = None,
    query_lengths: torch.Tensor | None = None,
    config: PQConfig | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Exact MaxSim over product-quantization codes (``codecs.PQCodec``), without decoding to memory.

        score[b, n] = sum_i max_t <Q[b, i], s_t * (centroids[centroid_codes[t]] + pq_decode(pq_codes[t]))>

    Args:
        Q: [B, Lq, d] or [Lq, d], fp16 / bf16 / fp32.
        pq_codes: uint8 [T, M], one byte per sub-quantizer, rows contiguous in M.
        offsets: int64 [N+1]; document n owns tokens ``offsets[n]:offsets[n+1]``.
        codebooks: float [M, 256, d / M] (``PQCodec.codebooks``); rounded to Q's dtype once per
            call for the tensor cores (256 * d values), or multiplied with the query in
            float64 into fp32 lookup tables (``config.scoring="lut"``).
        pids: optional int32/int64 [M']: score only these documents, in place. Default: all N.
        centroid_codes: optional int32/int64 [T]: the PQ codes quantize residuals from these
            centroids (PLAID's codes); needs ``centroids``. Their part of the score comes from a
            per-batch [C, B*Lq] fp32 table.
        centroids: float [C, d] with ``centroid_codes``.
        inv_norms: optional float [T] scale per token (``PQCodec.inverse_norms``), e.g. to
            score normalized decoded vectors.
        query_lengths: optional int32/int64 [B] (3-D Q only).
        config: a fixed :class:`PQConfig`.
        validate: check values (offsets, pids, codes); these checks sync with the device.

    Returns:
        fp32 [B, M'] (or [M'] for a 2-D Q). An empty document scores -inf, an empty query 0.
    """
    checks.check_query(Q)
    dim = Q.shape[-1]
    checks.check_tensor("pq_codes", pq_codes, dims=(2,), dtypes=(torch.uint8,), device=Q.device)
    checks.check_tensor("codebooks", codebooks, dims=(3,), dtypes=checks.FLOAT_DTYPES,
                        device=Q.device)
    checks.check_tensor("offsets", offsets, dims=(1,), dtypes=(torch.int64,), device=Q.device)
    num_subquantizers = codebooks.shape[0]
    if codebooks.shape[1] != CODEBOOK_SIZE or num_subquantizers * codebooks.shape[2] != dim:
        raise ValueError(
            f"codebooks must be [M, {CODEBOOK_SIZE}, d/M] with d={dim}, got {checks.describe(codebooks)}"
        )
    if pq_codes.shape[1] != num_subquantizers or pq_codes.stride(1) != 1:
        raise ValueError(
            f"pq_codes must be [T, M={num_subquantizers}] with contiguous rows, got "
            f"{checks.describe(pq_codes)}, strides {pq_codes.stride()}"
        )
    if offsets.numel() < 1:
        raise ValueError("offsets must have N+1 >= 1 entries (offsets[0] = 0)")
    num_tokens = pq_codes.shape[0]
    if (centroid_codes is None) != (centroids is None):
        raise ValueError("centroid_codes and centroids go together (PQ codes of PLAID residuals)")
    if centroid_codes is not None:
        checks.check_tensor("centroid_codes", centroid_codes, dims=(1,), dtypes=checks.INDEX_DTYPES,
                            device=Q.device)
        checks.check_tensor("centroids", centroids, dims=(2,), dtypes=checks.FLOAT_DTYPES,
                            device=Q.device)
        checks.check_same_dim("centroids", centroids, Q)
        if centroid_codes.shape[0] != num_tokens:
            raise ValueError(f"centroid_codes must have T={num_tokens} entries, got "
                             f"{checks.describe(centroid_codes)}")
    if inv_norms is not None:
        checks.check_tensor("inv_norms", inv_norms, dims=(1,), dtypes=checks.FLOAT_DTYPES,
                            device=Q.device)
        if inv_norms.shape[0] != num_tokens:
            raise ValueError(f"inv_norms must have T={num_tokens} entries, got {checks.describe(inv_norms)}")
    num_docs = offsets.numel() - 1
    if pids is not None:
        checks.check_tensor("pids", pids, dims=(1,), dtypes=checks.INDEX_DTYPES, device=Q.device)
    if validate:
        checks.check_query_lengths(query_lengths, Q)
        checks.check_offsets(offsets, num_tokens, Q.device)
        pids = checks.check_pids(pids, num_docs, Q.device)
        if centroid_codes is not None and centroid_codes.numel() and (
                int(centroid_codes.min()) < 0 or int(centroid_codes.max()) >= centroids.shape[0]):
            raise ValueError(f"centroid_codes must lie in [0, C={centroids.shape[0]})")
    Q3 = Q[None] if Q.dim() == 2 else Q
    num_out = pids.numel() if pids is not None else num_docs
    if config is None and num_out >= MANY_DOCS and not pq_mma.reasons_not_to_apply(
            Q3, pq_codes, codebooks, centroid_codes, inv_norms) and nvrtc.available():
        config = MMA_DEFAULT
    if config is None or config.scoring not in ("lut", "mma"):
        # Once per call for every query chunk: the decode kernel multiplies the codebooks in Q's
        # dtype (the lookup tables take them as given, in float64; the mma kernel rounds them
        # as it stages them).
        codebooks = codebooks.to(Q.dtype).contiguous()
        if codebooks.data_ptr() % (2 * WORD_BYTES):
            codebooks = codebooks.clone()  # word gathers read it as 4- or 8-byte words
    out = _launch(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
                  query_lengths, num_out, config)
    return out[0] if Q.dim() == 2 else out
