"""Deterministic top-k over (score, pid) pairs, packed into one int64 key per pair.

The order is: higher score first, and among equal scores the smaller global pid first. Packing
both into a single int64 whose natural order *is* that order makes every top-k exact and
deterministic with a plain ``torch.topk`` (the keys are distinct because pids are), and lets the
ranks exchange their local top-k with one int64 all-gather instead of two.

Key layout (high to low bits):
    [ 32 bits: the fp32 score's bits mapped to a signed int32 that orders like the float ]
    [ 32 bits: 2**32 - 1 - pid, so a smaller pid gives a larger key ]

Scores must be fp32 and pids must lie in [0, 2**32). ``-0.0`` is folded into ``+0.0`` first, since
the two compare equal as floats but not as bits. NaN scores (which no scorer of this package
produces) would order above +inf, as they do in ``torch.topk``.
"""

from __future__ import annotations

import torch

__all__ = [
    "MAX_PID",
    "PAD_KEY",
    "encode_keys",
    "decode_keys",
    "topk_keys",
    "exact_topk",
]

# Pids live in the low 32 bits of a key.
MAX_PID = 2**32 - 1
# Below every real key (the smallest real key is about -2**63 + 2**32): fills a rank's slot when
# it holds fewer than k candidates, and always sorts last.
PAD_KEY = torch.iinfo(torch.int64).min
_LOW = 2**32
# XOR of the low 31 bits turns a negative float's sign-magnitude bits into two's-complement order.
_NEGATIVE_FLIP = 0x7FFFFFFF


def encode_keys(scores: torch.Tensor, pids: torch.Tensor) -> torch.Tensor:
    """Pack scores and their pids into ordered int64 keys.

    Args:
        scores: fp32 [..., M].
        pids: int64 [M] (broadcast over the leading dims of ``scores``) or [..., M], each in
            [0, 2**32).

    Returns:
        int64 keys of the shape of ``scores``.
    """
    if scores.dtype != torch.float32:
        raise TypeError(f"scores must be float32, got {scores.dtype}")
    bits = (scores + 0.0).contiguous().view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits >= 0, bits, bits ^ _NEGATIVE_FLIP).to(torch.int64)
    return ordered * _LOW + (MAX_PID - pids.to(torch.int64))


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`encode_keys`.

    Args:
        keys: int64 [...], none of them ``PAD_KEY``.

    Returns:
        (fp32 scores, int64 pids), both of the shape of ``keys``.
    """
    ordered = torch.div(keys, _LOW, rounding_mode="floor")
    pids = MAX_PID - (keys - ordered * _LOW)
    ordered = ordered.to(torch.int32)
    bits = torch.where(ordered >= 0, ordered, ordered ^ _NEGATIVE_FLIP)
    return bits.view(torch.float32), pids


def topk_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest keys of each row, largest first, padded with ``PAD_KEY`` to width k.

    Args:
        keys: int64 [B, M].
        k: output width (>= 1); rows keep min(k, M) real keys.

    Returns:
        int64 [B, k].
    """
    keep = min(k, keys.shape[-1])
    top = torch.topk(keys, keep, dim=-1, sorted=True).values if keep else keys[..., :0]
    if keep == k:
        return top
    pad = top.new_full((*top.shape[:-1], k - keep), PAD_KEY)
    return torch.cat([top, pad], dim=-1)


def exact_topk(scores: torch.Tensor, k: int, pids: torch.Tensor | None = None):
    """Single-process top-k with the package's tie-breaking: the result sharded search must equal.

    Args:
        scores: fp32 [B, M] or [M].
        k: how many to keep (>= 1); the result has min(k, M) columns.
        pids: optional int64 [M], the global pid of each column; default ``arange(M)``.

    Returns:
        (fp32 scores [B, min(k, M)], int64 pids [B, min(k, M)]), best first; 1-D for a 1-D input.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    squeeze = scores.dim() == 1
    scores2 = scores[None] if squeeze else scores
    if pids is None:
        pids = torch.arange(scores2.shape[-1], device=scores2.device)
    keys = topk_keys(encode_keys(scores2, pids.to(scores2.device)), min(k, scores2.shape[-1]))
    top_scores, top_pids = decode_keys(keys)
    return (top_scores[0], top_pids[0]) if squeeze else (top_scores, top_pids)
