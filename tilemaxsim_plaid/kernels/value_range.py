"""The smallest and largest value of an integer tensor, for the ops' range checks on the GPU.

torch's ``aminmax`` of a whole 100k-entry tensor runs as one slow reduction, most of the cost of
checking a new pid list (results/PERFORMANCE_LOG.md, run 122); this kernel reads the tensor once
across the GPU and merges its blocks' results with atomics.
"""

import triton
import triton.language as tl

INT64_MAX = 2**63 - 1


@triton.jit
def _value_range_kernel(p_x, p_out, n, BLOCK: tl.constexpr):
    """p_out[0] = min(p_out[0], min x), p_out[1] = max(p_out[1], max x) over this block."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # Lanes past n take element 0 (n >= 1), which moves neither the min nor the max.
    x = tl.load(p_x + offs, mask=mask, other=0).to(tl.int64)
    x = tl.where(mask, x, tl.load(p_x).to(tl.int64))
    lo = tl.min(x, 0)
    hi = tl.max(x, 0)
    tl.atomic_min(p_out, lo)
    tl.atomic_max(p_out + 1, hi)
