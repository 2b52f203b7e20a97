"""PLAID stage 1, the candidate set: mark every document of the probed inverted lists."""

import triton
import triton.language as tl


@triton.jit
def _mark_probed_kernel(
    p_cells,  # [P] int64 probed centroid ids
    p_ivf_offsets,  # [C+1] int64 start of each centroid's list in ivf_pids
    p_ivf_lengths,  # [C] int64
    p_ivf_pids,  # [E] int32 document ids, list after list
    p_bitmap,  # [>= N] int8, set to 1 for every listed document
    BLOCK: tl.constexpr,
):
    """Program (p, b) marks entries b*BLOCK .. (b+1)*BLOCK of list cells[p]. Documents in several
    probed lists are marked by each of them: the stores write the same byte, so order is moot."""
    cell = tl.load(p_cells + tl.program_id(0)).to(tl.int64)
    start = tl.load(p_ivf_offsets + cell)
    length = tl.load(p_ivf_lengths + cell)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < length
    docs = tl.load(p_ivf_pids + start + offs, mask=mask, other=0).to(tl.int64)
    tl.store(p_bitmap + docs, tl.full([BLOCK], 1, dtype=tl.int8), mask=mask)
