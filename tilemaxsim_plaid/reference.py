"""Plain-torch MaxSim references: the ground truth of every test.

Every function here has the same signature as its fast twin in :mod:`tilemaxsim_plaid.ops`
and computes in float64 by default. Masking follows the exact MaxSim definition:

    score[b, n] = sum over valid query tokens i of  max over valid doc tokens j of <Q[b,i], D[n,j]>

* An absent or padded document token never wins a max: it is ``-inf``, not 0.
* A padded query token (``i >= query_lengths[b]``) contributes nothing (0 to the sum).
* An empty document (length 0) scores ``-inf`` against any query with at least one token, so it
  ranks below every real document; against a query with no tokens every document scores 0
  (the empty sum). No combination produces NaN.
"""

from __future__ import annotations

import torch

__all__ = ["maxsim_padded", "maxsim_packed", "maxsim_from_token_scores"]


def _query_mask(Q: torch.Tensor, query_lengths: torch.Tensor | None) -> torch.Tensor:
    """[B, Lq] bool, True where a query token is real."""
    B, Lq = Q.shape[0], Q.shape[1]
    positions = torch.arange(Lq, device=Q.device)
    if query_lengths is None:
        return torch.ones(B, Lq, dtype=torch.bool, device=Q.device)
    return positions[None, :] < query_lengths.to(Q.device)[:, None]


def maxsim_from_token_scores(
    sim: torch.Tensor, doc_mask: torch.Tensor, query_mask: torch.Tensor
) -> torch.Tensor:
    """Reduce a similarity block to MaxSim scores.

    Args:
        sim: [B, N, Lq, Ld] token similarities.
        doc_mask: [N, Ld] bool, True for real document tokens.
        query_mask: [B, Lq] bool, True for real query tokens.

    Returns:
        [B, N] scores in ``sim.dtype``.
    """
    sim = sim.masked_fill(~doc_mask[None, :, None, :], float("-inf"))
    if sim.shape[-1] == 0:
        token_max = sim.new_full(sim.shape[:-1], float("-inf"))
    else:
        token_max = sim.amax(dim=-1)  # [B, N, Lq]
    # where(), not multiply: 0 * -inf would be NaN for an empty document.
    token_max = torch.where(query_mask[:, None, :], token_max, torch.zeros_like(token_max))
    return token_max.sum(dim=-1)


def _as_batched(Q: torch.Tensor):
    squeeze = Q.dim() == 2
    return (Q[None] if squeeze else Q), squeeze


def maxsim_padded(
    Q: torch.Tensor,
    D: torch.Tensor,
    doc_lengths: torch.Tensor | None = None,
    query_lengths: torch.Tensor | None = None,
    *,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference MaxSim over padded documents.

    Args:
        Q: [B, Lq, d] or [Lq, d] query token embeddings.
        D: [N, Ld, d] document token embeddings, padded to Ld.
        doc_lengths: optional [N] integer lengths; tokens at or past the length are ignored.
        query_lengths: optional [B] integer lengths (3-D Q only).
        dtype: accumulation dtype (float64 by default).

    Returns:
        [B, N] (or [N] for a 2-D Q) scores in ``dtype``.
    """
    Qb, squeeze = _as_batched(Q)
    N, Ld = D.shape[0], D.shape[1]
    Qf, Df = Qb.to(dtype), D.to(dtype)
    positions = torch.arange(Ld, device=D.device)
    if doc_lengths is None:
        doc_mask = torch.ones(N, Ld, dtype=torch.bool, device=D.device)
    else:
        doc_mask = positions[None, :] < doc_lengths.to(D.device)[:, None]
    sim = torch.einsum("bid,njd->bnij", Qf, Df)
    scores = maxsim_from_token_scores(sim, doc_mask, _query_mask(Qb, query_lengths))
    return scores[0] if squeeze else scores


def maxsim_packed(
    Q: torch.Tensor,
    D_packed: torch.Tensor,
    offsets: torch.Tensor,
    pids: torch.Tensor | None = None,
    *,
    query_lengths: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference MaxSim over PLAID's packed layout.

    Args:
        Q: [B, Lq, d] or [Lq, d].
        D_packed: [T, d] all document tokens concatenated.
        offsets: [N+1] int64, document n owns rows ``offsets[n]:offsets[n+1]``.
        pids: optional [M] document ids to score (in that order); default all N.
        query_lengths: optional [B] integer lengths (3-D Q only).
        dtype: accumulation dtype.

    Returns:
        [B, M] (or [M] for a 2-D Q) scores in ``dtype``.
    """
    Qb, squeeze = _as_batched(Q)
    offsets = offsets.to(torch.int64).cpu()
    ids = torch.arange(offsets.numel() - 1) if pids is None else pids.to(torch.int64).cpu()
    lengths = (offsets[1:] - offsets[:-1])[ids]
    Ld = int(lengths.max()) if ids.numel() else 0
    D = D_packed.new_zeros(ids.numel(), Ld, D_packed.shape[-1])
    for row, pid in enumerate(ids.tolist()):
        start, end = int(offsets[pid]), int(offsets[pid + 1])
        D[row, : end - start] = D_packed[start:end]
    scores = maxsim_padded(Qb, D, lengths.to(D.device), query_lengths, dtype=dtype)
    return scores[0] if squeeze else scores
