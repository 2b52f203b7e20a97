"""Fused MaxSim over PLAID residual codes: documents are decoded in registers, never in memory.

    score[b, n] = sum_i max_t <Q[b, i], e_t>,   e_t = (c[code_t] + w[bucket_t]) / ||c[code_t] + w[bucket_t]||

for the tokens t of document n (packed rows ``offsets[n]:offsets[n+1]``).

Where the time goes. At nbits = 2, d = 128 a token is 4 B of code + 32 B of residual bits (+4 B of
precomputed inverse norm): a 100k-document candidate set is ~0.3 GB, a few tens of microseconds
of HBM. What costs is turning bits into tensor-core operands, so the kernel is built to spend as
few instructions per embedding element as it can:

* Centroid part by table (CENTROID_TABLE). <q, c + r> / ||c + r|| = (<q, c> + <q, r>) * inv_norm.
  The host builds S = centroids @ Q^T once per query batch ([C, B*Lq] fp32, 8 MB for C = 65,536
  and one 32-token query: L2-resident) and the kernel gathers one contiguous row of S per token
  (128 B) instead of a 256-B centroid row, and never adds centroid and residual element by
  element. The dot product runs over residual weights only. Needs the per-token inverse norms
  (codecs/residual.residual_inverse_norms, computed once at index load).
* Centroid rows by gather (otherwise): the centroid row is gathered (the table sits in L2),
  added to the decoded residual in fp32 and rounded once to Q's dtype (the value colbert-ai's
  GPU path computes in fp16); the norm is accumulated from the same tile when no precomputed
  inverse norms are given. Used when S would not fit in L2 (many queries) or without norms.
* Bits to weights: a residual byte is loaded once and broadcast over its 8/nbits slots as a
  [BLOCK_T, BYTES, SLOTS] tensor, which reshapes to [BLOCK_T, BLOCK_D] in natural dimension
  order (dimension = byte * SLOTS + slot). For nbits <= 2 the weight is picked by a select tree
  on the field's bits, tested in place (``byte & (1 << shift)``) so no shift-and-mask is needed;
  the bit reversal of colbert-ai's layout is folded into the order of the 2**nbits weights on the
  host (codecs/residual.field_order_weights). nbits = 4 (a 15-select tree) gathers from the
  16-entry table instead: 64 bytes, one L1 line for the whole warp.
* Tiles: documents are walked in tiles of BLOCK_T tokens, then the remainder in tiles of
  BLOCK_T_TAIL, so a 70-token document decodes 80 rows rather than 128; d is walked in chunks of
  BLOCK_D (d = 384 is 3 x 128, d = 96 one masked 128 chunk or 3 x 32), never padded in memory.

Masking: a token past its document's end is -inf (never wins a max); a query row past its
query's length contributes 0. An empty document scores -inf, an empty query 0. Offsets and
token indices are int64.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import tile_dot
from tilemaxsim_plaid.kernels.maxsim_dense import _query_rows, _store_query_scores


@triton.jit
def _query_centroid_scores_kernel(
    p_centroids, p_q, p_out,
    num_centroids, num_rows, dim,
    stride_cc, stride_cd, stride_qr, stride_qd, stride_oc,
    BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """S[c, r] = <centroids[c], Q_rows[r]> in fp32.

    centroids: [C, d] (any float dtype; with UPCAST both sides are multiplied in fp32);
    Q_rows: [R, d] (all query tokens, flattened); S: [C, R].
    """
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    offs_c = pid_c.to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_c = offs_c < num_centroids
    mask_r = offs_r < num_rows
    acc = tl.zeros([BLOCK_C, BLOCK_R], tl.float32)
    for d0 in range(0, dim, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < dim
        # [BLOCK_R, BLOCK_D]
        b_q = tl.load(p_q + offs_r[:, None] * stride_qr + offs_d[None, :] * stride_qd,
                      mask=mask_r[:, None] & mask_d[None, :], other=0.0)
        # [BLOCK_C, BLOCK_D]
        b_c = tl.load(p_centroids + offs_c[:, None] * stride_cc + offs_d[None, :] * stride_cd,
                      mask=mask_c[:, None] & mask_d[None, :], other=0.0)
        # [BLOCK_C, BLOCK_D] @ [BLOCK_D, BLOCK_R] -> [BLOCK_C, BLOCK_R]
        if not UPCAST:
            b_c = b_c.to(b_q.dtype)
        acc += tile_dot(b_c, b_q, INPUT_PRECISION, UPCAST)
    tl.store(p_out + offs_c[:, None] * stride_oc + offs_r[None, :], acc,
             mask=mask_c[:, None] & mask_r[None, :])


@triton.jit
def _residual_weights(b_bytes, p_weights, w0, w1, w2, w3,
                      NBITS: tl.constexpr, SLOTS: tl.constexpr):
    """[BLOCK_T, BYTES] residual bytes (int32) -> [BLOCK_T, BYTES, SLOTS] bucket weights.

    Slot s of a byte is the field at bit ``8 - NBITS * (s + 1)``; w0..w3 (and p_weights) are the
    weights in field order, already in the dot dtype.
    """
    offs_s = tl.arange(0, SLOTS)
    shift = 8 - NBITS * (offs_s + 1)  # [SLOTS]
    b_bytes = b_bytes[:, :, None]  # [BLOCK_T, BYTES, 1]
    if NBITS == 1:
        bit0 = (b_bytes & (1 << shift)[None, None, :]) != 0
        return tl.where(bit0, w1, w0)
    elif NBITS == 2:
        bit0 = (b_bytes & (1 << shift)[None, None, :]) != 0
        bit1 = (b_bytes & (2 << shift)[None, None, :]) != 0
        return tl.where(bit1, tl.where(bit0, w3, w2), tl.where(bit0, w1, w0))
    else:
        field = (b_bytes >> shift[None, None, :]) & ((1 << NBITS) - 1)
        return tl.load(p_weights + field).to(w0.dtype)


@triton.jit
def _residual_tile_scores(
    t0, t_end, b_q0, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_codes, p_residuals, p_centroids, p_weights, p_inv_norms, p_centroid_scores,
    w0, w1, w2, w3,
    dim, stride_qb, stride_qt, stride_qd, stride_rt, stride_cc, stride_cd, stride_sc,
    NBITS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D_BLOCKS: tl.constexpr, CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """[BLOCK_T, BLOCK_Q] scores of tokens t0 .. t0+BLOCK_T (those at or past t_end are -inf)."""
    SLOTS: tl.constexpr = 8 // NBITS
    BYTES: tl.constexpr = BLOCK_D // SLOTS
    offs_t = t0 + tl.arange(0, BLOCK_T)
    mask_t = offs_t < t_end
    # [BLOCK_T]: streamed once, so keep them from evicting the L2-resident tables.
    codes = tl.load(p_codes + offs_t, mask=mask_t, other=0, eviction_policy="evict_first")
    codes = codes.to(tl.int64)
    if CENTROID_TABLE:
        # [BLOCK_T, BLOCK_Q]: row codes[t] of S, the <q, centroid> of every query row.
        acc = tl.load(p_centroid_scores + codes[:, None] * stride_sc + offs_col[None, :],
                      mask=mask_t[:, None] & mask_col[None, :], other=0.0,
                      eviction_policy="evict_last")
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_Q], tl.float32)
    sum_sq = tl.zeros([BLOCK_T], tl.float32)
    for kd in tl.static_range(NUM_D_BLOCKS):
        offs_d = kd * BLOCK_D + tl.arange(0, BLOCK_D)
        mask_d = offs_d < dim
        offs_byte = kd * BYTES + tl.arange(0, BYTES)
        # [BLOCK_T, BYTES]
        b_bytes = tl.load(p_residuals + offs_t[:, None] * stride_rt + offs_byte[None, :],
                          mask=mask_t[:, None] & (offs_byte[None, :] < dim // SLOTS), other=0,
                          eviction_policy="evict_first").to(tl.int32)
        # [BLOCK_T, BYTES, SLOTS] -> [BLOCK_T, BLOCK_D], dimension = byte * SLOTS + slot
        b_emb = tl.reshape(_residual_weights(b_bytes, p_weights, w0, w1, w2, w3, NBITS, SLOTS),
                           [BLOCK_T, BLOCK_D])
        if not CENTROID_TABLE:
            # [BLOCK_T, BLOCK_D], centroid rows from L2
            b_c = tl.load(p_centroids + codes[:, None] * stride_cc + offs_d[None, :] * stride_cd,
                          mask=mask_t[:, None] & mask_d[None, :], other=0.0,
                          eviction_policy="evict_last")
            b_sum = b_c.to(tl.float32) + b_emb.to(tl.float32)
            if not PRECOMPUTED_NORMS:
                b_sum = tl.where(mask_d[None, :], b_sum, 0.0)
                sum_sq += tl.sum(b_sum * b_sum, axis=1)
            b_emb = b_sum.to(b_q0.dtype)
        if NUM_D_BLOCKS == 1:
            b_q = b_q0
        else:
            # [BLOCK_Q, BLOCK_D]; masked dimensions are 0 here, which cancels any weight there.
            b_q = tl.load(p_q + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt
                          + offs_d[None, :] * stride_qd,
                          mask=mask_r[:, None] & mask_d[None, :], other=0.0)
        # [BLOCK_T, BLOCK_D] @ [BLOCK_D, BLOCK_Q] -> [BLOCK_T, BLOCK_Q]
        acc += tile_dot(b_emb, b_q, INPUT_PRECISION, UPCAST)
    if PRECOMPUTED_NORMS:
        inv_norm = tl.load(p_inv_norms + offs_t, mask=mask_t, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
    else:
        # F.normalize's eps: a zero embedding scores 0 rather than NaN.
        inv_norm = 1.0 / tl.maximum(tl.sqrt(sum_sq), 1e-12)
    scores = acc * inv_norm[:, None]
    return tl.where(mask_t[:, None], scores, float("-inf"))


@triton.jit
def _maxsim_residual_kernel(
    p_q, p_codes, p_residuals, p_offsets, p_pids, p_centroids, p_weights, p_inv_norms,
    p_centroid_scores, p_query_lengths, p_out,
    num_out_docs, num_queries, Lq, dim, num_qblocks,
    stride_qb, stride_qt, stride_qd, stride_rt, stride_cc, stride_cd, stride_sc,
    stride_ob, stride_on,
    NBITS: tl.constexpr, LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D_BLOCKS: tl.constexpr, DOCS_PER_PROGRAM: tl.constexpr,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Q: [B, Lq, d] (strides q*); codes: [T] int32/int64; residuals: [T, d*NBITS/8] uint8 (row
    stride stride_rt, bytes contiguous); offsets: int64 [N+1]; pids: [M] (else 0..M-1);
    centroids: [C, d]; weights: [2**NBITS] fp32 in field order; inv_norms: [T] float (when
    PRECOMPUTED_NORMS); centroid_scores S: [C, B*Lq] fp32, row stride stride_sc (when
    CENTROID_TABLE); query_lengths: [B]; out: fp32 [B, M]."""
    # Query blocks vary fastest: programs reading the same documents run side by side, so every
    # document byte after the first read comes from L2.
    pid = tl.program_id(0)
    pid_qblock = pid % num_qblocks
    pid_docs = pid // num_qblocks
    BLOCK_Q: tl.constexpr = QUERIES_PER_BLOCK * LQ

    offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    # Column of S for each query row (the table is [C, B * Lq], unpadded).
    offs_col = offs_b * Lq + offs_i
    mask_col = (offs_b < num_queries) & (offs_i < Lq)
    # [BLOCK_Q, BLOCK_D]: the first (for d <= BLOCK_D the only) chunk of the query block stays in
    # registers for every tile of every document of this program.
    offs_d0 = tl.arange(0, BLOCK_D)
    b_q0 = tl.load(p_q + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt
                   + offs_d0[None, :] * stride_qd,
                   mask=mask_r[:, None] & (offs_d0[None, :] < dim), other=0.0)
    dot_dtype = b_q0.dtype
    w0 = tl.load(p_weights).to(dot_dtype)
    w1 = tl.load(p_weights + 1).to(dot_dtype)
    w2 = tl.load(p_weights + 2 % (1 << NBITS)).to(dot_dtype)
    w3 = tl.load(p_weights + 3 % (1 << NBITS)).to(dot_dtype)

    for doc_step in range(DOCS_PER_PROGRAM):
        out_idx = pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step
        valid_doc = out_idx < num_out_docs
        if HAS_PIDS:
            doc = tl.load(p_pids + out_idx, mask=valid_doc, other=0).to(tl.int64)
        else:
            doc = out_idx
        start = tl.load(p_offsets + doc, mask=valid_doc, other=0)
        end = tl.load(p_offsets + doc + 1, mask=valid_doc, other=0)
        end = tl.where(valid_doc, end, start)
        full_end = start + ((end - start) // BLOCK_T) * BLOCK_T

        row_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        for t0 in range(start, full_end, BLOCK_T):
            scores = _residual_tile_scores(
                t0, end, b_q0, offs_b, offs_i, mask_r, offs_col, mask_col,
                p_q, p_codes, p_residuals, p_centroids, p_weights, p_inv_norms,
                p_centroid_scores, w0, w1, w2, w3,
                dim, stride_qb, stride_qt, stride_qd, stride_rt, stride_cc, stride_cd, stride_sc,
                NBITS, BLOCK_T, BLOCK_Q, BLOCK_D, NUM_D_BLOCKS, CENTROID_TABLE,
                PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST)
            row_max = tl.maximum(row_max, tl.max(scores, axis=0))
        for t0 in range(full_end, end, BLOCK_T_TAIL):
            scores = _residual_tile_scores(
                t0, end, b_q0, offs_b, offs_i, mask_r, offs_col, mask_col,
                p_q, p_codes, p_residuals, p_centroids, p_weights, p_inv_norms,
                p_centroid_scores, w0, w1, w2, w3,
                dim, stride_qb, stride_qt, stride_qd, stride_rt, stride_cc, stride_cd, stride_sc,
                NBITS, BLOCK_T_TAIL, BLOCK_Q, BLOCK_D, NUM_D_BLOCKS, CENTROID_TABLE,
                PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST)
            row_max = tl.maximum(row_max, tl.max(scores, axis=0))
        _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                            valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
