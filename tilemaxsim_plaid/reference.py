"""Plain-torch MaxSim references: the ground truth of every test.

Every function here has the same signature as its fast twin in :mod:`tilemaxsim_plaid.ops`
and computes in float64 by default. Masking follows the exact MaxSim definition:

    score[b, n] = sum over valid query tokens i of  max over valid doc tokens j of <Q[b,i], D[n,j]>

* An absent or padded document token never wins a max: it is ``-inf``, not 0.
* A padded query token (``i >= query_lengths[b]``) contributes nothing (0 to the sum).
* An empty document (length 0) scores ``-inf`` against any query with at least one token, so it
  ranks below every real document; against a query with no tokens every document scores 0
  (the empty sum). Masking alone never produces NaN.
* NaN and inf (the policy of every op, docs/kernels.md): torch's own semantics. Masked values are
  replaced by ``-inf`` (``masked_fill``, ``where``) before any max, so a NaN or inf that is never
  read counts for nothing; ``amax`` and ``scatter_reduce("amax")`` propagate NaN, so a NaN that is
  read reaches exactly the scores it touches, as NaN, and an inf gives what float64 arithmetic
  gives (inf - inf and 0 * inf are NaN).
"""

from __future__ import annotations

import torch

__all__ = [
    "centroid_interaction",
    "maxsim_from_token_scores",
    "maxsim_packed",
    "maxsim_padded",
    "maxsim_pq",
    "maxsim_residual",
    "segment_maxsim",
]


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


def centroid_interaction(
    centroid_scores: torch.Tensor,
    codes: torch.Tensor,
    offsets: torch.Tensor,
    pids: torch.Tensor | None = None,
    *,
    keep: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference PLAID centroid interaction (stages 2-3): MaxSim with each token replaced by its centroid.

        score[m] = sum over query tokens i of  max over tokens t of doc pids[m] with keep[codes[t]]
                   of centroid_scores[codes[t], i]

    Stage 2 passes ``keep = centroid_scores.max(-1).values >= centroid_score_threshold`` (the
    pruning mask); stage 3 passes no mask. A document none of whose tokens is kept (or an
    empty one) scores ``-inf``, as does a slot whose ``valid`` is False; with no query tokens
    every score is 0 (the empty sum).

    Args:
        centroid_scores: [C, Lq] query-token/centroid similarities.
        codes: [T] integer centroid id of every packed document token.
        offsets: [N+1] int64, document n owns tokens ``offsets[n]:offsets[n+1]``.
        pids: optional [M] document ids (default all N).
        keep: optional [C] bool, False drops every token of that centroid.
        valid: optional [M] bool, False marks an unused slot of a fixed-size candidate list.
        dtype: accumulation dtype.

    Returns:
        [M] scores in ``dtype``.
    """
    device = centroid_scores.device
    offsets = offsets.to(device=device, dtype=torch.int64)
    ids = torch.arange(offsets.numel() - 1, device=device) if pids is None else pids.to(device).long()
    starts, lengths = offsets[ids], offsets[ids + 1] - offsets[ids]
    if valid is not None:
        lengths = torch.where(valid.to(device), lengths, torch.zeros_like(lengths))
    segment = torch.repeat_interleave(torch.arange(ids.numel(), device=device), lengths)
    first_row = torch.cumsum(lengths, 0) - lengths
    rows = starts[segment] + torch.arange(segment.numel(), device=device) - first_row[segment]
    token_codes = codes.to(device)[rows].long()
    token_scores = centroid_scores.to(dtype)[token_codes]  # [T', Lq]
    if keep is not None:
        kept = keep.to(device)[token_codes]
        token_scores = token_scores.masked_fill(~kept[:, None], float("-inf"))
    return segment_maxsim(token_scores, lengths)


def segment_maxsim(sim: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Exact MaxSim reduction of packed token similarities (an empty document scores -inf).

    Args:
        sim: [T, Lq] similarities (-inf for a dropped token), documents packed in order.
        lengths: [N] int64 tokens per document, summing to T.

    Returns:
        [N] in ``sim.dtype``.
    """
    Lq = sim.shape[1]
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=sim.device), lengths)
    maxima = torch.full((lengths.numel(), Lq), float("-inf"), dtype=sim.dtype, device=sim.device)
    maxima.scatter_reduce_(0, segment[:, None].expand(-1, Lq), sim, "amax")
    return maxima.sum(dim=1)




def maxsim_residual(
    Q: torch.Tensor,
    codes: torch.Tensor,
    residuals: torch.Tensor,
    offsets: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
    pids: torch.Tensor | None = None,
    *,
    inv_norms: torch.Tensor | None = None,
    query_lengths: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference MaxSim over PLAID residual codes: decode every token in ``dtype``
    (``normalize(centroids[code] + bucket_weights[bucket])``, colbert-ai's bit layout), then
    :func:`maxsim_packed`. ``inv_norms`` is accepted for signature parity and ignored: the
    reference always takes the exact norm.

    Returns:
        [B, M] (or [M] for a 2-D Q) scores in ``dtype``.
    """
    from tilemaxsim_plaid.codecs.residual import decompress_residuals

    D_packed = decompress_residuals(codes.cpu(), residuals.cpu(), centroids.cpu().to(dtype),
                                    bucket_weights.cpu().to(dtype), nbits, normalize=True)
    return maxsim_packed(Q.cpu(), D_packed, offsets.cpu(), None if pids is None else pids.cpu(),
                         query_lengths=None if query_lengths is None else query_lengths.cpu(),
                         dtype=dtype)


def maxsim_pq(
    Q: torch.Tensor,
    pq_codes: torch.Tensor,
    offsets: torch.Tensor,
    codebooks: torch.Tensor,
    pids: torch.Tensor | None = None,
    *,
    centroid_codes: torch.Tensor | None = None,
    centroids: torch.Tensor | None = None,
    inv_norms: torch.Tensor | None = None,
    query_lengths: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reference MaxSim over product-quantization codes: decode every token in ``dtype``, then
    :func:`maxsim_packed`.

    A token decodes to ``codebooks[m, pq_codes[t, m]]`` concatenated over the M sub-quantizers,
    plus ``centroids[centroid_codes[t]]`` when the codes quantize PLAID residuals, times
    ``inv_norms[t]`` when given (the same arguments as the kernel's).

    Returns:
        [B, M'] (or [M'] for a 2-D Q) scores in ``dtype``.
    """
    M = codebooks.shape[0]
    books = codebooks.cpu().to(dtype)
    parts = books[torch.arange(M)[None, :], pq_codes.cpu().long()]  # [T, M, dsub]
    D_packed = parts.reshape(pq_codes.shape[0], -1)
    if centroid_codes is not None:
        D_packed = D_packed + centroids.cpu().to(dtype)[centroid_codes.cpu().long()]
    if inv_norms is not None:
        D_packed = D_packed * inv_norms.cpu().to(dtype)[:, None]
    return maxsim_packed(Q.cpu(), D_packed, offsets.cpu(), None if pids is None else pids.cpu(),
                         query_lengths=None if query_lengths is None else query_lengths.cpu(),
                         dtype=dtype)
