"""One CUDA graph per (index, search settings, query length) for the plugin's search path.

After the index is on the device, a PLAID query is a few dozen small launches (centroid scores,
top cells, candidate bitmap, two centroid-interaction passes, two top-ks, the fused exact
scorer, a sort) over a few thousand candidates: microseconds of GPU work each, so eager
execution is bound by Python and launch overhead. Every size in that pipeline is fixed on the
host (candidate lists have a fixed capacity and a validity mask, see scoring.py), so the whole
query can be captured once and replayed: one launch per query.

A graph is captured on the first query with a new key and kept on the IndexScorer next to the
device index; a changed index (new source tensors) gets new graphs. Queries with ``filter_fn``,
``pids=`` or a sharded index run eagerly (their sizes depend on data). If capture fails the
reason is logged once and that key runs eagerly from then on.

``TILEMAXSIM_PLAID_CUDA_GRAPHS=0`` (or false/no/off) turns graphs off; :func:`disabled` does so for a block (the
benchmarks time each stage eagerly, which a graph would hide).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

from tilemaxsim_plaid.plaid import backends, counters
from tilemaxsim_plaid.plaid.environment import GRAPHS_ENV_VAR, cuda_graphs_allowed

__all__ = ["GRAPHS_ENV_VAR", "capturable", "disabled", "enabled_for_device", "replay"]

logger = logging.getLogger(__name__)

_CACHE_ATTRIBUTE = "_tilemaxsim_search_graphs"
# Graphs kept per IndexScorer (one per distinct (search settings, query length)); each holds
# its own buffers (a candidate bitmap of num_docs bytes and a few candidate lists).
MAX_GRAPHS_PER_SCORER = 16

_disabled_depth = 0
_EAGER_SEARCH = "search ran eagerly: its CUDA graph failed to capture"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the search path eagerly inside the block."""
    global _disabled_depth
    _disabled_depth += 1
    try:
        yield
    finally:
        _disabled_depth -= 1


def enabled_for_device(device: torch.device) -> bool:
    """True when the plugin may capture and replay CUDA graphs on ``device`` now: a GPU, graphs
    not turned off (environment variable, :func:`disabled`), no capture already under way."""
    if _disabled_depth or not cuda_graphs_allowed():
        return False
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def capturable(index) -> bool:
    """True when the search path of ``index`` runs as a CUDA graph."""
    return enabled_for_device(index.device) and backends.backend_for(index.device) == "triton"


class _CapturedSearch:
    """A captured ``pipeline(index, config, Q)`` with its static query buffer and outputs."""

    def __init__(self, index, config, num_query_tokens: int, pipeline: Callable):
        device = index.device
        self.Q = torch.zeros(num_query_tokens, index.dim, dtype=torch.float32, device=device)
        # Warm up on a side stream (as torch.cuda.graphs asks): compiles the Triton kernels and
        # fills every cache before capture, so capture records launches only.
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            pipeline(index, config, self.Q)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = pipeline(index, config, self.Q)

    def __call__(self, Q: torch.Tensor, copy: bool = True):
        self.Q.copy_(Q)  # casts to fp32 on the way in
        self.graph.replay()
        # The outputs are overwritten by the next replay: a copy, unless the caller reads them first.
        return self.out.clone() if copy else self.out


def _search_key(index, config, Q: torch.Tensor) -> tuple:
    return (index.source_key, int(Q.shape[0]), int(config.ncells),
            float(config.centroid_score_threshold), int(config.ndocs), int(config.query_maxlen),
            backends.products_for(index, int(Q.shape[0])))


def replay(scorer, index, config, Q: torch.Tensor, pipeline: Callable, copy: bool = True):
    """``pipeline(index, config, Q)`` through the scorer's graph for this key (captured on first
    use); eagerly if capture failed for this key before. ``Q`` may be of any float dtype (the
    graph's input copy casts it to fp32). With ``copy=False`` the result is the graph's own
    output, valid until the next replay of that graph."""
    graphs = scorer.__dict__.setdefault(_CACHE_ATTRIBUTE, {})
    for stale in [key for key in graphs if key[0] != index.source_key]:
        del graphs[stale]  # captured over an index copy that has since been replaced
    key = _search_key(index, config, Q)
    if key not in graphs:
        if len(graphs) >= MAX_GRAPHS_PER_SCORER:
            graphs.pop(next(iter(graphs)))  # the oldest; its memory returns to the allocator
        try:
            with torch.inference_mode():
                graphs[key] = _CapturedSearch(index, config, Q.shape[0], pipeline)
        except RuntimeError as error:
            logger.warning("search runs eagerly (CUDA graph capture failed: %s)", error)
            graphs[key] = None
    captured = graphs[key]
    if captured is None:
        counters.count_fallback(_EAGER_SEARCH)
        return pipeline(index, config, Q.to(device=index.device, dtype=torch.float32))
    with torch.inference_mode():
        return captured(Q, copy=copy)
