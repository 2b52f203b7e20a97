"""Fused MaxSim over product-quantization codes, exact to the codec.

    score[b, n] = sum_i max_t <Q[b, i], x_t>,   x_t = s_t * (c[code_t] + concat_m codebooks[m, pq_t[m]])

where the centroid term is present when the PQ codes quantize PLAID residuals (CENTROID_TABLE)
and s_t is a per-token inverse norm when one is given (PRECOMPUTED_NORMS), else 1.

Why not per-query lookup tables in shared memory. The textbook PQ scorer builds, per query token,
a table LUT[m, k] = <q_m, codebooks[m, k]> and sums M table entries per (query token, doc
token). For ColBERT shapes that is the slower design on an H200:
* Table traffic. Per document token it reads M entries for each of the Lq query tokens:
  M * Lq * 2 B = 1 KB at M = 16, Lq = 32, and it adds them on the CUDA cores (M * Lq adds). The
  tables for one 32-token query are 16 * 256 * 32 * 2 B = 256 KB (M = 16): more than an SM's
  shared memory, so they would be tiled over query tokens and the codes re-read per tile.
* Triton cannot index shared memory at run-time addresses; a table gather is a global load
  served by L1, one lane per entry.
This kernel instead decodes the document tile in registers and lets the tensor cores do the
arithmetic: per token it gathers the M sub-vectors of the codebook (d * 2 B = 256 B in total,
4x less than the tables; the whole codebook is 256 * d * 2 B = 64 KB at d = 128, held in L1/L2
for the whole kernel) with one vectorised load of d/M contiguous elements per sub-quantizer, and
multiplies the [BLOCK_T, d] tile by the query block with tl.dot. HBM traffic is M bytes per
token (plus 4 for a centroid code and 4 for an inverse norm in residual mode); the bound is the
gathers' L1 throughput. The codebooks are rounded to Q's dtype once per call on the host, so the
result equals MaxSim over the codec's decoded vectors within that rounding.

Tile layout: a [BLOCK_T, M_BLOCK, DSUB_PAD] gather (sub-quantizer m, element k of its sub-vector)
reshapes to [BLOCK_T, M_BLOCK * DSUB_PAD]; the query tile is loaded with the same (m, k) ->
m * DSUB + k mapping and zeros where k >= DSUB or m >= M, so a sub-dimension that is not a power
of two (d = 96, M = 16: DSUB = 6) needs no padding in memory.

Masking as everywhere: a token past its document's end is -inf, a query row past its length adds
0; an empty document scores -inf, an empty query 0.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import packed_doc_bounds, tile_dot
from tilemaxsim_plaid.kernels.maxsim_dense import _query_rows, _store_query_scores


@triton.jit
def _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, kd, stride_qb, stride_qt, stride_qd,
                        num_subquantizers, M_BLOCK: tl.constexpr, DSUB: tl.constexpr,
                        DSUB_PAD: tl.constexpr):
    """[BLOCK_Q, M_BLOCK * DSUB_PAD] query columns in the order of a decoded PQ tile."""
    offs_m = kd * M_BLOCK + tl.arange(0, M_BLOCK)
    offs_k = tl.arange(0, DSUB_PAD)
    offs_d = tl.reshape(offs_m[:, None] * DSUB + offs_k[None, :], [M_BLOCK * DSUB_PAD])
    mask_d = tl.reshape((offs_m[:, None] < num_subquantizers) & (offs_k[None, :] < DSUB),
                        [M_BLOCK * DSUB_PAD])
    return tl.load(p_q + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt
                   + offs_d[None, :] * stride_qd,
                   mask=mask_r[:, None] & mask_d[None, :], other=0.0)


@triton.jit
def _pq_tile_scores(
    t0, t_end, b_q0, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
    num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
    BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, M_BLOCK: tl.constexpr,
    NUM_M_BLOCKS: tl.constexpr, DSUB: tl.constexpr, DSUB_PAD: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """[BLOCK_T, BLOCK_Q] scores of tokens t0 .. t0+BLOCK_T (those at or past t_end are -inf)."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    mask_t = offs_t < t_end
    if CENTROID_TABLE:
        codes = tl.load(p_centroid_codes + offs_t, mask=mask_t, other=0,
                        eviction_policy="evict_first").to(tl.int64)
        # [BLOCK_T, BLOCK_Q]: row codes[t] of S = centroids @ Q^T
        acc = tl.load(p_centroid_scores + codes[:, None] * stride_sc + offs_col[None, :],
                      mask=mask_t[:, None] & mask_col[None, :], other=0.0,
                      eviction_policy="evict_last")
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_Q], tl.float32)
    offs_k = tl.arange(0, DSUB_PAD)
    for kd in tl.static_range(NUM_M_BLOCKS):
        offs_m = kd * M_BLOCK + tl.arange(0, M_BLOCK)
        mask_m = offs_m < num_subquantizers
        # [BLOCK_T, M_BLOCK] one byte per sub-quantizer
        b_codes = tl.load(p_pq_codes + offs_t[:, None] * stride_pt + offs_m[None, :],
                          mask=mask_t[:, None] & mask_m[None, :], other=0,
                          eviction_policy="evict_first").to(tl.int32)
        # [BLOCK_T, M_BLOCK, DSUB_PAD]: codebooks[m, code] sub-vectors, contiguous in k
        p_sub = (p_codebooks + ((offs_m[None, :, None] * 256 + b_codes[:, :, None]) * DSUB
                                + offs_k[None, None, :]))
        b_sub = tl.load(p_sub, mask=mask_m[None, :, None] & (offs_k[None, None, :] < DSUB),
                        other=0.0, eviction_policy="evict_last")
        b_emb = tl.reshape(b_sub, [BLOCK_T, M_BLOCK * DSUB_PAD])
        if NUM_M_BLOCKS == 1:
            b_q = b_q0
        else:
            b_q = _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, kd, stride_qb, stride_qt,
                                      stride_qd, num_subquantizers, M_BLOCK, DSUB, DSUB_PAD)
        # [BLOCK_T, M_BLOCK * DSUB_PAD] @ [M_BLOCK * DSUB_PAD, BLOCK_Q] -> [BLOCK_T, BLOCK_Q]
        acc += tile_dot(b_emb.to(b_q0.dtype), b_q, INPUT_PRECISION, UPCAST)
    if PRECOMPUTED_NORMS:
        inv_norm = tl.load(p_inv_norms + offs_t, mask=mask_t, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
        acc = acc * inv_norm[:, None]
    return tl.where(mask_t[:, None], acc, float("-inf"))


@triton.jit
def _maxsim_pq_kernel(
    p_q, p_pq_codes, p_offsets, p_pids, p_codebooks, p_centroid_codes, p_inv_norms,
    p_centroid_scores, p_query_lengths, p_out,
    num_out_docs, num_queries, Lq, num_subquantizers, num_qblocks,
    stride_qb, stride_qt, stride_qd, stride_pt, stride_sc, stride_ob, stride_on,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr,
    M_BLOCK: tl.constexpr, NUM_M_BLOCKS: tl.constexpr, DSUB: tl.constexpr,
    DSUB_PAD: tl.constexpr, DOCS_PER_PROGRAM: tl.constexpr,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Q: [B, Lq, d = M*DSUB] (strides q*); pq_codes: [T, M] uint8 (row stride stride_pt);
    offsets: int64 [N+1]; pids: [M'] (else 0..M'-1); codebooks: [M, 256, DSUB] contiguous, Q's
    dtype; centroid_codes: [T] and S: [C, B*Lq] fp32 (row stride stride_sc) when CENTROID_TABLE;
    inv_norms: [T] when PRECOMPUTED_NORMS; query_lengths: [B]; out: fp32 [B, M']."""
    pid = tl.program_id(0)
    pid_qblock = pid % num_qblocks
    pid_docs = pid // num_qblocks
    BLOCK_Q: tl.constexpr = QUERIES_PER_BLOCK * LQ

    offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    offs_col = offs_b * Lq + offs_i
    mask_col = (offs_b < num_queries) & (offs_i < Lq)
    # [BLOCK_Q, M_BLOCK * DSUB_PAD]: stays in registers across every tile of the program.
    b_q0 = _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, 0, stride_qb, stride_qt, stride_qd,
                               num_subquantizers, M_BLOCK, DSUB, DSUB_PAD)

    for doc_step in range(DOCS_PER_PROGRAM):
        out_idx = pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step
        valid_doc, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs,
                                                  HAS_PIDS)
        full_end = start + ((end - start) // BLOCK_T) * BLOCK_T

        row_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        for t0 in range(start, full_end, BLOCK_T):
            scores = _pq_tile_scores(
                t0, end, b_q0, offs_b, offs_i, mask_r, offs_col, mask_col,
                p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
                num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
                BLOCK_T, BLOCK_Q, M_BLOCK, NUM_M_BLOCKS, DSUB, DSUB_PAD, CENTROID_TABLE,
                PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST)
            row_max = tl.maximum(row_max, tl.max(scores, axis=0))
        for t0 in range(full_end, end, BLOCK_T_TAIL):
            scores = _pq_tile_scores(
                t0, end, b_q0, offs_b, offs_i, mask_r, offs_col, mask_col,
                p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
                num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
                BLOCK_T_TAIL, BLOCK_Q, M_BLOCK, NUM_M_BLOCKS, DSUB, DSUB_PAD, CENTROID_TABLE,
                PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST)
            row_max = tl.maximum(row_max, tl.max(scores, axis=0))
        _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                            valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
