"""A query's final candidate list sorted in one program: score descending, then pid ascending."""

import triton
import triton.language as tl


@triton.jit
def _sort_candidates_kernel(
    p_pids,  # [K] int64, each < 2**31
    p_scores,  # [K] fp32, not NaN
    p_valid,  # [K] int8 (unused when not HAS_VALID)
    p_out_pids,  # [K] int64
    p_out_scores,  # [K] fp32
    p_out_valid,  # [K] int8
    K,
    HAS_VALID: tl.constexpr,
    BLOCK: tl.constexpr,  # power of two >= K
):
    """Each slot becomes one int64 key, ``(order(score) << 31) | (2**31 - 1 - pid)``, where
    ``order`` maps fp32 bits to a non-negative integer with the same order as the floats; a
    bitonic ``tl.sort`` of the keys then orders by score and breaks ties by the smaller pid, and
    score and pid are decoded back from the key exactly. Unused slots get key -1: last, and
    written as pid 0, score -inf, valid 0."""
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    scores = tl.load(p_scores + offs, mask=mask, other=0.0)
    pids = tl.load(p_pids + offs, mask=mask, other=0)
    used = mask
    if HAS_VALID:
        used = used & (tl.load(p_valid + offs, mask=mask, other=0) != 0)
    bits = scores.to(tl.int32, bitcast=True).to(tl.int64)
    # Non-negative floats keep their bits; negative ones (bits < 0 as int32) are reflected below
    # them, so that a more negative float gets a smaller integer.
    order = tl.where(bits >= 0, bits, -2147483649 - bits) + 2147483648  # in [0, 2**32)
    keys = tl.where(used, (order << 31) | (2147483647 - pids), -1)
    keys = tl.sort(keys, 0, descending=True)
    kept = keys >= 0
    order = (keys >> 31) - 2147483648
    bits = tl.where(order >= 0, order, -2147483649 - order)
    out_scores = bits.to(tl.int32).to(tl.float32, bitcast=True)
    out_pids = 2147483647 - (keys & 2147483647)
    tl.store(p_out_pids + offs, tl.where(kept, out_pids, 0), mask=mask)
    tl.store(p_out_scores + offs, tl.where(kept, out_scores, float("-inf")), mask=mask)
    tl.store(p_out_valid + offs, kept.to(tl.int8), mask=mask)
