"""A ranked list's pids, scores and valid flags back to back in one byte buffer.

A query's final list is cloned once per CUDA-graph replay and copied to the host once per query;
held as three views of one buffer, each of those is one operation instead of three.
"""

from __future__ import annotations

import torch

__all__ = ["BYTES_PER_SLOT", "packed_base", "packed_triple", "packed_views"]

BYTES_PER_SLOT = 8 + 4 + 1  # int64 pid, fp32 score, bool valid


def packed_views(buffer: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[K] int64 pids, [K] fp32 scores and [K] bool valid viewing a [13 * K] uint8 ``buffer``."""
    return (buffer[: 8 * K].view(torch.int64), buffer[8 * K : 12 * K].view(torch.float32),
            buffer[12 * K :].view(torch.bool))


def packed_triple(K: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised pids, scores and valid of length K in one new buffer (see packed_views)."""
    return packed_views(torch.empty(BYTES_PER_SLOT * K, dtype=torch.uint8, device=device), K)


def packed_base(pids: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
    """The [13 * K] uint8 buffer that ``pids``, ``scores`` and ``valid`` view as packed_views
    lays it out (a new view of their shared storage), or None when they are not such views."""
    K = pids.numel()
    if (pids.dtype, scores.dtype, valid.dtype) != (torch.int64, torch.float32, torch.bool):
        return None
    if scores.numel() != K or valid.numel() != K or not (pids.is_contiguous() and scores.is_contiguous()):
        return None
    storage = pids.untyped_storage()
    if scores.untyped_storage().data_ptr() != storage.data_ptr() or valid.untyped_storage().data_ptr() != storage.data_ptr():
        return None
    start = pids.data_ptr()
    if (scores.data_ptr(), valid.data_ptr()) != (start + 8 * K, start + 12 * K):
        return None
    offset = start - storage.data_ptr()
    if offset + BYTES_PER_SLOT * K > storage.nbytes():
        return None
    # dtype views of one buffer keep no _base; the storage says what they share.
    return torch.empty(0, dtype=torch.uint8, device=pids.device).set_(storage, offset, (BYTES_PER_SLOT * K,))
