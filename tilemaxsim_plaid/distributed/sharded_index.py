"""Data-parallel MaxSim search: every rank scores its shard, one all-gather merges the top-k.

Every rank of the process group calls :meth:`ShardedIndex.score` with the same queries (SPMD,
as under ``torchrun``) and every rank gets the same merged result back. Per query batch:

    1. the rank scores its documents (in blocks of ``max_docs_per_call``), keeping a running
       local top-k as int64 keys (score and global pid in one number, see :mod:`.topk`);
    2. one ``all_gather`` of the [b, k] keys (8 * b * k bytes per rank);
    3. a top-k over the world_size * k gathered keys.

Because the key order (score desc, pid asc) is total and the global top-k is a subset of the
union of local top-ks, the merge is exact: the result equals :func:`.topk.exact_topk` over the
whole corpus scored in one process, ties included. The all-gather of batch i runs asynchronously
while batch i+1 is scored.

Collectives run on CUDA tensors for NCCL and on CPU tensors for every other backend (gloo).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tilemaxsim_plaid.distributed import topk
from tilemaxsim_plaid.distributed.plaid_index import load_plaid_shard, plaid_pid_ranges
from tilemaxsim_plaid.distributed.scorers import default_scorer
from tilemaxsim_plaid.distributed.shards import DenseShard, ResidualShard, partition_pid_ranges

__all__ = ["ShardedIndex", "ShardedDenseIndex", "ShardedResidualIndex", "check_layouts"]

# Fields of the per-call signature that every rank must agree on (see _check_call).
_SIGNATURE_FIELDS = ("Q.dim", "B", "Lq", "d", "k", "num_pids", "has_query_lengths", "batch_size")


def check_layouts(layouts: list[dict]) -> tuple[list[tuple[int, int]], int]:
    """Check that the shards of all ranks form one corpus.

    Args:
        layouts: ``shard.layout()`` of every rank, in rank order.

    Returns:
        (pid range per rank, total number of documents).

    Raises:
        ValueError: shards of different kinds, embedding dimensions or codecs; an empty shard;
            pid ranges that do not tile [0, N) exactly.
    """
    first = layouts[0]
    for rank, layout in enumerate(layouts):
        for field in ("kind", "dim", "codec"):
            if layout[field] != first[field]:
                raise ValueError(
                    f"rank {rank}'s shard has {field} {layout[field]!r} but rank 0's has "
                    f"{first[field]!r}: every rank must hold a shard of the same corpus"
                )
    world_size = len(layouts)
    total = sum(layout["pid_stop"] - layout["pid_start"] for layout in layouts)
    empty = [rank for rank, layout in enumerate(layouts) if layout["pid_stop"] == layout["pid_start"]]
    if empty:
        if total < world_size:
            raise ValueError(
                f"world size {world_size} is larger than the corpus ({total} documents): "
                "every rank needs at least one document"
            )
        raise ValueError(f"rank(s) {empty} hold no documents: every rank needs at least one")
    ranges = [(layout["pid_start"], layout["pid_stop"]) for layout in layouts]
    expected_start = 0
    for start, stop in sorted(ranges):
        if start != expected_start:
            raise ValueError(
                f"the shards' pid ranges {ranges} (in rank order) must tile [0, {total}) "
                f"without gaps or overlaps; found one starting at {start}, expected {expected_start}"
            )
        expected_start = stop
    return ranges, total


class ShardedIndex:
    """A corpus split by pid ranges over the ranks of a process group.

    Args:
        shard: this rank's :class:`~.shards.DenseShard`, :class:`~.shards.ResidualShard` or
            :class:`~.shards.PQShard`, already on this rank's device.
        scorer: ``scorer(Q, shard, pids=None, *, query_lengths=None, validate=True)`` returning
            fp32 [B, M] (see :mod:`.scorers`); default the Triton op for the shard's kind.
        group: the process group (default: the world).
        max_docs_per_call: score the shard in blocks of at most this many documents, bounding the
            [B, block] score buffer (default: the whole shard in one call).

    The constructor is collective (one all-gather of the shard layouts): every rank of the
    group must build its index together, and every rank gets the same error for a bad layout.
    """

    def __init__(self, shard, scorer=None, *, group=None, max_docs_per_call: int | None = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group first")
        self.shard = shard
        self.scorer = scorer if scorer is not None else default_scorer(shard.kind)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.comm_device = self._comm_device()
        layouts = [None] * self.world_size
        dist.all_gather_object(layouts, shard.layout(), group=group)
        self.pid_ranges, self.num_docs = check_layouts(layouts)
        if self.num_docs - 1 > topk.MAX_PID:
            raise ValueError(f"at most {topk.MAX_PID + 1} documents fit the int64 keys, got {self.num_docs}")
        self.dim = shard.dim
        self._blocks = shard.blocks(max_docs_per_call)
        self._max_docs_per_call = max_docs_per_call

    def _comm_device(self) -> torch.device:
        if dist.get_backend(self.group) == "nccl":
            if self.shard.device.type != "cuda":
                raise ValueError(f"the NCCL backend needs the shard on a CUDA device, got {self.shard.device}")
            return self.shard.device
        return torch.device("cpu")

    def score(self, Q: torch.Tensor, k: int, *, pids: torch.Tensor | None = None,
              query_lengths: torch.Tensor | None = None, batch_size: int | None = None,
              validate: bool = True):
        """Global top-k documents of every query. Collective: every rank calls it with the same
        arguments and every rank gets the same result.

        Args:
            Q: [B, Lq, d] or [Lq, d] queries (any device: copied to the shard's device).
            k: documents to return per query (>= 1); fewer if the corpus (or ``pids``) has fewer.
            pids: optional int32/int64 [M] unique *global* pids: score only these candidates
                (PLAID's stage 4); each rank scores the ones in its pid range.
            query_lengths: optional [B] tokens per query (3-D Q only).
            batch_size: queries per round (default all B); bounds the [batch, docs] buffer.
            validate: check that every rank passed the same shapes and that the inputs are
                valid (one small all-gather and host syncs); False on a hot path once the
                arguments are known to be good.

        Returns:
            (fp32 scores, int64 global pids), each [B, min(k, M)] (or [min(k, M)] for a 2-D Q),
            best first, ties by ascending pid; on the shard's device.
        """
        Q3 = Q[None] if isinstance(Q, torch.Tensor) and Q.dim() == 2 else Q
        if validate:
            self._check_call(Q3, k, pids, query_lengths, batch_size)
        device = self.shard.device
        Q3 = Q3.to(device)
        if query_lengths is not None:
            query_lengths = query_lengths.to(device)
        candidates = None
        total = self.num_docs
        if pids is not None:
            candidates = self._local_candidates(pids.to(device=device, dtype=torch.int64))
            total = pids.numel()
        width = min(k, total)
        B = Q3.shape[0]
        step = batch_size or max(B, 1)
        merged = []
        in_flight = None
        for start in range(0, B, step):
            stop = min(start + step, B)
            lengths = query_lengths[start:stop] if query_lengths is not None else None
            local = self._local_topk(Q3[start:stop], lengths, candidates, width, validate)
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            work = dist.all_gather(gathered, local, group=self.group, async_op=True)
            if in_flight is not None:
                merged.append(self._merge(*in_flight, width))
            in_flight = (work, gathered)
        if in_flight is not None:
            merged.append(self._merge(*in_flight, width))
        keys = torch.cat(merged).to(device) if merged else torch.empty(0, width, dtype=torch.int64, device=device)
        scores, top_pids = topk.decode_keys(keys)
        if Q.dim() == 2:
            return scores[0], top_pids[0]
        return scores, top_pids

    def _local_candidates(self, pids: torch.Tensor):
        """(local ids, global pids) of the candidates in this rank's range, in the given order."""
        start, stop = self.pid_ranges[self.rank]
        mine = pids[(pids >= start) & (pids < stop)]
        return mine - start, mine

    def _local_topk(self, Q, query_lengths, candidates, width: int, validate: bool) -> torch.Tensor:
        """int64 [b, width] best keys of this rank, PAD_KEY where it has fewer candidates."""
        pieces = []
        if candidates is None:
            for block in self._blocks:
                scores = self.scorer(Q, block, None, query_lengths=query_lengths, validate=validate)
                block_pids = torch.arange(block.pid_start, block.pid_stop, device=scores.device)
                pieces.append(topk.topk_keys(topk.encode_keys(scores, block_pids), width))
        else:
            local_ids, global_pids = candidates
            step = self._max_docs_per_call or max(local_ids.numel(), 1)
            for s in range(0, local_ids.numel(), step):
                scores = self.scorer(Q, self.shard, local_ids[s:s + step], query_lengths=query_lengths,
                                     validate=validate)
                keys = topk.encode_keys(scores, global_pids[s:s + step])
                pieces.append(topk.topk_keys(keys, width))
        if not pieces:
            return torch.full((Q.shape[0], width), topk.PAD_KEY, dtype=torch.int64,
                              device=self.comm_device)
        local = pieces[0] if len(pieces) == 1 else topk.topk_keys(torch.cat(pieces, dim=-1), width)
        return local.to(self.comm_device)

    def _merge(self, work, gathered: list[torch.Tensor], width: int) -> torch.Tensor:
        work.wait()
        return topk.topk_keys(torch.cat(gathered, dim=-1), width)

    def _check_call(self, Q3, k, pids, query_lengths, batch_size) -> None:
        """Exchange the call's shapes first (so a rank with bad arguments cannot leave the others
        waiting in a collective), then raise the same error on every rank."""
        is_query = isinstance(Q3, torch.Tensor) and Q3.dim() == 3
        is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        signature = torch.tensor([
            3 if is_query else -1,
            Q3.shape[0] if is_query else -1,
            Q3.shape[1] if is_query else -1,
            Q3.shape[2] if is_query else -1,
            k if is_int(k) else -1,
            pids.numel() if isinstance(pids, torch.Tensor) else -1,
            int(query_lengths is not None),
            batch_size if is_int(batch_size) else (0 if batch_size is None else -1),
        ], dtype=torch.int64, device=self.comm_device)
        signatures = [torch.empty_like(signature) for _ in range(self.world_size)]
        dist.all_gather(signatures, signature, group=self.group)
        for rank, other in enumerate(signatures):
            if not torch.equal(other, signatures[0]):
                described = {name: (int(a), int(b)) for name, a, b in
                             zip(_SIGNATURE_FIELDS, signatures[0].tolist(), other.tolist()) if a != b}
                raise ValueError(
                    f"every rank must call score() with the same shapes; rank {rank} differs from "
                    f"rank 0 in (rank 0, rank {rank}) = {described}"
                )
        if not is_query:
            raise ValueError(f"Q must be a [B, Lq, d] or [Lq, d] tensor, got {_describe(Q3)}")
        if Q3.shape[-1] != self.dim:
            raise ValueError(f"Q has embedding dimension {Q3.shape[-1]} but the shards have {self.dim}")
        if not is_int(k) or k <= 0:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if batch_size is not None and (not is_int(batch_size) or batch_size <= 0):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        if query_lengths is not None:
            if not isinstance(query_lengths, torch.Tensor) or query_lengths.shape != (Q3.shape[0],):
                raise ValueError(f"query_lengths must be a [B={Q3.shape[0]}] tensor, got {_describe(query_lengths)}")
            if query_lengths.numel() and (int(query_lengths.min()) < 0 or int(query_lengths.max()) > Q3.shape[1]):
                raise ValueError(f"query_lengths must lie in [0, Lq={Q3.shape[1]}]")
        if pids is not None:
            if not isinstance(pids, torch.Tensor) or pids.dim() != 1 or pids.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"pids must be a 1-D int32/int64 tensor, got {_describe(pids)}")
            if pids.numel() == 0:
                raise ValueError("pids is empty: there is nothing to score")
            if int(pids.min()) < 0 or int(pids.max()) >= self.num_docs:
                raise ValueError(f"pids must lie in [0, {self.num_docs}), got [{int(pids.min())}, {int(pids.max())}]")
            if torch.unique(pids).numel() != pids.numel():
                raise ValueError("pids must be unique: a duplicate would take two places in the top-k")


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
    return type(value).__name__


class ShardedDenseIndex(ShardedIndex):
    """:class:`ShardedIndex` over dense packed embeddings."""

    @classmethod
    def from_corpus(cls, embeddings, offsets, *, group=None, device=None, scorer=None,
                    balance: str = "tokens", max_docs_per_call: int | None = None):
        """Take this rank's pid range of a whole packed corpus (e.g. memory-mapped on every host)
        and copy only that range to ``device``.

        Args:
            embeddings: [T, d] all tokens; offsets: int64 [N+1].
            device: where this rank scores (default: the corpus' device).
            balance: ``"tokens"`` or ``"docs"``, see :func:`~.shards.partition_pid_ranges`.
        """
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        offsets = offsets.to(torch.int64)
        ranges = partition_pid_ranges((offsets[1:] - offsets[:-1]).cpu(), world, balance=balance)
        shard = DenseShard.from_corpus(embeddings, offsets, *ranges[rank])
        if device is not None:
            shard = shard.to(device)
        return cls(shard, scorer, group=group, max_docs_per_call=max_docs_per_call)


class ShardedResidualIndex(ShardedIndex):
    """:class:`ShardedIndex` over colbert-ai residual codes: what the PLAID plugin searches.

    Typical use on every rank (``torchrun``)::

        index = ShardedResidualIndex.from_plaid_index(path, device=f"cuda:{local_rank}")
        scores, pids = index.score(Q, k)                   # exact MaxSim over every document
        scores, pids = index.score(Q, k, pids=candidates)  # rerank global candidate pids
    """

    @classmethod
    def from_plaid_index(cls, index_path, *, group=None, device=None, scorer=None,
                         balance: str = "tokens", max_docs_per_call: int | None = None):
        """Load this rank's pid range of an on-disk colbert-ai PLAID index (only the chunk
        files that overlap it) onto ``device``.

        Args:
            index_path: a colbert-ai 0.2.22 index directory.
            device: where this rank scores (default CPU).
            balance: ``"tokens"`` or ``"docs"``.
        """
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        pid_start, pid_stop = plaid_pid_ranges(index_path, world, balance=balance)[rank]
        shard = load_plaid_shard(index_path, pid_start, pid_stop)
        if device is not None:
            shard = shard.to(device)
        return cls(shard, scorer, group=group, max_docs_per_call=max_docs_per_call)

    @classmethod
    def from_corpus(cls, codes, residuals, offsets, centroids, bucket_weights, nbits: int, *,
                    group=None, device=None, scorer=None, balance: str = "tokens",
                    max_docs_per_call: int | None = None):
        """Take this rank's pid range of a whole residual-coded corpus held in memory."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        offsets = offsets.to(torch.int64)
        ranges = partition_pid_ranges((offsets[1:] - offsets[:-1]).cpu(), world, balance=balance)
        shard = ResidualShard.from_corpus(codes, residuals, offsets, centroids, bucket_weights, nbits,
                                          *ranges[rank])
        if device is not None:
            shard = shard.to(device)
        return cls(shard, scorer, group=group, max_docs_per_call=max_docs_per_call)
