"""MaxSim over product-quantization codes by per-query lookup tables: the textbook PQ scorer.

    LUT[r, m, k] = <Q_row_r^(m), codebooks[m, k]>          (host, once per query batch, fp32)
    score[b, n]  = sum_i max_t s_t * (S[c_t, i] + sum_m LUT[i, m, pq_t[m]])

Per document token this sums M table entries for each query row, instead of decoding the token
and multiplying it on the tensor cores (kernels/maxsim_pq.py). A 32-token query's tables are
M * 256 * 32 * 4 B = 512 KB at M = 16, more than an SM holds, so they are tiled over query rows:
each program takes LQ_TILE rows (128 KB at 8 rows) and all M * 256 table rows of that tile stay
in L1 while it walks its documents; each query-row tile re-reads the codes (M bytes per token).
Triton cannot index shared memory at run-time addresses (tl.gather lowers to warp shuffles), so
the table is gathered with global loads that L1 serves: on Hopper L1 and shared memory are the
same on-chip memory. The tables held in shared memory proper are the CUDA kernel
kernels/maxsim_pq_lut_shared.cu (PQConfig.lut_shared; taken on a GPU where a tile fits).

It is the baseline, not a default: the table traffic per token (M * 4 B per query row) exceeds
the decode kernel's gathers (d * 2 B per token, for all query rows at once).

A program writes, for its LQ_TILE rows, sum over valid rows of the max over the document's
tokens; the host adds the row tiles of each query. Masking as everywhere: a token past its
document's end is -inf, a query row past its query's length adds 0; an empty document scores
-inf, an empty query 0.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import max_nan, maximum_nan, packed_doc_bounds

CODEBOOK_SIZE = tl.constexpr(256)


@triton.jit
def _lut_tile_scores(t0, t_end, offs_r, mask_rows, p_tile_lut, p_pq_codes, p_centroid_codes,
                     p_centroid_scores, p_inv_norms, num_subquantizers, stride_pt, stride_sc,
                     BLOCK_T: tl.constexpr, M_PAD: tl.constexpr, LQ_TILE: tl.constexpr,
                     CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr):
    """[BLOCK_T, LQ_TILE] scores of tokens t0 .. t0+BLOCK_T against the tile's query rows
    (-inf at or past t_end)."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    mask_t = offs_t < t_end
    offs_m = tl.arange(0, M_PAD)
    mask_m = offs_m < num_subquantizers
    offs_q = tl.arange(0, LQ_TILE)
    # [BLOCK_T, M_PAD]: one byte per sub-quantizer, streamed.
    codes = tl.load(p_pq_codes + offs_t.to(tl.int64)[:, None] * stride_pt + offs_m[None, :],
                    mask=mask_t[:, None] & mask_m[None, :], other=0,
                    eviction_policy="evict_first").to(tl.int32)
    # [BLOCK_T, M_PAD, LQ_TILE]: table row (m, code) holds the tile's LQ_TILE entries.
    rows = offs_m[None, :] * CODEBOOK_SIZE + codes
    entries = tl.load(p_tile_lut + rows[:, :, None] * LQ_TILE + offs_q[None, None, :],
                      mask=mask_m[None, :, None], other=0.0, eviction_policy="evict_last")
    scores = tl.sum(entries, axis=1)
    if CENTROID_TABLE:
        centroid = tl.load(p_centroid_codes + offs_t, mask=mask_t, other=0,
                           eviction_policy="evict_first").to(tl.int64)
        scores += tl.load(p_centroid_scores + centroid[:, None] * stride_sc + offs_r[None, :],
                          mask=mask_t[:, None] & mask_rows[None, :], other=0.0,
                          eviction_policy="evict_last")
    if PRECOMPUTED_NORMS:
        inv_norm = tl.load(p_inv_norms + offs_t, mask=mask_t, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
        scores = scores * inv_norm[:, None]
    return tl.where(mask_t[:, None], scores, float("-inf"))


@triton.jit
def _maxsim_pq_lut_kernel(
    p_lut, p_pq_codes, p_offsets, p_pids, p_centroid_codes, p_centroid_scores, p_inv_norms,
    p_row_query, p_row_valid, p_out,
    num_out_docs, num_subquantizers, num_row_tiles, stride_pt, stride_sc, stride_ot, stride_on,
    BLOCK_T: tl.constexpr, M_PAD: tl.constexpr, LQ_TILE: tl.constexpr,
    DOCS_PER_PROGRAM: tl.constexpr, HAS_PIDS: tl.constexpr, CENTROID_TABLE: tl.constexpr,
    PRECOMPUTED_NORMS: tl.constexpr,
):
    """lut: fp32 [num_row_tiles, M * 256, LQ_TILE] (tile-major, so a tile's table is one
    contiguous block); pq_codes: uint8 [T, M] (row stride stride_pt); offsets: int64 [N+1];
    pids: [M'] (else 0..M'-1); centroid_codes: [T] and S: fp32 [C, R] (R = padded query rows,
    row stride stride_sc) when CENTROID_TABLE; inv_norms: [T] when PRECOMPUTED_NORMS;
    row_query: int32 [R], the column of S of each padded row; row_valid: int32 [R], 1 for a row
    inside its query's length; out: fp32 [num_row_tiles, M'], per row tile the sum of its valid
    rows' maxima."""
    pid = tl.program_id(0)
    # Row tiles vary fastest: the programs reading the same documents run side by side.
    pid_tile = pid % num_row_tiles
    pid_docs = pid // num_row_tiles
    offs_rows = pid_tile * LQ_TILE + tl.arange(0, LQ_TILE)
    s_columns = tl.load(p_row_query + offs_rows)
    mask_rows = tl.load(p_row_valid + offs_rows) != 0
    p_tile_lut = p_lut + pid_tile.to(tl.int64) * (num_subquantizers * CODEBOOK_SIZE * LQ_TILE)
    for doc_step in range(DOCS_PER_PROGRAM):
        out_idx = pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step
        valid_doc, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs,
                                                  HAS_PIDS)
        row_max = tl.full([LQ_TILE], float("-inf"), tl.float32)
        for t0 in range(start, end, BLOCK_T):
            scores = _lut_tile_scores(t0, end, s_columns, mask_rows, p_tile_lut, p_pq_codes,
                                      p_centroid_codes, p_centroid_scores, p_inv_norms,
                                      num_subquantizers, stride_pt, stride_sc, BLOCK_T, M_PAD,
                                      LQ_TILE, CENTROID_TABLE, PRECOMPUTED_NORMS)
            row_max = maximum_nan(row_max, max_nan(scores, 0))
        # where(), not a multiply: 0 * -inf is NaN for an empty document.
        total = tl.sum(tl.where(mask_rows, row_max, 0.0), axis=0)
        tl.store(p_out + pid_tile * stride_ot + out_idx * stride_on, total, mask=valid_doc)
