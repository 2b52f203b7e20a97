"""Host side of PLAID's candidate generation (stage 1): mark the documents of probed lists."""

from __future__ import annotations

import torch

from tilemaxsim_plaid.kernels.ivf_probe import _mark_probed_kernel
from tilemaxsim_plaid.ops.launch import cdiv

__all__ = ["mark_probed_documents"]

# List entries per program: lists hold tens to thousands of documents.
BLOCK = 256


def mark_probed_documents(bitmap: torch.Tensor, cells: torch.Tensor, ivf_offsets: torch.Tensor,
                          ivf_lengths: torch.Tensor, ivf_pids: torch.Tensor, max_list_length: int) -> None:
    """``bitmap[d] = True`` for every document ``d`` in the inverted list of any of ``cells``.

    One launch for what is otherwise a gather of every probed list padded to the longest and a
    scatter. No host sync: ``max_list_length`` (the longest list, a host constant of the index)
    sizes the grid, so the launch can be captured in a CUDA graph.

    Args:
        bitmap: [N] or longer bool, updated in place (other entries are left as they are).
        cells: [P] int64 probed centroid ids.
        ivf_offsets: [C+1] int64; list c is ``ivf_pids[ivf_offsets[c] : ivf_offsets[c] + ivf_lengths[c]]``.
        ivf_lengths: [C] int64.
        ivf_pids: [E] int32/int64 document ids.
        max_list_length: an upper bound of ``ivf_lengths``.
    """
    if bitmap.dtype != torch.bool or bitmap.dim() != 1:
        raise TypeError(f"bitmap must be a 1-D bool tensor, got {bitmap.dtype} {tuple(bitmap.shape)}")
    if cells.numel() == 0 or max_list_length <= 0:
        return
    grid = (cells.numel(), cdiv(max_list_length, BLOCK))
    _mark_probed_kernel[grid](cells, ivf_offsets, ivf_lengths, ivf_pids, bitmap.view(torch.int8), BLOCK=BLOCK)
