"""Host side of exact MaxSim over product-quantization codes: check inputs, pick a config, launch.

Three scorings (``PQConfig.scoring``), all exact to the codec's decoded vectors:

* ``"decode"`` (kernels/maxsim_pq.py, Triton): each document tile is decoded in registers from
  the codebook and multiplied with the query on the tensor cores. Every shape and dtype, GPU
  and CPU interpreter.
* ``"mma"`` (kernels/maxsim_pq_mma.cu, CUDA C++ by NVRTC; ops/pq_mma.py): the same decode with
  one codebook per block in shared memory and one document stream per warp. d = 128 as M = 16,
  fp16/bf16 queries, PQ codes of embeddings, a GPU of compute capability 8.0 or later.
* ``"lut"``: the textbook per-query lookup tables, built once per call in fp32 and summed per
  token, through L1 (kernels/maxsim_pq_lut.py) or held in shared memory (CUDA,
  kernels/maxsim_pq_lut_shared.cu). The baseline: on ColBERT shapes the tables' M * 4 B per
  query row and token cost more than decoding.

With ``config=None``: ``MMA_DEFAULT`` where "mma" applies and at least ``MANY_DOCS`` documents
are scored, else ``default_pq_config`` (decode). Inside the decode launch, the input decides,
not the config: word gathers and their width, the query held in registers (one-warp programs),
inline-PTX loads (on a GPU) and up to 128 decoded columns per product.
"""

from __future__ import annotations

import dataclasses

import torch

from tilemaxsim_plaid.kernels.maxsim_pq import _maxsim_pq_kernel
from tilemaxsim_plaid.kernels.maxsim_pq_lut import _maxsim_pq_lut_kernel
from tilemaxsim_plaid.ops import checks, nvrtc, pq_lut_shared, pq_mma
from tilemaxsim_plaid.ops.launch import (FLAG, NUM_STAGES, NUM_WARPS, OPTIONAL_FLAG, at_least,
                                         cdiv, check_config_fields, document_grid, dot_precision,
                                         interpreter_upcast, interpreting, launch_in_query_chunks,
                                         one_of, optional_range, pow2, power_of_two, scoring_op)
from tilemaxsim_plaid.ops.residual import MAX_MAXNREG, MIN_MAXNREG, query_centroid_scores
from tilemaxsim_plaid.triton_support import triton_version

__all__ = ["PQConfig", "MMA_DEFAULT", "check_config", "default_pq_config", "maxsim_pq"]

# Decoded columns per tensor-core product: M_BLOCK sub-quantizers of DSUB_PAD elements.
MAX_BLOCK_D = 128
MIN_DOT_DIM = 16
# PQ codes are bytes: 256 centroids per sub-quantizer.
CODEBOOK_SIZE = 256
# From this many scored documents on, one query is scored by a persistent grid of one-warp
# programs (default_pq_config), or by the mma kernel where it applies.
MANY_DOCS = 16384
# Word gathers read codes and codebooks as 32-bit words: 4 codes, or two 16-bit weights.
WORD_BYTES = 4
# Codebook bytes per gather: 2, 4 or 8 16-bit weights.
GATHER_BYTES = (4, 8, 16)
SCORING = ("decode", "lut", "mma")
LUT_ROWS = (4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class PQConfig:
    """One fixed launch configuration for :func:`maxsim_pq`.

    Every field is checked against CONFIG_FIELDS, and the scoring's own rules (check_config),
    before anything is scored (a ValueError naming it); whether a valid config applies to the
    input (pipeline_codes, persistent, lut_shared=True, mma) is judged at launch.

    Attributes:
        scoring: "decode", "mma" or "lut" (see the module docstring).
        block_t: tokens per main tile of a document, a power of two: >= 16 with decode (the
            tensor-core product's rows), any with lut (tables summed on the CUDA cores).
        block_t_tail: tokens per tile of a document's remainder, a power of two >= 16 (decode).
        queries_per_block: queries stacked into one tensor-core product, a power of two
            (decode).
        docs_per_program: documents a program walks (decode; with persistent, per chunk taken),
            or a warp (mma) or a block (lut in shared memory) takes per grab; at least 1.
        num_warps, num_stages: Triton launch parameters, a power of two and at least 1
            (decode, lut).
        persistent: decode on a fixed grid of programs that take chunks of docs_per_program
            documents from an atomic counter (ops.launch.document_grid); one query block only.
        maxnreg: a cap on registers per thread (ptx .maxnreg, MIN_MAXNREG..MAX_MAXNREG), or
            None for the compiler's choice (decode). Registers are allocated per scheduler,
            so a one-warp program's cap buys occupancy in steps: 128 fits 4 warps per
            scheduler, 144 and 168 fit 3.
        reduce_per_tile: reduce each full tile's scores over its tokens as it comes, instead of
            an elementwise running max reduced once per document: 32 fewer live registers per
            lane at 32 x 32 tiles, for a register cap (decode).
        pipeline_codes: load each full tile's code words while the tile before it is scored,
            hiding their HBM latency (decode; needs word gathers and all sub-quantizers in one
            chunk: d/M * M <= 128 decoded columns).
        lut_rows: with scoring="lut", query rows per table tile (4, 8, 16 or 32): a tile's
            table is M * 256 * lut_rows fp32 entries (128 KB at M = 16, 8 rows).
        lut_shared: with scoring="lut", hold each tile's table in a block's shared memory (the
            CUDA kernel) instead of reading it through L1 (the Triton kernel). None: wherever
            it applies (a GPU with NVRTC, a tile's table within a block's shared memory); True
            where it does not is refused.
    """

    scoring: str = "decode"
    block_t: int = 64
    block_t_tail: int = 16
    queries_per_block: int = 1
    docs_per_program: int = 4
    num_warps: int = 4
    num_stages: int = 2
    persistent: bool = False
    maxnreg: int | None = None
    reduce_per_tile: bool = False
    pipeline_codes: bool = False
    lut_rows: int = 8
    lut_shared: bool | None = None


# What each field of a PQConfig takes, whatever the scoring (ops.launch.check_config_fields);
# check_config adds each scoring's own rules. Tile sizes are tl.arange extents.
CONFIG_FIELDS = {
    "scoring": one_of(SCORING),
    "block_t": power_of_two(1),
    "block_t_tail": power_of_two(1),
    "queries_per_block": power_of_two(1),
    "docs_per_program": at_least(1),
    "num_warps": NUM_WARPS,
    "num_stages": NUM_STAGES,
    "persistent": FLAG,
    "maxnreg": optional_range(MIN_MAXNREG, MAX_MAXNREG),
    "reduce_per_tile": FLAG,
    "pipeline_codes": FLAG,
    "lut_rows": one_of(LUT_ROWS),
    "lut_shared": OPTIONAL_FLAG,
}
# Fields of the decode kernel alone, which scoring="lut" refuses when set.
DECODE_ONLY = ("persistent", "pipeline_codes", "reduce_per_tile", "maxnreg")


def check_config(cfg: PQConfig) -> None:
    """A ValueError naming the first field of ``cfg`` outside CONFIG_FIELDS' rules or its
    scoring's: decode's tiles are tensor-core products (block_t and block_t_tail >= 16); the
    lookup tables take none of the decode kernel's fields (DECODE_ONLY)."""
    check_config_fields(cfg, CONFIG_FIELDS)
    if cfg.scoring == "decode":
        for name in ("block_t", "block_t_tail"):
            value = getattr(cfg, name)
            if value < MIN_DOT_DIM:
                raise ValueError(f"config.{name} must be a power of two >= {MIN_DOT_DIM} with "
                                 f"scoring='decode', got {value}")
    decode_fields = [f"{name}={getattr(cfg, name)!r}" for name in DECODE_ONLY
                     if getattr(cfg, name) not in (False, None)]
    if cfg.scoring == "lut" and decode_fields:
        raise ValueError(f"config.scoring='lut' takes none of the decode kernel's fields "
                         f"{DECODE_ONLY}; got {', '.join(decode_fields)}")


# The default where scoring="mma" applies and at least MANY_DOCS documents are scored: 4
# documents per grab (1, 2 and 8 measured within 1 %: results/compressed/h200-pq-mma).
MMA_DEFAULT = PQConfig(scoring="mma", docs_per_program=4)



def default_pq_config(num_queries: int, Lq: int, num_docs: int = 0,
                      element_size: int = 2, num_subquantizers: int | None = None,
                      sub_dim: int | None = None) -> PQConfig:
    """The decode kernel's default launch for a shape (up to 64 query rows per block).

    * One query block of at most 32 rows, at least MANY_DOCS documents, 16-bit queries: one-warp
      programs of 32-token tiles on a persistent grid, 2 documents per chunk; they hold the
      query in registers, and with word gathers the decode of a tile is one product. At d = 128
      as M = 16 or 32 (16-byte or paired 8-byte codebook words), 4 documents per chunk, tiles
      reduced as they come under a cap of 128 registers (16 programs per SM), and at M = 16
      code words loaded a tile ahead.
    * Other shapes of at most 32 query rows: 32-token tiles, 16 documents per program, 2 warps.
    * Larger query blocks: 64-token tiles, 4 warps, 4 or 2 documents per program; with fp32
      queries 32-token tiles and one query per block, which fits a block's shared memory at any
      d (see FP32_QUERY_CHUNK).
    """
    lq = pow2(Lq)
    queries_per_block = max(1, min(pow2(num_queries), max(MIN_DOT_DIM, 64) // lq))
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
    if element_size == 4:
        return PQConfig(block_t=32, queries_per_block=1, docs_per_program=4)
    return PQConfig(queries_per_block=queries_per_block,
                    docs_per_program=4 if num_queries * lq <= 64 else 2)


def subquantizer_blocking(num_subquantizers: int, sub_dim: int) -> tuple[int, int, int]:
    """(M_BLOCK, NUM_M_BLOCKS, DSUB_PAD): sub-quantizers per decoded chunk of <= 128 columns."""
    dsub_pad = pow2(sub_dim)
    m_block = min(pow2(num_subquantizers), max(1, MAX_BLOCK_D // dsub_pad))
    m_block = max(m_block, cdiv(MIN_DOT_DIM, dsub_pad))
    return m_block, cdiv(num_subquantizers, m_block), dsub_pad


# The held query (_hold_query) from this triton release on: triton 3.3 fails to compile it
# (TritonGPURemoveLayoutConversions), and then the query is loaded per tile instead.
HOLD_QUERY_MIN_TRITON = (3, 4)


def _hold_query(num_warps: int, dtype: torch.dtype, block_q: int, chunk_cols: int) -> bool:
    """Whether the query chunks are held in the first operand's registers
    (kernels/maxsim_pq._hold_as_first_operand). One warp: with more, the products' layouts split
    rows over warps differently from the identity product's, and at 4 warps (wgmma) triton
    3.6 fails to compile it."""
    return (num_warps == 1 and dtype in (torch.float16, torch.bfloat16)
            and block_q % MIN_DOT_DIM == 0 and chunk_cols % MIN_DOT_DIM == 0
            and triton_version() >= HOLD_QUERY_MIN_TRITON)


def _word_gather(Q3, pq_codes, codebooks, num_subquantizers, sub_dim, m_block,
                 held_query) -> tuple[bool, int]:
    """(word gathers apply, codebook bytes per gather): the widest word that applies; 16-byte
    words only with the query held (without it they are no faster than 8-byte ones)."""
    words = (Q3.element_size() == 2 and sub_dim % 2 == 0 and sub_dim & (sub_dim - 1) == 0
             and m_block % 4 == 0 and num_subquantizers % m_block == 0
             and pq_codes.stride(0) % WORD_BYTES == 0 and pq_codes.data_ptr() % WORD_BYTES == 0
             and codebooks.data_ptr() % WORD_BYTES == 0)

    def wide_applies(gather_bytes):
        # Whole words per sub-vector and an aligned codebook; 16-byte words fill the operand's
        # 32-column groups (kernels/maxsim_pq._decode_pq_words), so a chunk is whole groups.
        return (words and sub_dim % (gather_bytes // 2) == 0
                and codebooks.data_ptr() % gather_bytes == 0
                and (gather_bytes < 16 or m_block * sub_dim % 32 == 0))

    widths = GATHER_BYTES if held_query else GATHER_BYTES[:-1]
    return words, next(g for g in widths[::-1] if g == WORD_BYTES or wide_applies(g))


def _pipeline_codes(cfg: PQConfig, words: bool, m_block: int, num_m_blocks: int) -> bool:
    """cfg.pipeline_codes, or a ValueError where it cannot apply."""
    if cfg.pipeline_codes and not (words and num_m_blocks == 1):
        raise ValueError(f"config.pipeline_codes=True needs word gathers (16-bit queries, an even "
                         f"power-of-two d/M, chunks of a multiple of 4 sub-quantizers, M a "
                         f"multiple of the chunk's sub-quantizer count, 4-byte aligned code "
                         f"rows) and all sub-quantizers in one chunk of <= {MAX_BLOCK_D} "
                         f"columns; got word gathers {'on' if words else 'off'}, "
                         f"{num_m_blocks} chunks of {m_block} sub-quantizers")
    return bool(cfg.pipeline_codes)


def _launch(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
            query_lengths, num_out_docs, config):
    def launch(Q_chunk, chunk_lengths):
        return _launch_kernel(Q_chunk, pq_codes, offsets, codebooks, pids, centroid_codes,
                              centroids, inv_norms, chunk_lengths, num_out_docs, config)

    return launch_in_query_chunks(Q3, query_lengths, num_out_docs, launch, config, check_config,
                                  _default_query_chunks(Q3) if config is None else None)


# Query tokens per launch of the default for fp32 queries: a block of more rows of fp32 chunks
# does not fit a block's shared memory at d >= 256; 32 rows do (static sm_90a
# compiles, experiments/sass_budget).
FP32_QUERY_CHUNK = 32


def _default_query_chunks(Q3: torch.Tensor) -> list[int] | None:
    """Query tokens per launch where the default splits a query that fits one launch: fp32
    queries past FP32_QUERY_CHUNK tokens, in chunks of that many (each launch reads the codes
    again)."""
    Lq = Q3.shape[1]
    if Q3.element_size() != 4 or Lq <= FP32_QUERY_CHUNK:
        return None
    return [FP32_QUERY_CHUNK] * (Lq // FP32_QUERY_CHUNK) + ([Lq % FP32_QUERY_CHUNK]
                                                            if Lq % FP32_QUERY_CHUNK else [])


def _launch_lut(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
                query_lengths, num_out_docs, cfg):
    """Lookup-table scoring: tables of each tile of cfg.lut_rows query rows, one program per
    (row tile, chunk of documents), row tiles summed per query here."""
    B, Lq, dim = Q3.shape
    M, _, sub_dim = codebooks.shape
    rows = cfg.lut_rows
    tiles = cdiv(Lq, rows)
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
    grid = (B * tiles * cdiv(num_out_docs, cfg.docs_per_program),)
    _maxsim_pq_lut_kernel[grid](
        lut, pq_codes, offsets, pids if pids is not None else dummy,
        centroid_codes if use_table else dummy, scores_table if use_table else dummy,
        inv_norms if inv_norms is not None else dummy, row_query, row_valid, partial,
        num_out_docs, M, B * tiles, pq_codes.stride(0),
        scores_table.stride(0) if use_table else 0, partial.stride(0), partial.stride(1),
        BLOCK_T=cfg.block_t, M_PAD=pow2(M), LQ_TILE=rows, DOCS_PER_PROGRAM=cfg.docs_per_program,
        HAS_PIDS=pids is not None, CENTROID_TABLE=use_table,
        PRECOMPUTED_NORMS=inv_norms is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return partial.view(B, tiles, num_out_docs).sum(1)


def _launch_kernel(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
                   query_lengths, num_out_docs, config):
    B, Lq, dim = Q3.shape
    num_subquantizers, _, sub_dim = codebooks.shape
    cfg = config or default_pq_config(B, Lq, num_out_docs, Q3.element_size(),
                                      num_subquantizers, sub_dim)
    if cfg.scoring == "lut":
        return _launch_lut(Q3, pq_codes, offsets, codebooks, pids, centroid_codes, centroids,
                           inv_norms, query_lengths, num_out_docs, cfg)
    if cfg.scoring == "mma":
        pq_mma.check_applies(Q3, pq_codes, codebooks, centroid_codes, inv_norms)
        return pq_mma.launch_pq_mma(Q3, pq_codes, offsets, codebooks, pids, query_lengths,
                                    num_out_docs, grab=cfg.docs_per_program)
    out = torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    m_block, num_m_blocks, dsub_pad = subquantizer_blocking(num_subquantizers, sub_dim)
    lq = pow2(Lq)
    queries_per_block = max(cfg.queries_per_block, cdiv(MIN_DOT_DIM, lq))
    num_qblocks = cdiv(B, queries_per_block)
    use_table = centroid_codes is not None
    scores_table = query_centroid_scores(Q3, centroids) if use_table else None
    held_query = _hold_query(cfg.num_warps, Q3.dtype, lq * queries_per_block,
                             m_block * dsub_pad)
    words, gather_bytes = _word_gather(Q3, pq_codes, codebooks, num_subquantizers, sub_dim,
                                       m_block, held_query)
    dummy = out
    num_chunks = cdiv(num_out_docs, cfg.docs_per_program)
    grid, counter = document_grid(cfg, num_chunks, num_qblocks, queries_per_block, B, Q3.device)
    _maxsim_pq_kernel[(grid,)](
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
        LQ=lq, QUERIES_PER_BLOCK=queries_per_block,
        BLOCK_T=cfg.block_t, BLOCK_T_TAIL=cfg.block_t_tail,
        M_BLOCK=m_block, NUM_M_BLOCKS=num_m_blocks, DSUB=sub_dim, DSUB_PAD=dsub_pad,
        DOCS_PER_PROGRAM=cfg.docs_per_program,
        HAS_PIDS=pids is not None, HAS_QUERY_LENGTHS=query_lengths is not None,
        CENTROID_TABLE=use_table, PRECOMPUTED_NORMS=inv_norms is not None,
        INPUT_PRECISION=dot_precision(Q3.dtype), UPCAST=interpreter_upcast(Q3.dtype),
        WORD_GATHER=words, PTX_LOADS=words and not interpreting(),
        GATHER_BYTES=gather_bytes, HOLD_QUERY=held_query,
        PIPELINE_CODES=_pipeline_codes(cfg, words, m_block, num_m_blocks),
        REDUCE_PER_TILE=cfg.reduce_per_tile, PERSISTENT=cfg.persistent,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
    )
    return out


@scoring_op
@checks.rerun_if_stale
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
        pq_codes: uint8 [T, M], one byte per sub-quantizer.
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
        config: a fixed :class:`PQConfig`; None: ``MMA_DEFAULT`` or ``default_pq_config``.
        validate: check values (offsets, pids, centroid_codes, query_lengths in range; no NaN
            or inf in codebooks, centroids or inv_norms; Q is not read) with one host sync per
            call, none when every checked tensor was checked before unchanged (same object and
            version: an index's offsets and codes are read once). A new offsets, pids,
            centroid_codes or query_lengths is judged after the launch, which reads it clamped
            into range (a document whose end is before its start is empty).

    Any strides: Q is read with its strides (the mma kernel copies it where its rows are not
    4-byte pairs). The other tensors are made contiguous here when they are not (a copy per call
    of that argument only; none for contiguous inputs): the kernels read offsets, pids,
    query_lengths, centroid_codes and inv_norms with unit stride and pq_codes, codebooks and
    centroids as dense rows.

    Returns:
        fp32 [B, M'] (or [M'] for a 2-D Q). An empty document scores -inf, an empty query 0.
        A NaN in Q, a codebook entry, a centroid or an inverse norm makes exactly the scores it
        touches NaN, as in torch; inf as torch gives it, except that an infinite inverse norm
        scales the token's products, not its vector (docs/kernels.md, NaN and inf).
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
    if pq_codes.shape[1] != num_subquantizers:
        raise ValueError(
            f"pq_codes must be [T, M={num_subquantizers}], got {checks.describe(pq_codes)}"
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
    checks.pids_shape(pids, Q.device)
    checks.query_lengths_shape(query_lengths, Q)
    batch = checks.DataChecks(provisional=True)
    if validate:
        checks.add_query_lengths(batch, query_lengths, Q, defer=True)
        # The launch takes none of these tensors' statistics: a new one waits until after it.
        batch.offsets(offsets, num_tokens, defer=True)
        batch.in_range("pids", pids, 0, num_docs, defer=True)
        if centroid_codes is not None:
            batch.in_range("centroid_codes", centroid_codes, 0, centroids.shape[0],
                           f"[0, C={centroids.shape[0]})", defer=True)
        for name, t in (("codebooks", codebooks), ("centroids", centroids),
                        ("inv_norms", inv_norms)):
            batch.finite(name, t)
        batch.run()
        pids, query_lengths = batch.safe("pids", pids), batch.safe("query_lengths", query_lengths)
        offsets = batch.safe("offsets", offsets)
        centroid_codes = batch.safe("centroid_codes", centroid_codes)
    pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms, query_lengths = (
        None if x is None else x.contiguous()
        for x in (pq_codes, offsets, codebooks, pids, centroid_codes, centroids, inv_norms,
                  query_lengths))
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
    batch.finish()
    return out[0] if Q.dim() == 2 else out
