"""PLAID search over an index sharded across ranks, through the one-import plugin.

Every rank of a process group (``torchrun``; NCCL on GPUs, gloo on CPU) opens the same colbert-ai
index with a ``Searcher`` or ``IndexScorer`` as usual and then calls :func:`shard_searcher` (or
:func:`shard_index_scorer`). From then on the patched ``IndexScorer.rank`` runs stages 1-3 on
every rank (centroids, IVF and codes are small and the same everywhere), and stage 4 scores the
candidates through a :class:`ShardedResidualIndex`: each rank decodes only the residuals of its
own pid range, and every rank receives the same merged ranking. ``search``, ``search_all`` and
the ``pids=`` rerank are collective calls then: every rank must make them with the same queries.
"""

from __future__ import annotations

import torch

from tilemaxsim_plaid.distributed.sharded_index import ShardedResidualIndex
from tilemaxsim_plaid.plaid.device_index import SHARDED_INDEX_ATTRIBUTE

__all__ = ["shard_index_scorer", "shard_searcher", "unshard_index_scorer"]


def shard_index_scorer(scorer, *, group=None, device: torch.device | None = None,
                       scorer_fn=None) -> ShardedResidualIndex:
    """Route the exact stage of a patched colbert-ai ``IndexScorer`` through a sharded index.

    Args:
        scorer: a colbert-ai ``IndexScorer`` (``Searcher.ranker``), the same index on every rank.
        group: the process group (default: the world).
        device: where this rank scores (default: the current CUDA device, else CPU).
        scorer_fn: optional shard scoring callable (default: the fused residual op).

    Returns:
        The :class:`ShardedResidualIndex` now attached to ``scorer``.
    """
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    sharded = ShardedResidualIndex.from_plaid_index(scorer.index_path, group=group, device=device,
                                                    scorer=scorer_fn)
    setattr(scorer, SHARDED_INDEX_ATTRIBUTE, sharded)
    return sharded


def shard_searcher(searcher, **kwargs) -> ShardedResidualIndex:
    """:func:`shard_index_scorer` for a colbert-ai ``Searcher``'s ranker."""
    return shard_index_scorer(searcher.ranker, **kwargs)


def unshard_index_scorer(scorer) -> None:
    """Score stage 4 on this rank alone again."""
    if hasattr(scorer, SHARDED_INDEX_ATTRIBUTE):
        delattr(scorer, SHARDED_INDEX_ATTRIBUTE)
