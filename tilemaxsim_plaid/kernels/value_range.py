"""The smallest and largest value of an integer tensor, for the ops' range checks on the GPU.

torch's ``aminmax`` of a whole 100k-entry tensor runs as one slow reduction, most of the cost of
checking a new pid list (results/PERFORMANCE_LOG.md, run 122); this kernel reads the tensor once
across the GPU and merges its blocks' results with atomics. With ``CLAMP`` it also writes the
tensor clamped into [lo, hi], what a launch takes while the check is judged after it (one pass
instead of a second kernel).
"""

import triton
import triton.language as tl

INT64_MAX = 2**63 - 1


@triton.jit
def _value_range_kernel(p_x, p_out, p_clamped, n, lo, hi, BLOCK: tl.constexpr,
                        CLAMP: tl.constexpr):
    """p_out[0] = min(p_out[0], min x), p_out[1] = max(p_out[1], max x) over this block; with
    CLAMP, p_clamped[i] = min(max(x[i], lo), hi) in x's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    raw = tl.load(p_x + offs, mask=mask, other=0)
    if CLAMP:
        tl.store(p_clamped + offs, tl.minimum(tl.maximum(raw, lo), hi).to(raw.dtype), mask=mask)
    # Lanes past n take element 0 (n >= 1), which moves neither the min nor the max.
    x = tl.where(mask, raw.to(tl.int64), tl.load(p_x).to(tl.int64))
    tl.atomic_min(p_out, tl.min(x, 0))
    tl.atomic_max(p_out + 1, tl.max(x, 0))
