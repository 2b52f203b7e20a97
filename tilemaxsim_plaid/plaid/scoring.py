"""The replacement PLAID scorer: colbert-ai's IndexScorer.rank / score_pids on our kernels.

Per query (stage numbers as in the PLAID paper):

1. candidate generation: ``centroid_scores = centroids @ Q.T`` (first ``query_maxlen`` query
   tokens), the ``ncells`` best centroids of each query token, the union of their inverted
   lists. The union is a fixed-capacity list (``torch.nonzero_static`` over a bitmap), with a
   validity mask instead of a data-dependent length.
2. centroid interaction over the codes that pass ``centroid_score_threshold``; top ``ndocs``.
3. centroid interaction over all codes; top ``ndocs // 4``.
4. exact fp32 MaxSim over PLAID's decompressed embeddings; sort.

The candidate semantics are upstream's: the same knobs, the same ``-9999`` per query token for
a document none of whose codes passes the threshold, truncation only when there are more
candidates than ``ndocs`` (resp. ``ndocs // 4``). What differs on purpose: every score is fp32
(upstream GPU: fp16), and a negative per-token maximum is kept (upstream CPU floors it at 0).
Nothing before the final transfer of the ranked list synchronises with the device, unless a
``filter_fn`` is given (it receives a compacted pid tensor, which needs the candidate count).

The first query on an index logs one INFO line on the ``tilemaxsim_plaid`` logger saying that
the plugin scores it and how (:func:`announce`); :func:`tilemaxsim_plaid.stats` counts queries,
documents and fallbacks. While a torch profiler records (``torch.profiler.profile``, or
``torch.autograd.profiler.emit_nvtx`` for NVTX), each stage runs inside a
``record_function`` range named in :data:`PROFILER_RANGES`; with none recording, no range is
opened (:func:`stage_range`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Sequence

import numpy as np
import torch

from tilemaxsim_plaid.ops.packed_lists import packed_base, packed_views
from tilemaxsim_plaid.plaid import backends, counters, environment, graphs
from tilemaxsim_plaid.plaid.device_index import (
    SHARDED_INDEX_ATTRIBUTE,
    DeviceIndex,
    device_index,
    scoring_device,
)

__all__ = [
    "RankedCandidates",
    "rank",
    "score_pids",
    "search_all_Q",
    "colbert_score_packed_exact",
    "rank_on_device",
    "fill_search_knobs",
    "dense_search_knobs",
    "announce",
    "PROFILER_RANGES",
    "stage_range",
]

logger = logging.getLogger(__name__)
# The logger a user turns on to see that the plugin took over (a parent of this module's).
takeover_logger = logging.getLogger("tilemaxsim_plaid")
_ANNOUNCED_ATTRIBUTE = "_tilemaxsim_announced"
_ALIGNED_QUERIES = "several aligned queries in one Q: scored by colbert-ai's own code"

# colbert-ai starts every per-token maximum of the centroid interaction at -9999, so a
# document with no code above the threshold scores -9999 * Lq: still a candidate, ranked last.
UNMATCHED_TOKEN_SCORE = -9999.0

# The record_function ranges of a search, in pipeline order (docs/plaid.md, "Profiler ranges"):
PROFILER_RANGES = (
    "tilemaxsim.centroid_scores",  # stage 1: centroids @ Q.T (first query_maxlen tokens)
    "tilemaxsim.candidates",  # stage 1: the ncells best cells, the union of their lists, filter_fn
    "tilemaxsim.centroid_interaction",  # stages 2-3 with their top ndocs and ndocs // 4 cuts
    "tilemaxsim.exact_scores",  # stage 4: exact MaxSim of the candidates (or of pids=)
    "tilemaxsim.sort",  # the final descending sort of stage 4's scores
    "tilemaxsim.search_graph",  # stages 1-4 and the sort as one CUDA-graph replay
    "tilemaxsim.transfer",  # the ranked list to the host: the search's one sync
)
CENTROID_SCORES, CANDIDATES, CENTROID_INTERACTION, EXACT_SCORES, SORT, SEARCH_GRAPH, TRANSFER = (
    PROFILER_RANGES)
# Whether a torch profiler records on this thread (kineto, legacy and emit_nvtx alike): a range
# opened without one still costs a dispatcher round trip (microseconds), several per query.
_profiler_enabled = torch._C._autograd._profiler_enabled


def stage_range(name: str):
    """``torch.profiler.record_function(name)`` while a profiler records on this thread (a
    range opened elsewhere would not be recorded either), else a no-op context."""
    if _profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


def _in_range(name: str):
    """Decorator: the function runs inside :func:`stage_range` ``(name)``."""
    def decorate(function):
        @functools.wraps(function)
        def in_range(*args, **kwargs):
            with stage_range(name):
                return function(*args, **kwargs)
        return in_range
    return decorate


class RankedCandidates:
    """A query's ranked list, still on the device: ``pids[valid]`` in descending ``scores``.

    Attributes:
        pids: [K] int64; scores: [K] fp32, descending; valid: [K] bool (False slots are last).
    """

    __slots__ = ("pids", "scores", "valid")

    def __init__(self, pids: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor | None):
        self.pids, self.scores = pids, scores
        self.valid = torch.ones_like(pids, dtype=torch.bool) if valid is None else valid

    def clone(self) -> "RankedCandidates":
        """A copy that the next replay of a CUDA graph cannot overwrite: one copy when packed."""
        base = packed_base(self.pids, self.scores, self.valid)
        if base is None:
            return RankedCandidates(self.pids.clone(), self.scores.clone(), self.valid.clone())
        return RankedCandidates(*packed_views(base.clone(), self.pids.numel()))

    def to_lists(self) -> tuple[list[int], list[float]]:
        """The one host transfer of a query: ``(pids, scores)`` as Python lists.

        Through numpy: for a large rerank, torch's masked select and ``tolist`` cost several
        times the host time of numpy's conversion.
        """
        with stage_range(TRANSFER):
            return self._host_lists()

    def _host_lists(self) -> tuple[list[int], list[float]]:
        tensors = (self.pids, self.scores, self.valid)
        if self.pids.is_cuda:
            # Copies queued into pinned memory, then one stream sync (a .cpu() per tensor would
            # allocate pageable memory and wait each time); a packed list is a single copy.
            base = packed_base(*tensors)
            sources = tensors if base is None else (base,)
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in sources]
            for target, source in zip(host, sources):
                target.copy_(source, non_blocking=True)
            torch.cuda.current_stream(self.pids.device).synchronize()
            tensors = host if base is None else packed_views(host[0], self.pids.numel())
        pids, scores, valid = (t.cpu().numpy() for t in tensors)
        if not valid.all():
            pids, scores = pids[valid], scores[valid]
        return pids.tolist(), scores.tolist()


def _check_query(Q, index: DeviceIndex, cast: bool = True) -> torch.Tensor:
    """Q as [Lq, dim] fp32 on the index's device (with ``cast=False`` as given: a graph's input
    copy casts it); raises ValueError/TypeError naming Q."""
    if not isinstance(Q, torch.Tensor):
        raise TypeError(f"Q must be a torch.Tensor, got {type(Q).__name__}")
    if Q.dim() == 3 and Q.shape[0] == 1:
        Q = Q[0]
    if Q.dim() != 2 or Q.shape[-1] != index.dim or Q.shape[0] == 0:
        raise ValueError(
            f"Q must be [1, Lq, {index.dim}] or [Lq, {index.dim}] with Lq >= 1 (one query, the "
            f"index's dimension {index.dim}), got shape {tuple(Q.shape)}"
        )
    if not Q.is_floating_point():
        raise TypeError(f"Q must be a floating-point tensor, got dtype {Q.dtype}")
    return Q.to(device=index.device, dtype=torch.float32) if cast else Q


def _as_pid_tensor(pids, index: DeviceIndex) -> torch.Tensor:
    """User-supplied pids (list, array or tensor) as int64 on the device, range-checked on the host."""
    if isinstance(pids, torch.Tensor):
        host = pids.detach().to("cpu")
    else:
        # numpy reads a list of Python ints many times faster than torch.as_tensor does.
        array = np.asarray(pids if hasattr(pids, "__array__") or isinstance(pids, Sequence) else list(pids))
        host = torch.as_tensor(list(pids)) if array.dtype == object else torch.from_numpy(np.ascontiguousarray(array))
    if host.dim() != 1:
        raise ValueError(f"pids must be a flat sequence of document ids, got shape {tuple(host.shape)}")
    if host.numel() and (host.is_floating_point() or host.is_complex() or host.dtype == torch.bool):
        raise TypeError(f"pids must be integers, got dtype {host.dtype}")
    host = host.to(torch.int64)
    if host.numel():
        # numpy's single-threaded min/max: torch's parallel reduction stalls on a busy host.
        low, high = int(host.numpy().min()), int(host.numpy().max())
        if low < 0 or high >= index.num_docs:
            raise ValueError(
                f"pids must lie in [0, {index.num_docs}) (the index has {index.num_docs} "
                f"passages), got values in [{low}, {high}]"
            )
    return host.to(index.device)


def _keep_top(index, pids, valid, scores, count: int):
    """Top ``count`` slots by score when there are more slots than that (upstream: more candidates)."""
    if count >= pids.numel():
        return pids, valid
    return backends.top_candidates(index, pids, scores, valid, count)


@_in_range(CENTROID_INTERACTION)
def _stages_2_and_3(index, config, centroid_scores, pids, valid, num_used=None, keep=None):
    if keep is None:  # a rerank of given candidates with upstream's centroid scores: no stage 1
        keep = centroid_scores.max(-1).values >= config.centroid_score_threshold
    # A real candidate none of whose tokens survives scores UNMATCHED_TOKEN_SCORE per query
    # token, as upstream's; unused slots stay -inf, so they rank last. num_used (the count of
    # stage 1's list, on the device) keeps stage 2 from visiting the list's unused capacity.
    pruned = backends.centroid_interaction(index, centroid_scores, pids, keep=keep, valid=valid,
                                           unmatched=UNMATCHED_TOKEN_SCORE, num_used=num_used)
    pids, valid = _keep_top(index, pids, valid, pruned, config.ndocs)
    full = backends.centroid_interaction(index, centroid_scores, pids, valid=valid,
                                         unmatched=UNMATCHED_TOKEN_SCORE)
    return _keep_top(index, pids, valid, full, config.ndocs // 4)


def _stage_4(index, Q, pids, valid, sharded=None, centroid_scores=None) -> RankedCandidates:
    if sharded is not None:
        return _stage_4_sharded(sharded, Q, pids, valid)
    with stage_range(EXACT_SCORES):
        scores = backends.exact_scores(index, Q, pids, valid, centroid_scores)
    with stage_range(SORT):
        return RankedCandidates(*backends.sort_candidates(index, pids, scores, valid))


def _stage_4_sharded(sharded, Q, pids, valid) -> RankedCandidates:
    # Every rank of the process group ran stages 1-3 on its replicated centroids, IVF and codes;
    # each scores the candidates in its own pid range and all get the same merged list.
    # The collective needs the compacted candidate list: one host sync, as with filter_fn.
    with stage_range(EXACT_SCORES):
        candidates = pids if valid is None else pids[valid]
        scores, ranked = sharded.score(Q, max(candidates.numel(), 1), pids=candidates)
    return RankedCandidates(ranked.to(pids.device), scores.to(pids.device), None)


@_in_range(CENTROID_SCORES)
def _centroid_scores(index: DeviceIndex, config, Q: torch.Tensor) -> torch.Tensor:
    # Candidate generation reads only the first query_maxlen tokens, as upstream's retrieve().
    return backends.centroid_table(index, Q[: config.query_maxlen])


@_in_range(CANDIDATES)
def _generate_candidates(index: DeviceIndex, config, centroid_scores: torch.Tensor):
    """Stage 1 without a host sync: (pids [cap] int64 ascending, valid [cap] bool, the number
    of candidates as a 0-d int64 tensor, stage 2's pruning mask [C] bool); the used slots come
    first."""
    ncells = min(int(config.ncells), centroid_scores.shape[0])
    cells, keep = backends.probe_centroids(index, centroid_scores, ncells,
                                           config.centroid_score_threshold)
    bitmap = backends.mark_probed_documents(index, cells)
    capacity = index.candidate_capacity(cells.numel())
    pids = torch.nonzero_static(bitmap[: index.num_docs], size=capacity, fill_value=-1).flatten()
    valid = pids >= 0
    return pids.clamp_(min=0), valid, valid.sum(), keep


@_in_range(CANDIDATES)
def _apply_filter(filter_fn, pids, valid, device):
    """Upstream's filter_fn contract: an int32 tensor of candidates in, a subset out."""
    compact = pids[valid].to(torch.int32) if valid is not None else pids.to(torch.int32)
    filtered = filter_fn(compact)
    if not isinstance(filtered, torch.Tensor):
        raise TypeError(f"filter_fn must return a torch.Tensor, got {type(filtered).__name__}")
    if filtered.dtype != compact.dtype or filtered.device != compact.device:
        raise ValueError(
            f"filter_fn must return {compact.dtype} on {compact.device} like its input, "
            f"got {filtered.dtype} on {filtered.device}"
        )
    return filtered.to(device=device, dtype=torch.int64)


# How stage 4 multiplies where it decompresses first (the torch backend, no fused kernel).
DECOMPRESSED_PRODUCTS = "fp32 (decompressed, then scored)"


def announce(scorer, index: DeviceIndex, num_query_tokens: int) -> None:
    """Log once per device copy of ``scorer``'s index that the plugin scores it, and how."""
    if scorer.__dict__.get(_ANNOUNCED_ATTRIBUTE) == index.source_key:
        return
    scorer.__dict__[_ANNOUNCED_ATTRIBUTE] = index.source_key
    backend = backends.backend_for(index.device)
    if backend == "triton" and backends.fused_residual_op() is not None:
        products = backends.resolved_products(index, num_query_tokens)[0]
    else:
        products = DECOMPRESSED_PRODUCTS
    takeover_logger.info(
        "tilemaxsim_plaid scores PLAID index %s: device %s, backend %s, stage-4 products %s, "
        "C=%d centroids, nbits=%d%s", getattr(scorer, "index_path", "(no path)"), index.device,
        backend, products, index.centroids.shape[0], index.nbits,
        ", sharded stage 4" if hasattr(scorer, SHARDED_INDEX_ATTRIBUTE) else "")


def _device_index_checked(scorer) -> DeviceIndex:
    """The scorer's device index, after every TILEMAXSIM_PLAID_* variable was checked."""
    environment.check(scoring_device(scorer))
    return device_index(scorer)


def rank_on_device(scorer, config, Q, filter_fn=None, pids=None,
                   keep: bool = True) -> RankedCandidates | None:
    """All of PLAID for one query, leaving the ranked list on the device.

    Args:
        scorer: a colbert-ai IndexScorer.
        config: the Searcher's ColBERTConfig (ncells, centroid_score_threshold, ndocs, query_maxlen).
        Q: [1, Lq, dim] or [Lq, dim] query embeddings (any device, any float dtype).
        filter_fn: optional upstream filter on the candidate pids.
        pids: optional documents to rerank (skips stages 1-3, as upstream).
        keep: False when the caller reads the list before searching again on this thread (one
            query's transfer): a graph replay then hands out its own output buffers, which the
            next replay overwrites, instead of a copy.

    Returns:
        The ranked candidates, or None when no candidate is left (empty ``pids`` or filter).
    """
    index = _device_index_checked(scorer)
    sharded = getattr(scorer, SHARDED_INDEX_ATTRIBUTE, None)
    graphed = pids is None and filter_fn is None and sharded is None and graphs.capturable(index)
    Q = _check_query(Q, index, cast=not graphed)
    announce(scorer, index, Q.shape[0])
    if graphed:
        # A replay runs no Python per stage: the stage ranges appear only while it is captured.
        with stage_range(SEARCH_GRAPH):
            return graphs.replay(scorer, index, config, Q, _search_pipeline, copy=keep)
    if pids is not None:
        candidates, valid = _as_pid_tensor(pids, index), None
        if filter_fn is not None:
            candidates = _apply_filter(filter_fn, candidates, None, index.device)
        if candidates.numel() == 0:
            return None
        return _stage_4(index, Q, candidates, None, sharded)

    centroid_scores = _centroid_scores(index, config, Q)
    candidates, valid, num_used, keep = _generate_candidates(index, config, centroid_scores)
    if filter_fn is not None:
        candidates, valid = _apply_filter(filter_fn, candidates, valid, index.device), None
        num_used = None
        if candidates.numel() == 0:
            return None
    candidates, valid = _stages_2_and_3(index, config, centroid_scores, candidates, valid, num_used,
                                        keep)
    return _stage_4(index, Q, candidates, valid, sharded, centroid_scores)


def _search_pipeline(index: DeviceIndex, config, Q: torch.Tensor) -> RankedCandidates:
    """Stages 1-4 and the sort for one query, with no host sync: what a CUDA graph captures."""
    centroid_scores = _centroid_scores(index, config, Q)
    candidates, valid, num_used, keep = _generate_candidates(index, config, centroid_scores)
    candidates, valid = _stages_2_and_3(index, config, centroid_scores, candidates, valid, num_used,
                                        keep)
    return _stage_4(index, Q, candidates, valid, None, centroid_scores)


def rank(original, self, config, Q, filter_fn=None, pids=None):
    """Replacement for ``IndexScorer.rank``: same arguments, same ``(pids, scores)`` lists."""
    if Q.dim() == 3 and Q.shape[0] != 1:
        # Several aligned queries: upstream's own contract (one query per passage); not ours.
        counters.count_fallback(_ALIGNED_QUERIES)
        return original(self, config, Q, filter_fn=filter_fn, pids=pids)
    with torch.inference_mode():
        ranked = rank_on_device(self, config, Q, filter_fn=filter_fn, pids=pids, keep=False)
        pids, scores = ([], []) if ranked is None else ranked.to_lists()
    counters.count_search(len(pids))
    return pids, scores


def score_pids(original, self, config, Q, pids, centroid_scores):
    """Replacement for ``IndexScorer.score_pids``: ``(scores, pids)`` on the scoring device.

    With ``centroid_scores`` the candidates go through stages 2-3 first (upstream's search
    path); without, every pid is scored exactly (the rerank path). A Q with several queries
    (upstream's aligned query/passage mode) is left to colbert-ai.
    """
    if Q.dim() == 3 and Q.shape[0] != 1:
        counters.count_fallback(_ALIGNED_QUERIES)
        return original(self, config, Q, pids, centroid_scores)
    index = _device_index_checked(self)
    Q = _check_query(Q, index)
    announce(self, index, Q.shape[0])
    candidates = _as_pid_tensor(pids, index) if not (
        isinstance(pids, torch.Tensor) and pids.device == index.device
    ) else pids.to(torch.int64)
    valid = None
    if centroid_scores is not None and candidates.numel():
        centroid_scores = centroid_scores.to(device=index.device, dtype=torch.float32)
        candidates, valid = _stages_2_and_3(index, config, centroid_scores, candidates, None)
    sharded = getattr(self, SHARDED_INDEX_ATTRIBUTE, None)
    # The scored count stays on the device (read by stats()), so counting adds no sync.
    counters.count_search(candidates.numel() if valid is None else valid.sum())
    if sharded is not None:
        ranked = _stage_4_sharded(sharded, Q, candidates, valid)
        return ranked.scores, ranked.pids.to(torch.int32)
    with stage_range(EXACT_SCORES):
        scores = backends.exact_scores(index, Q, candidates, valid)
    return scores, candidates.to(torch.int32)


def dense_search_knobs(k: int) -> dict:
    """colbert-ai's ``Searcher.dense_search`` defaults for ``k``: ncells,
    centroid_score_threshold and ndocs."""
    if k <= 10:
        return dict(ncells=1, centroid_score_threshold=0.5, ndocs=256)
    if k <= 100:
        return dict(ncells=2, centroid_score_threshold=0.45, ndocs=1024)
    return dict(ncells=4, centroid_score_threshold=0.4, ndocs=max(k * 4, 4096))


def fill_search_knobs(searcher, k: int) -> None:
    """The defaults Searcher.dense_search fills in for k (only knobs still None; they then stick)."""
    for knob, value in dense_search_knobs(k).items():
        if getattr(searcher.config, knob) is None:
            searcher.configure(**{knob: value})


# Queries whose ranked lists stay on the device before one transfer: bounds device memory
# (a few candidate lists each) while keeping host syncs to one per batch.
QUERIES_PER_TRANSFER = 256


def search_all_Q(original, self, queries, Q, k, filter_fn=None, qid_to_pids=None):
    """Replacement for ``Searcher._search_all_Q``: the same Ranking, with one host sync per
    QUERIES_PER_TRANSFER queries instead of several per query.

    Each query still launches its own kernels (candidate lists differ per query), but the
    launches are queued back to back with no sync in between.
    """
    from colbert.data import Ranking
    from colbert.infra.provenance import Provenance

    qids = list(queries.keys())
    if qid_to_pids is None:
        qid_to_pids = {qid: None for qid in qids}
    fill_search_knobs(self, k)
    results = {}
    with torch.inference_mode():
        for first in range(0, len(qids), QUERIES_PER_TRANSFER):
            batch = qids[first : first + QUERIES_PER_TRANSFER]
            pending = [
                rank_on_device(self.ranker, self.config, Q[first + offset : first + offset + 1],
                               filter_fn=filter_fn, pids=qid_to_pids[qid])
                for offset, qid in enumerate(batch)
            ]
            for qid, ranked in zip(batch, pending):
                pids, scores = ([], []) if ranked is None else ranked.to_lists()
                counters.count_search(len(pids))
                results[qid] = list(zip(pids[:k], range(1, k + 1), scores[:k]))

    provenance = Provenance()
    provenance.source = "Searcher::search_all"
    provenance.queries = queries.provenance()
    provenance.config = self.config.export()
    provenance.k = k
    return Ranking(data=results, provenance=provenance)


def colbert_score_packed_exact(original):
    """Replacement factory for ``colbert.modeling.colbert.colbert_score_packed``.

    Exact fp32 MaxSim with -inf masking for the ``colbert`` interaction; ``flipr`` goes to
    the original.
    """
    from colbert.infra.config import ColBERTConfig

    def colbert_score_packed(Q, D_packed, D_lengths, config=ColBERTConfig()):
        if config.interaction != "colbert":
            counters.count_fallback(f"colbert_score_packed with interaction={config.interaction!r}: "
                                    f"scored by colbert-ai's own code")
            return original(Q, D_packed, D_lengths, config)
        device = torch.device("cuda") if config.total_visible_gpus > 0 else D_packed.device
        Q2 = Q.squeeze(0).to(device=device, dtype=torch.float32)
        D = D_packed.to(device=device, dtype=torch.float32)
        lengths = D_lengths.to(device=device, dtype=torch.int64)
        if Q2.dim() != 2 or D.dim() != 2:
            raise ValueError(
                f"colbert_score_packed scores one query: Q [1, Lq, d], D_packed [T, d]; got "
                f"Q {tuple(Q.shape)}, D_packed {tuple(D_packed.shape)}"
            )
        environment.check(device)
        counters.count_search(lengths.numel())
        if backends.backend_for(device) == "triton":
            from tilemaxsim_plaid.ops.dense import maxsim_packed

            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=device)
            torch.cumsum(lengths, 0, out=offsets[1:])
            return maxsim_packed(Q2, D, offsets)
        return backends.segment_maxsim(D @ Q2.T, lengths)

    return colbert_score_packed
