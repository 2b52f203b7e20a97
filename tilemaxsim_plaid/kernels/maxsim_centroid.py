"""PLAID stages 2-3 as one kernel: centroid interaction over packed document codes."""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import max_nan, maximum_nan


@triton.jit
def _slot_score(p_centroid_scores, stride_cs_c, stride_cs_q, p_codes, p_offsets, p_pids, p_keep,
                p_valid, slot, Lq, unmatched, HAS_PIDS: tl.constexpr, HAS_KEEP: tl.constexpr,
                HAS_VALID: tl.constexpr, HAS_UNMATCHED: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_Q: tl.constexpr):
    """The score of candidate slot ``slot`` (see _centroid_interaction_kernel)."""
    if HAS_PIDS:
        doc = tl.load(p_pids + slot).to(tl.int64)
    else:
        doc = slot.to(tl.int64)
    start = tl.load(p_offsets + doc)
    end = tl.load(p_offsets + doc + 1)
    if HAS_VALID:
        # An unused slot walks an empty range instead of returning early: one exit path.
        end = tl.where(tl.load(p_valid + slot) != 0, end, start)

    offs_q = tl.arange(0, BLOCK_Q)
    mask_q = offs_q < Lq
    b_max = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < end
        b_codes = tl.load(p_codes + offs_t, mask=mask_t, other=0).to(tl.int64)  # [BLOCK_T]
        if HAS_KEEP:
            b_keep = tl.load(p_keep + b_codes, mask=mask_t, other=0)  # [BLOCK_T]
            mask_t = mask_t & (b_keep != 0)
        p_rows = p_centroid_scores + b_codes[:, None] * stride_cs_c + offs_q[None, :] * stride_cs_q
        b_scores = tl.load(
            p_rows, mask=mask_t[:, None] & mask_q[None, :], other=float("-inf")
        ).to(tl.float32)  # [BLOCK_T, BLOCK_Q]
        b_max = maximum_nan(b_max, max_nan(b_scores, 0))  # [BLOCK_Q]
    # where(), not a masked max: padded query columns must add 0, and 0 * -inf would be NaN.
    if HAS_UNMATCHED:
        unmatched_q = b_max == float("-inf")
        if HAS_VALID:
            unmatched_q = unmatched_q & (tl.load(p_valid + slot) != 0)
        b_max = tl.where(unmatched_q, unmatched, b_max)
    return tl.sum(tl.where(mask_q, b_max, 0.0), axis=0)


@triton.jit
def _centroid_interaction_kernel(
    p_centroid_scores,  # [C, Lq] fp16/fp32
    stride_cs_c,
    stride_cs_q,
    p_codes,  # [T] int32/int64 centroid id per packed token
    p_offsets,  # [N+1] int64
    p_pids,  # [M] int64 (unused when not HAS_PIDS)
    p_keep,  # [C] int8 (unused when not HAS_KEEP)
    p_valid,  # [M] int8 (unused when not HAS_VALID)
    p_num_used,  # [1] int32/int64: slots >= its value are unused (HAS_NUM_USED)
    p_out,  # [M] fp32
    num_slots,  # M
    Lq,
    unmatched,  # fp32 score of one query token with no kept document token (HAS_UNMATCHED)
    HAS_PIDS: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    HAS_VALID: tl.constexpr,
    HAS_UNMATCHED: tl.constexpr,
    HAS_NUM_USED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_FILL: tl.constexpr,
):
    """out[m] = Σ_i max_{t ∈ doc(m), keep[code_t]} centroid_scores[code_t, i]

    Without HAS_NUM_USED, one program per candidate slot m. With it, a fixed grid: the programs
    stride over the used slots m < num_used (each scored as below), then write -inf to the
    unused rest BLOCK_FILL at a time, so a fixed-capacity list costs what its used part does
    rather than one program per slot. A slot walks the document's tokens BLOCK_T at a time,
    gathers the BLOCK_Q-wide row of centroid scores of each token's code and keeps a running
    max per query token. Query columns >= Lq are masked out of the sum. A slot with no kept
    token, or whose valid flag is 0, gets -inf (every running max stays -inf); Lq = 0 gives 0.
    With HAS_UNMATCHED a valid slot's -inf maxima count as ``unmatched`` each instead (PLAID's
    score for a candidate none of whose tokens survives pruning); unused slots stay -inf.
    """
    if HAS_NUM_USED:
        program = tl.program_id(0).to(tl.int64)
        programs = tl.num_programs(0).to(tl.int64)
        used = tl.minimum(tl.maximum(tl.load(p_num_used).to(tl.int64), 0), num_slots)
        for slot in range(program, used, programs):
            total = _slot_score(p_centroid_scores, stride_cs_c, stride_cs_q, p_codes, p_offsets,
                                p_pids, p_keep, p_valid, slot, Lq, unmatched, HAS_PIDS, HAS_KEEP,
                                HAS_VALID, HAS_UNMATCHED, BLOCK_T, BLOCK_Q)
            tl.store(p_out + slot, total)
        for first in range(used + program * BLOCK_FILL, num_slots, programs * BLOCK_FILL):
            offs = first + tl.arange(0, BLOCK_FILL)
            tl.store(p_out + offs, tl.full([BLOCK_FILL], float("-inf"), tl.float32),
                     mask=offs < num_slots)
    else:
        slot = tl.program_id(0)
        total = _slot_score(p_centroid_scores, stride_cs_c, stride_cs_q, p_codes, p_offsets,
                            p_pids, p_keep, p_valid, slot, Lq, unmatched, HAS_PIDS, HAS_KEEP,
                            HAS_VALID, HAS_UNMATCHED, BLOCK_T, BLOCK_Q)
        tl.store(p_out + slot, total)


@triton.jit
def probe_tile(s, offs_c, offs_r, mask_c, mask, C, threshold, p_keep, p_block_max, p_block_arg,
               program, programs):
    """Stage 1's two reductions of one block of the centroid-score table, ``s`` [BLOCK_C,
    BLOCK_R] fp32 (rows offs_c, columns offs_r; ``mask`` marks the table's entries):

        keep[c] = max_i S[c, i] >= threshold      (the stage-2 pruning mask)
        block_max[i, p], block_arg[i, p] = max and first argmax of S[c, i] over this block's c

    with torch's NaN semantics: a row holding a NaN has a NaN max (kept never), and a NaN is the
    largest value of a column (its first NaN is the argmax). The reductions use explicit NaN
    flags, so they need no NaN-propagating max. Over the blocks, the first block holding a
    column's maximum (torch's argmax along block_max's contiguous rows) holds its first argmax.
    """
    s = tl.where(mask, s, float("-inf"))
    is_nan = s != s
    row_nan = tl.max(is_nan.to(tl.int32), axis=1)
    row_max = tl.max(tl.where(is_nan, float("-inf"), s), axis=1)
    keep = (row_max >= threshold) & (row_nan == 0)
    tl.store(p_keep + offs_c, keep.to(tl.int8), mask=mask_c)

    none = C  # past every row: the identity of the first-index minimum
    rows = tl.where(mask, offs_c[:, None], none)
    col_nan = tl.max(is_nan.to(tl.int32), axis=0)
    first_nan = tl.min(tl.where(is_nan, rows, none), axis=0)
    col_max = tl.max(tl.where(is_nan, float("-inf"), s), axis=0)
    # A column of only -inf has every row equal to its max: the first row, as torch's argmax.
    first_max = tl.min(tl.where((s == col_max[None, :]) & mask, rows, none), axis=0)
    out = offs_r * programs + program
    tl.store(p_block_max + out, tl.where(col_nan != 0, float("nan"), col_max))
    tl.store(p_block_arg + out, tl.where(col_nan != 0, first_nan, first_max).to(tl.int32))


@triton.jit
def _probe_centroids_kernel(
    p_centroid_scores,  # [C, R] fp16/fp32
    stride_cs_c,
    stride_cs_q,
    p_keep,  # [C] int8 out
    p_block_max,  # [BLOCK_R, programs] fp32 out
    p_block_arg,  # [BLOCK_R, programs] int32 out
    C,
    R,
    threshold,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """probe_tile over a table built elsewhere (cuBLAS), BLOCK_C rows a program."""
    program = tl.program_id(0)
    offs_c = program * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_r = tl.arange(0, BLOCK_R)
    mask_c = offs_c < C
    mask = mask_c[:, None] & (offs_r < R)[None, :]
    p_tile = p_centroid_scores + offs_c.to(tl.int64)[:, None] * stride_cs_c + offs_r[None, :] * stride_cs_q
    s = tl.load(p_tile, mask=mask, other=float("-inf")).to(tl.float32)  # [BLOCK_C, BLOCK_R]
    probe_tile(s, offs_c, offs_r, mask_c, mask, C, threshold, p_keep, p_block_max, p_block_arg,
               program, tl.num_programs(0))
