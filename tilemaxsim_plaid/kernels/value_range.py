"""Range statistics of integer tensors, for the ops' range checks on the GPU.

torch's ``aminmax`` of a whole 100k-entry tensor runs as one slow reduction, most of the cost of
checking a new pid list (results/validate/h200-935c094-profile); ``_stats_kernel`` reads the
tensor once across the GPU, each program walking every ``programs``-th block, and each program
writes its own partial result to ``p_out`` (no atomics, so ``p_out`` needs no starting values
and may be pinned host memory, which the host reads with no copy: ops/checks.py merges the
partials). With ``CLAMP`` it also writes the tensor clamped into [lo, hi], what a launch takes
while the check is judged after it (one pass instead of a second kernel).

One launch serves one or two checks (slots A and B: the first ``programs_a`` programs take A,
the rest B), so the two checks a call judges after its launch (an inference-mode index's
offsets and codes, a new pid list and query_lengths) cost one launch's host time, not two.
"""

import triton
import triton.language as tl

# What a slot computes (``KIND_A`` / ``KIND_B``; 0: no slot B).
RANGE = tl.constexpr(1)  # [min, max] of the values
OFFSETS = tl.constexpr(2)  # offsets' first and last entries, decreasing steps, longest step


@triton.jit
def _blocks(pid, programs, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """(first element, step) of program ``pid``'s walk over every ``programs``-th block: int64
    with WIDE (a tensor past 2**31 elements), else int32, which holds half the registers a lane
    spends on its indices."""
    if WIDE:
        start, step = pid.to(tl.int64) * BLOCK, programs.to(tl.int64) * BLOCK
    else:
        start, step = pid * BLOCK, programs * BLOCK
    return start, step


@triton.jit
def _range_part(p_x, p_out, p_clamped, n, lo, hi, pid, programs, BLOCK: tl.constexpr,
                CLAMP: tl.constexpr, WIDE: tl.constexpr):
    """p_out[2 * pid] = the min and p_out[2 * pid + 1] = the max (int64) of this program's
    blocks of x (n >= 1); with CLAMP, p_clamped[i] = min(max(x[i], lo), hi) in x's dtype. The
    running min and max stay in x's dtype (no int64 copy of every element)."""
    # Lanes past n take element 0, which moves neither the min nor the max.
    first = tl.load(p_x)
    low = tl.zeros([BLOCK], p_x.dtype.element_ty) + first
    high = low
    start, step = _blocks(pid, programs, BLOCK, WIDE)
    for block in range(start, n, step):
        offs = block + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(p_x + offs, mask=mask, other=first)
        if CLAMP:
            tl.store(p_clamped + offs, tl.minimum(tl.maximum(x, lo), hi).to(x.dtype), mask=mask)
        low = tl.minimum(low, x)
        high = tl.maximum(high, x)
    tl.store(p_out + 2 * pid, tl.min(low, 0).to(tl.int64))
    tl.store(p_out + 2 * pid + 1, tl.max(high, 0).to(tl.int64))


@triton.jit
def _offsets_part(p_off, p_out, p_clamped, n, hi, pid, programs, BLOCK: tl.constexpr,
                  CLAMP: tl.constexpr, WIDE: tl.constexpr):
    """Over the steps off[i+1] - off[i] (i < n - 1, n >= 2) of this program's blocks:
    p_out[2 + 2 * pid] = the number of negative steps, p_out[3 + 2 * pid] = the longest step;
    program 0 writes p_out[0] = off[0] and p_out[1] = off[n-1]. With CLAMP, p_clamped = off
    clamped into [0, hi]."""
    # Lanes past the last step take the first step, which moves no max.
    first_step = tl.load(p_off + 1) - tl.load(p_off)
    negative = tl.zeros([BLOCK], tl.int32)  # a lane counts at most one step a block
    longest = tl.full([BLOCK], 0, tl.int64) + first_step
    start, step = _blocks(pid, programs, BLOCK, WIDE)
    for block in range(start, n, step):
        offs = block + tl.arange(0, BLOCK)
        here = tl.load(p_off + offs, mask=offs < n, other=0)
        if CLAMP:
            tl.store(p_clamped + offs, tl.minimum(tl.maximum(here, 0), hi), mask=offs < n)
        step_mask = offs < n - 1
        steps = tl.load(p_off + offs + 1, mask=step_mask, other=0) - here
        negative += tl.where(step_mask & (steps < 0), 1, 0)
        longest = tl.maximum(longest, tl.where(step_mask, steps, first_step))
    tl.store(p_out + 2 + 2 * pid, tl.sum(negative.to(tl.int64), 0))
    tl.store(p_out + 3 + 2 * pid, tl.max(longest, 0))
    if pid == 0:
        tl.store(p_out, tl.load(p_off))
        tl.store(p_out + 1, tl.load(p_off + n - 1))


@triton.jit
def _slot(p_x, p_out, p_clamped, n, lo, hi, pid, programs, BLOCK: tl.constexpr,
          KIND: tl.constexpr, CLAMP: tl.constexpr, WIDE: tl.constexpr):
    if KIND == RANGE:
        _range_part(p_x, p_out, p_clamped, n, lo, hi, pid, programs, BLOCK, CLAMP, WIDE)
    else:
        _offsets_part(p_x, p_out, p_clamped, n, hi, pid, programs, BLOCK, CLAMP, WIDE)


@triton.jit(do_not_specialize=["programs_a"])
def _stats_kernel(pa_x, pa_out, pa_clamped, n_a, lo_a, hi_a, programs_a,
                  pb_x, pb_out, pb_clamped, n_b, lo_b, hi_b,
                  BLOCK: tl.constexpr, KIND_A: tl.constexpr, CLAMP_A: tl.constexpr,
                  KIND_B: tl.constexpr, CLAMP_B: tl.constexpr, WIDE: tl.constexpr = True):
    """Slot A's stats (``_range_part`` or ``_offsets_part`` by KIND_A) over programs
    [0, programs_a), slot B's over the rest (KIND_B = 0: no slot B, its arguments unread)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if KIND_B == 0:
        _slot(pa_x, pa_out, pa_clamped, n_a, lo_a, hi_a, pid, programs, BLOCK, KIND_A, CLAMP_A,
              WIDE)
    else:
        if pid < programs_a:
            _slot(pa_x, pa_out, pa_clamped, n_a, lo_a, hi_a, pid, programs_a, BLOCK,
                  KIND_A, CLAMP_A, WIDE)
        else:
            _slot(pb_x, pb_out, pb_clamped, n_b, lo_b, hi_b, pid - programs_a,
                  programs - programs_a, BLOCK, KIND_B, CLAMP_B, WIDE)
