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


@triton.jit
def _offsets_stats_kernel(p_off, p_out, p_clamped, n, hi, BLOCK: tl.constexpr, CLAMP: tl.constexpr):
    """Over the steps off[i+1] - off[i] of this block (i < n - 1, n >= 2): p_out[2] += the
    number of negative steps, p_out[3] = max(p_out[3], the longest step); program 0 writes
    p_out[0] = off[0] and p_out[1] = off[n-1]. With CLAMP, p_clamped = off clamped into [0, hi]."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    here = tl.load(p_off + offs, mask=offs < n, other=0)
    if CLAMP:
        tl.store(p_clamped + offs, tl.minimum(tl.maximum(here, 0), hi), mask=offs < n)
    step_mask = offs < n - 1
    steps = tl.load(p_off + offs + 1, mask=step_mask, other=0) - here
    tl.atomic_add(p_out + 2, tl.sum(tl.where(step_mask & (steps < 0), 1, 0).to(tl.int64), 0))
    # Lanes past the last step take the first step, which moves no max.
    first_step = tl.load(p_off + 1) - tl.load(p_off)
    tl.atomic_max(p_out + 3, tl.max(tl.where(step_mask, steps, first_step), 0))
    if pid == 0:
        tl.store(p_out, tl.load(p_off))
        tl.store(p_out + 1, tl.load(p_off + n - 1))
