"""PLAID end to end: stock colbert-ai vs the plugin, latency per stage, rerank, equivalence.

Two steps, because the GPU machine has no MiniLM package, no Wikipedia package and no network:

``python -m experiments.bench_plaid prepare --out runs/plaid_bench`` (CPU, here)
    Builds the real index the equivalence numbers come from (Wikipedia leads, MiniLM + fixed
    projection to 128 dims, nbits=2), encodes its queries (Wikidata descriptions) once, and
    saves a tiny random-weight encoder checkpoint of the same dimension, so that the GPU run can
    time ``Searcher.encode`` without carrying MiniLM's 90 MB. A few MB in all.

``python -m experiments.bench_plaid run --bundle runs/plaid_bench --out results/plaid`` (GPU)
    1. End-to-end search latency at k = 10, 100, 1000, stock vs patched, on the real index and
       on a synthetic MS MARCO-like index (tilemaxsim_plaid.synthetic, written on the GPU host),
       with a per-stage breakdown (encode, candidate generation, stages 2-3, stage 4, sort) from
       CUDA events. "Search" is ``Searcher.search``'s two steps, ``encode(text)`` and
       ``dense_search(Q)``, with the query's precomputed embedding passed to dense_search (the
       tiny encoder's own embeddings would make candidate generation meaningless); the
       encode time is reported separately. The same searches are then timed with encoders of
       real sizes built on the GPU host with random weights (``--encoder-shapes``: MiniLM-L6,
       and BERT-base, the shape of colbertv2.0; encoding time does not depend on the weights),
       stock vs patched, recording whether the patched encoder ran as a CUDA graph and whether
       its embeddings were bit-identical to stock's.
    2. Rerank (``pids=``) of 100k and 1M candidates with 32 query tokens on the synthetic index:
       the plugin's scoring time (in every products mode, and the default's also replayed as a
       CUDA graph: its GPU time without the host's launch work) and stock colbert-ai's time on
       the same input.
    3. Equivalence on the real index, every query, k = 10/100/1000: identical top-k fraction
       vs stock GPU PLAID, vs exact fp32 MaxSim over the same candidates, and vs exhaustive
       exact MaxSim over the whole collection; ties within 1e-4 counted separately.
    4. Host syncs in the patched search before its final top-k, counted with
       ``torch.cuda.set_sync_debug_mode("warn")``.

"Stock" is colbert-ai with only the plugin's compat group (torch stand-ins for its CUDA
extensions, which cannot be compiled without nvcc; they are bit-identical), "patched" is every
group. Writes ``<out>/plaid.json`` + ``.csv`` and prints a short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import torch

__all__ = ["main", "prepare_bundle", "run_benchmark"]

# Diagnostics go to stderr through logging; the summary table and JSON go to stdout.
log = logging.getLogger(__name__)

BUNDLE_INDEX_NAME = "wiki.nbits2"
BUNDLE_QUERIES = "queries.pt"
BUNDLE_ENCODER = "tiny_encoder"
# 2,000 passages x ~80 tokens x (4 B code + 32 B residual) ~ 6 MB: small enough to carry.
BUNDLE_PASSAGES = 2000
BUNDLE_QUERY_COUNT = 2000
KS = (10, 100, 1000)
RERANK_SIZES = (100_000, 1_000_000)
TIE_TOLERANCE = 1e-4
# The plugin is timed twice: as users run it (each query one CUDA graph replay, so its stages
# cannot be told apart) and eagerly, where each stage is timed with CUDA events.
STOCK, PATCHED, PATCHED_EAGER = "colbert-ai", "tilemaxsim", "tilemaxsim-eager"


# --------------------------------------------------------------------------- prepare (CPU)

# Encoder shapes timed on the GPU with random weights (encoding time does not depend on the
# weights' values): MiniLM-L6 (the offline checkpoints) and BERT-base (colbertv2.0's shape).
ENCODER_SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "minilm-l6": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def _random_encoder(out: pathlib.Path, work_dir: pathlib.Path, shape: str, dim: int,
                    tokenizer_dir: str) -> str:
    """A BERT of one of :data:`ENCODER_SHAPES` with random weights and the given tokenizer,
    saved as a colbert checkpoint at ``out``."""
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.base_colbert import BaseColBERT
    from transformers import AutoTokenizer, BertConfig, BertModel

    from tilemaxsim_plaid.plaid.registry import enabled

    raw = work_dir / f"{shape}_bert"  # the plain HF model, not carried
    torch.manual_seed(0)
    BertModel(BertConfig(**ENCODER_SHAPES[shape])).save_pretrained(raw)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(raw)
    with enabled(["compat"]):
        model = BaseColBERT(str(raw), colbert_config=ColBERTConfig(checkpoint=str(raw), dim=dim))
        model.save(str(out))
    return str(out)


def _tiny_encoder(out_dir: pathlib.Path, work_dir: pathlib.Path, dim: int) -> str:
    """A 2-layer, 64-wide BERT with MiniLM's tokenizer and random weights, as a colbert checkpoint."""
    from tilemaxsim_plaid.plaid.checkpoint import minilm_model_dir

    return _random_encoder(out_dir / BUNDLE_ENCODER, work_dir, "tiny", dim, str(minilm_model_dir()))


def prepare_bundle(out: pathlib.Path, passages: int = BUNDLE_PASSAGES) -> dict:
    """Build the carried bundle on this (CPU) machine. See the module docstring."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    from tests.fixtures_plaid import wiki_passages_and_queries
    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint, build_plaid_index
    from tilemaxsim_plaid.plaid.registry import enabled

    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / (out.name + ".work")
    checkpoint = build_minilm_checkpoint(work / "minilm128", dim=128)
    texts, queries = wiki_passages_and_queries(passages)
    build_plaid_index(checkpoint, texts, out / "indexes", BUNDLE_INDEX_NAME, nbits=2)
    queries = queries[:BUNDLE_QUERY_COUNT]
    with enabled(["compat"]):
        encoder = Checkpoint(checkpoint, colbert_config=ColBERTConfig.load_from_checkpoint(checkpoint),
                             verbose=0)
        Q = encoder.queryFromText(queries, bsize=128, to_cpu=True)
    torch.save({"Q": Q.half(), "texts": queries, "relevant_pids": list(range(len(queries)))},
               out / BUNDLE_QUERIES)
    _tiny_encoder(out, work, dim=128)
    return {"bundle": str(out), "passages": len(texts), "queries": len(queries)}


# --------------------------------------------------------------------------- timing helpers

class StageClock:
    """CUDA-event (or perf_counter) spans by stage name, summed per query."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.spans: list[tuple[str, object, object]] = []

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextlib.contextmanager
    def stage(self, name: str):
        start = self._mark()
        try:
            yield
        finally:
            self.spans.append((name, start, self._mark()))

    def collect(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        totals: dict[str, float] = {}
        for name, start, end in self.spans:
            ms = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
            totals[name] = totals.get(name, 0.0) + ms
        self.spans.clear()
        return totals


@contextlib.contextmanager
def _instrumented(clock: StageClock, provider: str):
    """Wrap the functions that start and end each stage with clock spans (restored on exit)."""
    import colbert.search.index_storage as index_storage
    from colbert.search.index_storage import IndexScorer

    from tilemaxsim_plaid.plaid import backends, scoring

    def timed(owner, name, stage):
        original = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)

        def wrapper(*args, **kwargs):
            with clock.stage(stage):
                return original(*args, **kwargs)

        setattr(owner, name, wrapper)
        return owner, name, original

    if provider in (PATCHED, PATCHED_EAGER):
        patches = [timed(scoring, "_centroid_scores", "candidates"),
                   timed(scoring, "_generate_candidates", "candidates"),
                   timed(scoring, "_stages_2_and_3", "stages_2_3"),
                   timed(backends, "exact_scores", "stage_4")]
    else:
        patches = [timed(IndexScorer, "retrieve", "candidates"),
                   timed(IndexScorer, "lookup_pids", "stage_4"),
                   timed(index_storage, "colbert_score_packed", "stage_4"),
                   timed(IndexScorer, "score_pids", "score_pids")]
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


# The stage-4 products modes timed and checked beside the default, "auto" (plaid/backends.py).
OTHER_PRODUCTS = ("tf32x3", "fp16x2", "fp16")


@contextlib.contextmanager
def _stage_4_products(choice: str):
    """The plugin's stage-4 products (TILEMAXSIM_PLAID_PRODUCTS) set inside the block."""
    from tilemaxsim_plaid.plaid.backends import PRODUCTS_ENV_VAR

    before = os.environ.get(PRODUCTS_ENV_VAR)
    os.environ[PRODUCTS_ENV_VAR] = choice
    try:
        yield
    finally:
        if before is None:
            del os.environ[PRODUCTS_ENV_VAR]
        else:
            os.environ[PRODUCTS_ENV_VAR] = before


def _median(values):
    return statistics.median(values) if values else None


def _patch_as(provider: str) -> None:
    """Put colbert-ai in the state ``provider`` is timed in: stock is the compat group only (torch
    stand-ins for the CUDA extensions), every other provider the whole plugin."""
    from tilemaxsim_plaid.plaid import registry

    registry.disable()
    registry.enable(["compat"] if provider == STOCK else None)


_SEARCH_KEYS = ("search", "search_call", "encode", "dense_search", "candidates", "stages_2_3",
                "stage_4", "sort")


def _search_latency(searcher, texts, Qs, k, provider, cuda, warmup=3):
    """Per-query wall time of encode + dense_search, and the median and mean of each stage (None
    for the plugin's graph path, whose stages run inside one replay)."""
    return _stage_medians(_search_spans(searcher, texts, Qs, k, provider, cuda, warmup), provider)


def _stage_medians(rows: list[dict], provider: str) -> dict:
    """``{key: median}`` and ``{"mean_" + key: mean}`` over the queries: each query's stages add
    up to its encode + dense_search, so the means do too (the stage plot draws them)."""
    staged = provider != PATCHED
    summary = {}
    for key in _SEARCH_KEYS:
        values = [r.get(key, 0.0) for r in rows] if staged or key in rows[0] else None
        summary[key] = _median(values) if values else None
        summary[f"mean_{key}"] = statistics.fmean(values) if values else None
    return summary


def _search_spans(searcher, texts, Qs, k, provider, cuda, warmup=3) -> list[dict]:
    """One dict of stage times (ms) per query, "search" being the wall time of the query."""
    from tilemaxsim_plaid.plaid import graphs

    _patch_as(provider)
    searcher.configure(ncells=None, centroid_score_threshold=None, ndocs=None)
    clock = StageClock(cuda)
    staged = provider != PATCHED
    def mode():
        return graphs.disabled() if provider == PATCHED_EAGER else contextlib.nullcontext()

    with mode():
        for i in range(min(warmup, len(texts))):
            searcher.encode(texts[i])
            searcher.dense_search(Qs[i : i + 1], k)
    rows = []
    with mode(), (_instrumented(clock, provider) if staged else contextlib.nullcontext()):
        for text, Q in zip(texts, Qs):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            with clock.stage("encode"):
                searcher.encode(text)
            with clock.stage("dense_search"):
                searcher.dense_search(Q[None], k)
            wall = (time.perf_counter() - start) * 1e3
            spans = clock.collect()
            # Searcher.search itself on the same text: encode and rank back to back, where the
            # spans above time the halves apart and rank the bundle's stored query.
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            searcher.search(text, k=k)
            spans["search_call"] = (time.perf_counter() - start) * 1e3
            clock.collect()  # drop the stage spans the call made
            if provider == STOCK:
                # score_pids holds stages 2-3 and stage 4; stage 4 starts at lookup_pids.
                spans["stages_2_3"] = spans.pop("score_pids", 0.0) - spans.get("stage_4", 0.0)
            if staged:
                spans["sort"] = spans["dense_search"] - sum(
                    spans.get(s, 0.0) for s in ("candidates", "stages_2_3", "stage_4"))
            spans["search"] = wall
            rows.append(spans)
    return rows


# --------------------------------------------------------------------------- equivalence

def _equivalence(searcher, Qs, k, cuda):
    """Identical top-k fractions of the plugin vs stock GPU PLAID, vs exact rescoring of the
    same candidates, and vs exhaustive exact MaxSim over the collection."""
    from tilemaxsim_plaid.plaid.backends import decompress_tokens, products_for, segment_maxsim
    from tilemaxsim_plaid.plaid.device_index import device_index

    from tilemaxsim_plaid.plaid import graphs

    def ranked(provider):
        _patch_as(provider)
        searcher.configure(ncells=None, centroid_score_threshold=None, ndocs=None)
        with graphs.disabled() if provider == PATCHED_EAGER else contextlib.nullcontext():
            return [searcher.dense_search(Q[None], k) for Q in Qs]

    stock, ours, eager = ranked(STOCK), ranked(PATCHED), ranked(PATCHED_EAGER)
    faster = {}
    for products in OTHER_PRODUCTS:
        with _stage_4_products(products):
            faster[products] = ranked(PATCHED)
    index = device_index(searcher.ranker)
    everything = torch.arange(index.num_docs, device=index.device)
    rows = torch.arange(index.num_tokens, device=index.device)
    D = decompress_tokens(index, rows)  # the whole collection, fp32 (small real index)
    counts = dict(same_as_stock=0, same_as_stock_up_to_ties=0, same_as_exact_rescore=0,
                  exact_rescore_ties=0, same_as_exhaustive=0, exhaustive_ties=0, exhaustive_recall=0.0)
    for products in OTHER_PRODUCTS:
        counts[f"{products}_same_as_exact_rescore"] = counts[f"{products}_exact_rescore_ties"] = 0
    for i, (Q, (s_pids, _, _), (o_pids, _, o_scores)) in enumerate(zip(Qs, stock, ours)):
        exact = segment_maxsim(D @ Q.to(index.device, torch.float32).T, index.doclens)
        candidates = torch.tensor(o_pids, device=index.device)
        top = lambda pool: pool[torch.sort(exact[pool], descending=True, stable=True).indices][:k].tolist()
        for name, reference in (("stock", s_pids), ("exact_rescore", top(candidates)),
                                ("exhaustive", top(everything))):
            same = reference == o_pids
            tie = (not same and len(reference) == len(o_pids)
                   and all(abs(float(exact[a]) - float(exact[b])) <= TIE_TOLERANCE
                           for a, b in zip(reference, o_pids)))
            if name == "exhaustive":
                # PLAID's candidate pruning is approximate by design: how much of the true top-k it keeps.
                counts["exhaustive_recall"] += len(set(reference) & set(o_pids)) / max(len(reference), 1)
            key = "same_as_stock" if name == "stock" else f"same_as_{name}"
            counts[key] += same
            counts["same_as_stock_up_to_ties" if name == "stock" else f"{name}_ties"] += tie
        # The other stage-4 products, against the exact order of their own candidates.
        for products, lists in faster.items():
            f_pids = lists[i][0]
            reference = top(torch.tensor(f_pids, device=index.device))
            same = reference == f_pids
            counts[f"{products}_same_as_exact_rescore"] += same
            counts[f"{products}_exact_rescore_ties"] += (
                not same and len(reference) == len(f_pids)
                and all(abs(float(exact[a]) - float(exact[b])) <= TIE_TOLERANCE
                        for a, b in zip(reference, f_pids)))
    # The graph replays must give the eager path's lists and scores exactly (same kernels).
    counts["graph_equals_eager"] = sum(a == b for a, b in zip(ours, eager))
    _patch_as(PATCHED)
    return ({key: value / len(Qs) for key, value in counts.items()}
            | {"queries": len(Qs), "k": k, "default_products": products_for(index, Qs[0].shape[0])})


# --------------------------------------------------------------------------- rerank

def _rerank(searcher, Q, sizes, cuda, stock_max=RERANK_SIZES[-1]):
    from .harness import graph_replay_ms, time_ms
    from tilemaxsim_plaid.plaid import backends
    from tilemaxsim_plaid.plaid.device_index import device_index

    results = []
    generator = torch.Generator().manual_seed(0)
    for size in sizes:
        num_docs = int(searcher.ranker.doclens.numel())
        pids = torch.randint(0, num_docs, (size,), generator=generator)
        _patch_as(PATCHED)
        index = device_index(searcher.ranker)
        Q_dev = Q.to(index.device, torch.float32)
        pids_dev = pids.to(index.device)
        graph_ms = None
        if cuda:
            ours = time_ms(lambda: backends.exact_scores(index, Q_dev, pids_dev), warmup_ms=50, rep_ms=500)
            graph_ms = graph_replay_ms(lambda: backends.exact_scores(index, Q_dev, pids_dev))
            fast = {}
            for products in OTHER_PRODUCTS:
                with _stage_4_products(products):
                    fast[products] = time_ms(lambda: backends.exact_scores(index, Q_dev, pids_dev),
                                             warmup_ms=50, rep_ms=500)
        else:
            start = time.perf_counter()
            backends.exact_scores(index, Q_dev, pids_dev)
            ours = ((time.perf_counter() - start) * 1e3,) * 3
            fast = {products: (None,) * 3 for products in OTHER_PRODUCTS}
        start = time.perf_counter()
        searcher.ranker.rank(searcher.config, Q[None], pids=pids.tolist())
        ours_rank_wall = (time.perf_counter() - start) * 1e3
        row = {"size": size, "tokens": int(searcher.ranker.doclens[pids].sum()),
               "ours_scoring_ms": ours[0], "ours_scoring_p20": ours[1], "ours_scoring_p80": ours[2],
               "ours_scoring_graph_ms": graph_ms, "ours_rank_wall_ms": ours_rank_wall,
               "default_products": backends.products_for(index, Q_dev.shape[0])}
        row |= {f"ours_{products}_scoring_ms": fast[products][0] for products in OTHER_PRODUCTS}
        if size <= stock_max:
            _patch_as(STOCK)
            # Q on the scoring device: with a CPU Q, stock's rank() indexes CPU pids with CUDA
            # indices and fails (upstream GPU rerank expects Q where the scores end up).
            Q_stock = Q_dev[None].half() if cuda else Q[None]
            searcher.ranker.rank(searcher.config, Q_stock, pids=pids[:1000].tolist())  # warm-up
            walls = []
            for _ in range(3):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                searcher.ranker.rank(searcher.config, Q_stock, pids=pids.tolist())
                if cuda:
                    torch.cuda.synchronize()
                walls.append((time.perf_counter() - start) * 1e3)
            row["stock_rank_wall_ms"] = _median(walls)
        results.append(row)
    _patch_as(PATCHED)
    return results


def sync_site(stack: list[traceback.FrameSummary]) -> str:
    """Where a synchronizing operation came from: the innermost frame outside torch (the code
    that asked for it), then the torch frame the warning names, each as two path parts and a
    line ("cuda/__init__.py" alone does not say which call of ours synchronized)."""

    def where(frame: traceback.FrameSummary) -> str:
        return f"{'/'.join(pathlib.Path(frame.filename).parts[-2:])}:{frame.lineno}"

    frames = [f for f in stack if not f.filename.endswith("warnings.py")]
    in_torch = [f for f in frames if f"{os.sep}torch{os.sep}" in f.filename]
    outside = [f for f in frames if f"{os.sep}torch{os.sep}" not in f.filename]
    if not outside:
        return where(frames[-1]) if frames else "?"
    site = where(outside[-1])
    if in_torch and frames.index(in_torch[-1]) > frames.index(outside[-1]):
        site += f" (via {where(in_torch[-1])})"
    return site


def is_sync_warning(message: str) -> bool:
    """True for the warning sync debug mode gives at a synchronizing operation, not for the one
    ``set_sync_debug_mode`` itself gives once per process ("Synchronization debug mode is a
    prototype feature and does not detect all synchronizing operations")."""
    return "called a synchronizing" in message


def _syncs_in(fn) -> list[str]:
    """Where (see :func:`sync_site`) each synchronizing CUDA operation ``fn()`` performs is."""
    torch.cuda.synchronize()
    sites = []

    def record(message, category, filename, lineno, file=None, line=None):
        if is_sync_warning(str(message)):
            sites.append(sync_site(traceback.extract_stack()[:-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def _count_syncs(searcher, Q, k, text) -> dict:
    """Host syncs inside the patched search before the final transfer of its ranked list, and
    inside the patched ``Searcher.encode`` of one query, with where each happens."""
    from tilemaxsim_plaid.plaid import registry
    from tilemaxsim_plaid.plaid.scoring import fill_search_knobs, rank_on_device

    registry.enable()
    searcher.configure(ncells=None, centroid_score_threshold=None, ndocs=None)
    fill_search_knobs(searcher, k)
    Q = Q.cuda()  # the query's upload is not part of what is counted
    rank_on_device(searcher.ranker, searcher.config, Q[None])  # warm: builds the device index
    searcher.encode(text)  # warm: captures the encoder graph

    def search():
        with torch.inference_mode():
            rank_on_device(searcher.ranker, searcher.config, Q[None])

    search_syncs = _syncs_in(search)
    encode_syncs = _syncs_in(lambda: searcher.encode(text))
    return {"syncs_before_topk": len(search_syncs), "syncs_before_topk_at": search_syncs,
            "syncs_in_encode": len(encode_syncs), "syncs_in_encode_at": encode_syncs}


# --------------------------------------------------------------------------- run (GPU)

def _searcher(index_root, index_name, checkpoint):
    from colbert import Searcher
    from colbert.infra import Run, RunConfig

    with Run().context(RunConfig(nranks=1, avoid_fork_if_possible=True)):
        return Searcher(index=index_name, index_root=str(index_root), checkpoint=checkpoint, verbose=0)


def _prepare_colbert_imports() -> None:
    """Let ``import colbert`` succeed on a host with only colbert-ai's pure-Python wheels.

    GitPython refuses to import without a git binary unless told to stay quiet (colbert-ai
    imports it only to record the commit in saved configs). colbert.modeling.checkpoint imports
    scipy's hierarchical clustering at module level for token pooling, which search never
    uses; without scipy, a stand-in module that raises on use is registered, and said so.
    """
    import importlib.machinery
    import importlib.util
    import types

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    if importlib.util.find_spec("scipy") is not None:
        return
    import transformers  # noqa: F401  (its optional-package probes must not see the stand-in)

    def unavailable(*args, **kwargs):
        raise RuntimeError("token pooling (pool_factor > 1) needs scipy, which is not installed")

    modules = {}
    for name in ("scipy", "scipy.cluster", "scipy.cluster.hierarchy"):
        modules[name] = types.ModuleType(name)
        modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["scipy.cluster.hierarchy"].linkage = modules["scipy.cluster.hierarchy"].fcluster = unavailable
    modules["scipy"].cluster = modules["scipy.cluster"]
    modules["scipy.cluster"].hierarchy = modules["scipy.cluster.hierarchy"]
    sys.modules.update(modules)
    log.warning("bench_plaid: scipy is not installed; colbert-ai's token pooling is disabled "
                "(search does not use it)")


def run_benchmark(args) -> list[dict]:
    _prepare_colbert_imports()
    from tilemaxsim_plaid.plaid import registry

    registry.enable()
    cuda = torch.cuda.is_available()
    bundle = pathlib.Path(args.bundle)
    encoder = str(bundle / BUNDLE_ENCODER)
    carried = torch.load(bundle / BUNDLE_QUERIES)
    rows: list[dict] = []

    wiki = _searcher(bundle / "indexes", BUNDLE_INDEX_NAME, encoder)
    texts, Qs = carried["texts"], carried["Q"].float()
    n = min(args.num_queries, len(texts))
    for k in args.ks:
        for provider in (STOCK, PATCHED, PATCHED_EAGER):
            stages = _search_latency(wiki, texts[:n], Qs[:n], k, provider, cuda)
            rows.append({"suite": "search", "shape": f"wiki{wiki.ranker.doclens.numel()} k={k}",
                         "provider": provider, "ms": stages["search"], **stages})
    if args.encoder_shapes:
        rows += _encoder_rows(wiki, texts[:n], Qs[:n], args, encoder, cuda)
    for k in args.ks:
        equivalence = _equivalence(wiki, Qs[: args.equivalence_queries], k, cuda)
        rows.append({"suite": "equivalence", "shape": f"wiki k={k}", "provider": PATCHED, **equivalence})
    if cuda:
        rows.append({"suite": "syncs", "shape": "wiki k=10", "provider": PATCHED,
                     **_count_syncs(wiki, Qs[0], 10, texts[0])})

    if args.synthetic_passages:
        from tilemaxsim_plaid.synthetic import (SyntheticIndexSpec, load_synthetic_queries,
                                                synthetic_index_complete, write_synthetic_index)

        path = pathlib.Path(args.synthetic_dir)
        spec = SyntheticIndexSpec(num_passages=args.synthetic_passages, checkpoint=encoder)
        if not synthetic_index_complete(path, spec):
            write_synthetic_index(spec, path, progress=False)
        synthetic = _searcher(path.parent, path.name, encoder)
        synthetic_Q = load_synthetic_queries(path)[0].float()
        m = min(args.num_queries, synthetic_Q.shape[0])
        synthetic_texts = [texts[i % len(texts)] for i in range(m)]
        for k in args.ks:
            for provider in (STOCK, PATCHED, PATCHED_EAGER):
                stages = _search_latency(synthetic, synthetic_texts, synthetic_Q[:m], k, provider, cuda)
                rows.append({"suite": "search", "shape": f"synthetic{args.synthetic_passages} k={k}",
                             "provider": provider, "ms": stages["search"], **stages})
        for row in _rerank(synthetic, synthetic_Q[0], args.rerank_sizes, cuda, args.stock_rerank_max):
            rows.append({"suite": "rerank", "shape": f"pids={row['size']} Lq=32", "provider": PATCHED,
                         "ms": row["ours_scoring_ms"], **row})
    return rows


def _encoder_rows(searcher, texts, Qs, args, tokenizer_dir, cuda) -> list[dict]:
    """Whole ``Searcher.search`` latency with encoders of real sizes (random weights, built
    here), stock vs patched, and whether the patched encoder ran as a CUDA graph with output
    bit-identical to stock's."""
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    from tilemaxsim_plaid.plaid import encoder_graphs, query_tokens, registry

    rows = []
    original = searcher.checkpoint
    # Random weights (440 MB for BERT-base) stay out of the results folder, which is returned.
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_plaid_encoders_"))
    try:
        for shape in args.encoder_shapes:
            path = _random_encoder(work / shape, work, shape, searcher.config.dim, tokenizer_dir)
            checkpoint = Checkpoint(path, colbert_config=ColBERTConfig.load_from_checkpoint(path), verbose=0)
            searcher.checkpoint = checkpoint.cuda() if cuda else checkpoint
            probe = texts[: min(16, len(texts))]
            _patch_as(STOCK)
            stock_Q = [searcher.encode(t) for t in probe]
            registry.enable()
            patched_Q = [searcher.encode(t) for t in probe]
            identical = sum(torch.equal(a, b) for a, b in zip(stock_Q, patched_Q)) / len(probe)
            graphs_made = searcher.checkpoint.__dict__.get(encoder_graphs._CACHE_ATTRIBUTE, {})
            graphed = any(g is not None for g in graphs_made.values())
            hosts = searcher.checkpoint.query_tokenizer.__dict__.get(query_tokens._CACHE_ATTRIBUTE, {})
            host_tokens = any(h is not None for h in hosts.values())
            for k in args.ks:
                # Stock's Python-bound time drifts by tens of percent over a run, so the two
                # systems alternate in blocks of queries and each median pools every block.
                spans = {STOCK: [], PATCHED: []}
                for _ in range(args.encoder_rounds):
                    for provider in spans:
                        spans[provider] += _search_spans(searcher, texts, Qs, k, provider, cuda)
                for provider, provider_spans in spans.items():
                    stages = _stage_medians(provider_spans, provider)
                    rows.append({"suite": "search", "shape": f"wiki k={k} encoder={shape}",
                                 "provider": provider, "ms": stages["search"], **stages,
                                 "queries": len(provider_spans),
                                 "encoder_graph": graphed if provider == PATCHED else False,
                                 "encoder_host_tokens": host_tokens if provider == PATCHED else False,
                                 "encoder_same_as_stock": identical})
    finally:
        searcher.checkpoint = original
        registry.enable()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _print_summary(rows: list[dict]) -> None:
    print(f"{'suite':<12} {'shape':<30} {'provider':<16} {'ms':>9} {'enc':>7} {'cand':>7} "
          f"{'st2-3':>7} {'st4':>7} {'sort':>7}  extra")
    for row in rows:
        cells = [row.get(key) for key in ("ms", "encode", "candidates", "stages_2_3", "stage_4", "sort")]
        text = " ".join(f"{c:>7.3f}" if isinstance(c, float) else f"{'-':>7}" for c in cells[1:])
        ms = f"{cells[0]:>9.3f}" if isinstance(cells[0], float) else f"{'-':>9}"
        extra = {key: (round(value, 4) if isinstance(value, float) else value) for key, value in row.items()
                 if key.startswith(("same_as", "exact_", "exhaustive_", "stock_rank", "syncs", "graph_",
                                    "fp16", "ours_fp16", "encoder_", "search_call"))}
        print(f"{row['suite']:<12} {row['shape']:<30} {row['provider']:<16} {ms} {text}  {extra or ''}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_plaid", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="CPU: build the carried bundle")
    prep.add_argument("--out", default="runs/plaid_bench")
    prep.add_argument("--passages", type=int, default=BUNDLE_PASSAGES)
    run = sub.add_parser("run", help="GPU: the benchmark")
    run.add_argument("--bundle", default="runs/plaid_bench")
    run.add_argument("--out", default="results/plaid")
    run.add_argument("--ks", type=int, nargs="+", default=list(KS))
    run.add_argument("--num-queries", type=int, default=64, help="queries timed per (k, provider)")
    run.add_argument("--equivalence-queries", type=int, default=BUNDLE_QUERY_COUNT)
    run.add_argument("--synthetic-passages", type=int, default=1_000_000, help="0 skips the synthetic index")
    run.add_argument("--synthetic-dir", default="runs/plaid_bench_synthetic/synthetic.nbits2")
    run.add_argument("--encoder-shapes", nargs="*", default=["minilm-l6", "bert-base"],
                     choices=sorted(ENCODER_SHAPES), help="also time whole searches with these encoders")
    run.add_argument("--encoder-rounds", type=int, default=4,
                     help="blocks of --num-queries queries per system, alternated, for the encoder rows")
    run.add_argument("--rerank-sizes", type=int, nargs="+", default=list(RERANK_SIZES))
    run.add_argument("--stock-rerank-max", type=int, default=RERANK_SIZES[-1],
                     help="largest pids= list to time stock colbert-ai on")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:  # a caller that configured logging keeps its own
        logging.basicConfig(format="%(message)s")
    if args.command == "prepare":
        print(json.dumps(prepare_bundle(pathlib.Path(args.out), args.passages)))
        return 0
    from .harness import write_results

    rows = run_benchmark(args)
    path = write_results(rows, args.out, "plaid", meta={"argv": sys.argv if argv is None else argv})
    print(f"wrote {path}")
    _print_summary(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
