"""Scoring callables, one per (shard kind, implementation): what a rank runs on its own shard.

A scorer has the signature

    scorer(Q, shard, pids=None, *, query_lengths=None, validate=True) -> fp32 [B, M]

with Q [B, Lq, d] on the shard's device, ``pids`` optional int64 *local* document ids [M] (default
all N documents of the shard, M = N) and ``query_lengths`` optional [B]. It must score each
document independently of which other documents are in the call, so that a shard scores a
document bit for bit as the whole corpus would (that is what makes the sharded top-k equal the
single-process one, ties included).

``"op"`` scorers call the Triton host functions of :mod:`tilemaxsim_plaid.ops` (imported on first
use, so this module imports without them); ``"reference"`` scorers call their float64 twins in
:mod:`tilemaxsim_plaid.reference` (which decode codes in plain torch) and round to fp32: slow,
exact, any device.
"""

from __future__ import annotations

import torch

from tilemaxsim_plaid import reference

__all__ = ["default_scorer", "SCORERS"]


def _score_dense_op(Q, shard, pids=None, *, query_lengths=None, validate=True):
    from tilemaxsim_plaid.ops.dense import maxsim_packed

    return maxsim_packed(Q, shard.embeddings, shard.offsets, pids, query_lengths=query_lengths,
                         max_doc_len=shard.max_doc_len, validate=validate)


def _score_residual_op(Q, shard, pids=None, *, query_lengths=None, validate=True):
    from tilemaxsim_plaid.ops.residual import maxsim_residual

    return maxsim_residual(Q, shard.codes, shard.residuals, shard.offsets, shard.centroids,
                           shard.bucket_weights, shard.nbits, pids, inv_norms=shard.inv_norms,
                           query_lengths=query_lengths, validate=validate)


def _score_pq_op(Q, shard, pids=None, *, query_lengths=None, validate=True):
    from tilemaxsim_plaid.ops.pq import maxsim_pq

    return maxsim_pq(Q, shard.codes, shard.offsets, shard.codebooks, pids,
                     centroid_codes=shard.centroid_codes, centroids=shard.centroids,
                     inv_norms=shard.inv_norms, query_lengths=query_lengths, validate=validate)


def _score_dense_reference(Q, shard, pids=None, *, query_lengths=None, validate=True):
    scores = reference.maxsim_packed(Q, shard.embeddings, shard.offsets, pids, query_lengths=query_lengths)
    return scores.to(device=Q.device, dtype=torch.float32)


def _score_residual_reference(Q, shard, pids=None, *, query_lengths=None, validate=True):
    scores = reference.maxsim_residual(Q, shard.codes, shard.residuals, shard.offsets, shard.centroids,
                                       shard.bucket_weights, shard.nbits, pids, query_lengths=query_lengths)
    return scores.to(device=Q.device, dtype=torch.float32)


def _score_pq_reference(Q, shard, pids=None, *, query_lengths=None, validate=True):
    scores = reference.maxsim_pq(Q, shard.codes, shard.offsets, shard.codebooks, pids,
                                 centroid_codes=shard.centroid_codes, centroids=shard.centroids,
                                 inv_norms=shard.inv_norms, query_lengths=query_lengths)
    return scores.to(device=Q.device, dtype=torch.float32)


SCORERS = {
    "op": {"dense": _score_dense_op, "residual": _score_residual_op, "pq": _score_pq_op},
    "reference": {
        "dense": _score_dense_reference,
        "residual": _score_residual_reference,
        "pq": _score_pq_reference,
    },
}


def default_scorer(kind: str, implementation: str = "op"):
    """The scorer for a shard kind (``"dense"``, ``"residual"``, ``"pq"``).

    Args:
        kind: the shard's ``kind``.
        implementation: ``"op"`` (Triton kernels) or ``"reference"`` (plain torch, float64).
    """
    if implementation not in SCORERS:
        raise ValueError(f"implementation must be one of {sorted(SCORERS)}, got {implementation!r}")
    if kind not in SCORERS[implementation]:
        raise ValueError(f"no scorer for shard kind {kind!r}; known: {sorted(SCORERS[implementation])}")
    return SCORERS[implementation][kind]
