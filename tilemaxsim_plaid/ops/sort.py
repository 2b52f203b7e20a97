"""Host side of the final candidate sort (kernels/sort_candidates.py)."""

from __future__ import annotations

import torch

from tilemaxsim_plaid.kernels.sort_candidates import _sort_candidates_kernel
from tilemaxsim_plaid.ops.launch import pow2
from tilemaxsim_plaid.ops.packed_lists import packed_triple

__all__ = ["MAX_SORTED_IN_ONE_PROGRAM", "sort_candidates"]

# One program sorts the whole list in registers; PLAID's final lists are ndocs // 4 long
# (64, 256 or 1024 at the k = 10, 100, 1000 defaults). Longer lists (reranks) use torch.sort.
MAX_SORTED_IN_ONE_PROGRAM = 4096


def sort_candidates(pids: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor | None):
    """``(pids, scores, valid)`` sorted by score (descending), ties by pid (ascending), unused
    slots last (as pid 0, score -inf, valid False), in one launch. The order is that of the
    floats' bit patterns, so -0.0 ranks just below +0.0; every value comes back bit for bit.

    Args:
        pids: [K] int64 document ids, each below 2**31.
        scores: [K] fp32, no NaN.
        valid: optional [K] bool; False marks an unused slot.

    Returns:
        Three new [K] tensors, int64 pids, fp32 scores and bool valid, laid out by
        :func:`tilemaxsim_plaid.ops.packed_lists.packed_triple` (one buffer).
    """
    K = pids.numel()
    if pids.dtype != torch.int64 or scores.dtype != torch.float32 or scores.shape != pids.shape:
        raise TypeError(f"pids must be int64 and scores fp32 of the same shape, got {pids.dtype} "
                        f"{tuple(pids.shape)} and {scores.dtype} {tuple(scores.shape)}")
    if not 0 < K <= MAX_SORTED_IN_ONE_PROGRAM:
        raise ValueError(f"sort_candidates sorts 1 to {MAX_SORTED_IN_ONE_PROGRAM} slots, got {K}")
    out_pids, out_scores, out_valid = packed_triple(K, pids.device)
    valid_arg = valid.view(torch.int8) if valid is not None else out_valid.view(torch.int8)
    block = pow2(K)
    _sort_candidates_kernel[(1,)](
        pids, scores, valid_arg, out_pids, out_scores, out_valid.view(torch.int8), K,
        HAS_VALID=valid is not None, BLOCK=block, num_warps=4 if block <= 1024 else 8,
    )
    return out_pids, out_scores, out_valid
