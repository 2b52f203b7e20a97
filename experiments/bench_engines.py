"""Three PLAID engines on one compressed index: stock colbert-ai, colbert-ai with the plugin, fast-plaid.

``tilemaxsim bench-engines --passages 100000 1000000 --out results/engines/h200-COMMIT``
``tilemaxsim bench-engines --embeddings DIR --out results/engines/h200-COMMIT-NAME``

For each corpus size: a structured synthetic corpus (:mod:`.engine_corpus`) is generated on the
GPU, or with ``--embeddings`` a directory of an encoder's precomputed passage and query
embeddings (:class:`.engine_corpus.EmbeddingCorpus`; rows are labelled by its meta name), and
compressed once into both engines' formats (:mod:`.engine_index`: same centroids,
cutoffs, weights, codes and residual bytes), with exact MaxSim top-k computed on the way over
the uncompressed fp16 embeddings and over the decompressed ones. Then every engine, at each
setting, is timed on what a user calls after encoding: ``Searcher.dense_search`` and
``Searcher._search_all_Q`` (what ``search_all`` runs after encoding) for colbert-ai,
``FastPlaid.search`` for fast-plaid:

* batch-1 latency (p50, p99) over warm queries, wall time around the call, the GPU synchronised;
* throughput over ``--batch`` queries and over ``--throughput-queries`` (MS MARCO dev/small has
  6,980) through each engine's batch API;
* first-query cost (index load to first result), GPU memory (allocator delta) and host memory
  (RSS delta) per engine, and the plugin's GPU bytes per token embedding by tensor;
* recall@10/@100 against exact MaxSim (uncompressed and decompressed) and success@10 against
  each query's target passage.

Settings (``--settings``): ``defaults`` (each engine's own: colbert-ai picks ncells,
centroid_score_threshold and ndocs from k; fast-plaid n_ivf_probe=8, n_full_scores=4096),
``rescore-4096`` (both rescore 4,096 documents exactly from 8 probed centroids per query token:
colbert-ai ncells=8, ndocs=16,384, of which stage 4 keeps ndocs/4; fast-plaid its defaults), and
``sweep`` (k=10 only: a grid per engine, for recall against latency). What still differs:
fast-plaid has no centroid-score threshold and no stage-3 centroid interaction pruning; its
``n_full_scores`` documents are the best by approximate (centroid) score, as colbert-ai's ndocs/4.

Index build time per engine: the shared writer's (k-means, codec, compression, both formats),
fast-plaid's own ``create()`` on corpora up to ``--fast-plaid-create-max`` passages, and
colbert-ai's own ``CollectionIndexer`` on the first ``--colbert-build-max`` passages with the
encoder replaced by the corpus's embeddings (:func:`colbert_indexer_build`), per phase.

``--fairness`` also builds an index with fast-plaid's own ``create()`` on the first passages and
checks that our compressor reproduces its codes and residual bytes exactly from its codec, and
that fast-plaid decompresses our written index exactly as colbert-ai's GPU codec does.

Raw rows go to ``OUT/engines.json`` (harness format); ``tilemaxsim report-engines OUT`` draws
the report. Numbers on the synthetic corpus are synthetic-corpus numbers, never MS MARCO's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import logging
import math
import os
import pathlib
import random
import re
import shutil
import sys
import time

import numpy as np
import torch

from .engine_corpus import Corpus, CorpusSpec, EmbeddingCorpus, ExactTopK
from .engine_index import SharedIndex, write_shared_index

__all__ = ["main", "ENGINES", "SETTINGS", "colbert_searcher", "colbert_indexer_build", "recall_at",
           "success_at"]

logger = logging.getLogger("tilemaxsim.bench_engines")

STOCK, PLUGIN, FAST_PLAID = "colbert-ai", "tilemaxsim", "fast-plaid"
ENGINES = (STOCK, PLUGIN, FAST_PLAID)
SETTINGS = ("defaults", "rescore-4096", "sweep")
MSMARCO_DEV_SMALL_QUERIES = 6_980
# colbert-ai's own k-dependent defaults (Searcher.dense_search); fast-plaid's search() defaults.
FAST_PLAID_DEFAULTS = {"n_ivf_probe": 8, "n_full_scores": 4096}
RESCORE_4096 = {STOCK: {"ncells": 8, "ndocs": 16_384}, FAST_PLAID: {"n_ivf_probe": 8, "n_full_scores": 4096}}
SWEEP = {
    STOCK: [{"ncells": c, "ndocs": n} for c in (1, 2, 4) for n in (256, 1024, 4096)],
    FAST_PLAID: [{"n_ivf_probe": p, "n_full_scores": n} for p in (1, 2, 4, 8) for n in (256, 1024, 4096)],
}


def recall_at(found: list[list[int]], exact: torch.Tensor, k: int) -> float:
    """Mean |found top-k & exact top-k| / k over queries (exact: [B, >=k] pids)."""
    values = [len(set(f[:k]) & set(e[:k].tolist())) / k for f, e in zip(found, exact)]
    return float(np.mean(values)) if values else math.nan


def success_at(found: list[list[int]], targets, k: int) -> float:
    """Fraction of the queries with a target (pid >= 0; -1 is none) that find it in their top k."""
    values = [int(t) in f[:k] for f, t in zip(found, targets) if int(t) >= 0]
    return float(np.mean(values)) if values else math.nan


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _rss() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _gpu_bytes() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def colbert_searcher(index_path):
    """A colbert-ai ``Searcher`` over ``index_path`` without a query encoder.

    ``Searcher.__init__`` loads the checkpoint to encode text; the calls timed here take encoded
    queries (``dense_search``, ``_search_all_Q``), which read only ``config`` and ``ranker``, so
    the searcher is assembled from the same parts ``__init__`` builds, minus the checkpoint."""
    from colbert import Searcher
    from colbert.infra.config import ColBERTConfig
    from colbert.search.index_storage import IndexScorer

    searcher = Searcher.__new__(Searcher)
    searcher.verbose = 0
    searcher.index = str(index_path)
    searcher.index_config = ColBERTConfig.load_from_index(searcher.index)
    searcher.config = ColBERTConfig.from_existing(searcher.index_config)
    searcher.checkpoint = None
    searcher.collection = None
    searcher.ranker = IndexScorer(searcher.index, torch.cuda.is_available(), False)
    return searcher


# --------------------------------------------------------------------------- engines

class _ColbertEngine:
    def __init__(self, name: str, index: SharedIndex):
        from .bench_plaid import PATCHED, STOCK as BENCH_STOCK, _patch_as, _prepare_colbert_imports

        _prepare_colbert_imports()
        self.name = name
        self._activate = lambda: _patch_as(BENCH_STOCK if name == STOCK else PATCHED)
        self._activate()
        self.searcher = colbert_searcher(index.colbert)

    def configure(self, k: int, setting: dict | None):
        self._activate()
        knobs = {"ncells": None, "centroid_score_threshold": None, "ndocs": None}
        knobs.update(setting or {})
        self.searcher.configure(**knobs)

    @staticmethod
    def _encoded(Q: torch.Tensor) -> torch.Tensor:
        """What ``Searcher.encode`` returns: fp16 from the GPU encoder, fp32 on the CPU."""
        return Q if torch.cuda.is_available() else Q.float()

    def search(self, Q: torch.Tensor, k: int) -> list[int]:
        pids, _, _ = self.searcher.dense_search(self._encoded(Q)[None], k)
        return list(pids)

    def search_batch(self, Q: torch.Tensor, k: int) -> list[list[int]]:
        from colbert.data import Queries

        queries = Queries(data={i: f"q{i}" for i in range(Q.shape[0])})
        with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):  # tqdm bar
            ranking = self.searcher._search_all_Q(queries, self._encoded(Q), k)
        return [[pid for pid, *_ in ranking.data[i]] for i in range(Q.shape[0])]

    def memory_breakdown(self) -> dict | None:
        if self.name != PLUGIN:
            return None
        from tilemaxsim_plaid.plaid.device_index import device_index

        index = device_index(self.searcher.ranker)
        seen, rows = set(), {}
        for field in ("codes", "residuals", "inv_norms", "offsets", "doclens", "centroids",
                      "centroids_half", "bucket_weights", "bucket_table", "ivf_pids", "ivf_offsets",
                      "ivf_lengths"):
            tensor = getattr(index, field, None)
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            rows[field] = 0 if key in seen else storage.nbytes()
            seen.add(key)
        rows["per_token"] = sum(rows.values()) / index.num_tokens
        return rows


class _FastPlaidEngine:
    name = FAST_PLAID

    def __init__(self, index: SharedIndex):
        from fast_plaid import search as fast_plaid_search

        self.index = fast_plaid_search.FastPlaid(index=str(index.fast_plaid),
                                                 device="cuda:0" if torch.cuda.is_available() else "cpu")
        self.knobs = dict(FAST_PLAID_DEFAULTS)

    def configure(self, k: int, setting: dict | None):
        self.knobs = dict(FAST_PLAID_DEFAULTS, **(setting or {}))

    def search(self, Q: torch.Tensor, k: int) -> list[int]:
        return self.search_batch(Q[None], k)[0]

    def search_batch(self, Q: torch.Tensor, k: int) -> list[list[int]]:
        results = self.index.search(queries_embeddings=Q.float(), top_k=k, show_progress=False,
                                    **self.knobs)
        return [[pid for pid, _ in row] for row in results]

    def memory_breakdown(self):
        return None


def _make_engine(name: str, index: SharedIndex):
    return _FastPlaidEngine(index) if name == FAST_PLAID else _ColbertEngine(name, index)


# --------------------------------------------------------------------------- measurement

def _latencies(engine, Q: torch.Tensor, k: int, warmup: int) -> tuple[list[float], list[list[int]]]:
    for i in range(min(warmup, Q.shape[0])):
        engine.search(Q[i], k)
    times, found = [], []
    for i in range(Q.shape[0]):
        _sync()
        start = time.perf_counter()
        found.append(engine.search(Q[i], k))
        _sync()
        times.append((time.perf_counter() - start) * 1e3)
    return times, found


def _throughput(engine, Q: torch.Tensor, k: int) -> dict:
    _sync()
    start = time.perf_counter()
    found = engine.search_batch(Q, k)
    _sync()
    seconds = time.perf_counter() - start
    return {"queries": Q.shape[0], "seconds": seconds, "qps": Q.shape[0] / seconds, "found": found}


def _settings_for(name: str, which: str, k: int) -> list[tuple[str, dict | None]]:
    if which == "defaults":
        return [("defaults", None)]
    if which == "rescore-4096":
        return [("rescore-4096", RESCORE_4096[FAST_PLAID if name == FAST_PLAID else STOCK])]
    if which == "sweep" and k == 10:
        grid = SWEEP[FAST_PLAID if name == FAST_PLAID else STOCK]
        return [("sweep " + " ".join(f"{key}={value}" for key, value in s.items()), s) for s in grid]
    return []


class _GroundTruth:
    """Exact top-k over the uncompressed and the decompressed embeddings, chunk by chunk."""

    def __init__(self, corpus: Corpus, Q: torch.Tensor, kmax: int):
        self.corpus, self.Q = corpus, Q
        self.raw = ExactTopK.empty(Q.shape[0], kmax, Q.device)
        self.decompressed = ExactTopK.empty(Q.shape[0], kmax, Q.device)

    def _scores(self, D: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        if D.is_cuda:
            from tilemaxsim_plaid import maxsim_packed

            return maxsim_packed(self.Q, D, offsets)
        from tilemaxsim_plaid import reference

        return reference.maxsim_packed(self.Q.float(), D.float(), offsets, dtype=torch.float32)

    def __call__(self, chunk, first, E, codes, residuals, codec):
        from tilemaxsim_plaid.codecs.residual import decompress_residuals

        if self.Q.shape[0] == 0:
            return
        offsets = self.corpus.chunk_offsets(chunk)
        self.raw.update(self._scores(E, offsets), first)
        D = decompress_residuals(codes, residuals, codec["centroids"].to(E.device, torch.float16),
                                 codec["bucket_weights"].to(E.device, torch.float16),
                                 int(math.log2(codec["bucket_weights"].numel())))
        self.decompressed.update(self._scores(D, offsets), first)


def corpus_label(corpus) -> str:
    """The ``shape`` of a corpus's rows: "100,000 passages", or "NAME 10,033 passages" for an
    embeddings directory (the report keeps corpora of different names apart)."""
    size = f"{corpus.num_passages:,} passages"
    return f"{corpus.name} {size}" if isinstance(corpus, EmbeddingCorpus) else size


def make_corpus(args, passages: int | None, device):
    """The synthetic corpus of ``passages`` passages, or ``args.embeddings``'s directory."""
    if args.embeddings is not None:
        return EmbeddingCorpus(args.embeddings, device=device)
    spec = CorpusSpec(num_passages=passages, num_queries=max(args.throughput_queries, args.batch,
                                                             args.latency_queries), seed=args.seed)
    return Corpus(spec, device)


def prepare(args, corpus, root: pathlib.Path) -> tuple[SharedIndex, dict]:
    Q, targets = corpus.queries()
    index = SharedIndex(root)
    truth_path = root / "ground_truth.pt"
    key = {"corpus": corpus.key(), "nbits": args.nbits, "exact_queries": args.exact_queries}
    if index.manifest_path.exists() and index.manifest.get("complete") and truth_path.exists():
        truth = torch.load(truth_path)
        if truth.get("key") == key:
            return index, {"Q": Q, "targets": targets, **truth}
    exact = _GroundTruth(corpus, Q[: args.exact_queries], 100)
    write_shared_index(corpus, root, nbits=args.nbits, visit=exact, log=logger.info)
    truth = {"key": key, "exact": exact.raw.pids.cpu(), "exact_decompressed": exact.decompressed.pids.cpu(),
             "build": index.manifest}
    torch.save(truth, truth_path)
    return index, {"Q": Q, "targets": targets, **truth}


def fairness_check(corpus: Corpus, root: pathlib.Path, index: SharedIndex, passages: int = 2000) -> dict:
    """fast-plaid's own ``create()`` on the first passages vs our compressor, and fast-plaid's
    decompression of our index vs colbert-ai's GPU codec (``decompress_residuals`` in fp16)."""
    from fast_plaid import search as fast_plaid_search

    from tilemaxsim_plaid.codecs.residual import compress_residuals, decompress_residuals

    n = min(passages, corpus.num_passages)
    E = corpus.chunk(0)[: int(corpus.offsets[n])]
    docs = [E[int(corpus.offsets[p]):int(corpus.offsets[p + 1])].cpu() for p in range(n)]
    own = root / "fairness_fast_plaid"
    engine = fast_plaid_search.FastPlaid(index=str(own), device="cuda:0")
    engine.create(documents_embeddings=docs, nbits=index.manifest["nbits"], seed=42)
    engine.close()
    load = lambda name: torch.from_numpy(np.load(own / name))  # noqa: E731
    codes, residuals = compress_residuals(E, load("centroids.npy").to(E.device),
                                          load("bucket_cutoffs.npy").to(E.device), index.manifest["nbits"])
    theirs_codes, theirs_residuals = load("merged_codes.npy"), load("merged_residuals.npy")
    T = E.shape[0]
    ours = fast_plaid_search.FastPlaid(index=str(index.fast_plaid), device="cuda:0")
    pids = list(range(min(64, corpus.num_passages)))
    reconstructed = torch.cat([t.float().cpu() for t in ours.get_embeddings(pids)])
    ours.close()
    rows = int(corpus.offsets[len(pids)])
    shared_codes = torch.from_numpy(np.load(index.fast_plaid / "merged_codes.npy", mmap_mode="r")[:rows].copy())
    shared_residuals = torch.from_numpy(np.load(index.fast_plaid / "merged_residuals.npy", mmap_mode="r")[:rows].copy())
    weights = torch.from_numpy(np.load(index.fast_plaid / "bucket_weights.npy")).half()
    centroids = torch.from_numpy(np.load(index.fast_plaid / "centroids.npy"))
    ours_decoded = decompress_residuals(shared_codes, shared_residuals, centroids, weights,
                                        index.manifest["nbits"]).float()
    return {"passages": n, "embeddings": T,
            "codes_differ": int((codes.cpu() != theirs_codes[:T]).sum()),
            "residual_bytes_differ": int((residuals.cpu() != theirs_residuals[:T]).sum()),
            "decompressed_max_abs_diff": float((reconstructed - ours_decoded).abs().max())}


def _fast_plaid_create(corpus, root: pathlib.Path, nbits: int, size: str) -> dict:
    """fast-plaid's own index build time on the whole corpus (its k-means, codec and files)."""
    from fast_plaid import search as fast_plaid_search

    docs = []
    for chunk, first, end in corpus.chunk_ranges():
        E, offsets = corpus.chunk(chunk).cpu(), corpus.chunk_offsets(chunk).cpu()
        docs += [E[int(offsets[i]):int(offsets[i + 1])] for i in range(end - first)]
    _sync()
    start = time.perf_counter()
    engine = fast_plaid_search.FastPlaid(index=str(root / "fast_plaid_create"), device="cuda:0")
    engine.create(documents_embeddings=docs, nbits=nbits, seed=42)
    _sync()
    seconds = time.perf_counter() - start
    engine.close()
    return {"suite": "build", "shape": size, "provider": "fast-plaid create()", "seconds": seconds,
            "passages": corpus.num_passages, "num_embeddings": corpus.num_embeddings}


COLBERT_INDEXER = "colbert-ai CollectionIndexer"


class _PrecomputedEncoder:
    """Stands in for colbert-ai's ``CollectionEncoder``: ``encode_passages`` returns the corpus's
    own embeddings of the passages named by pid (the collection's texts are their pids), in the
    dtype the real encoder returns (fp16 on the GPU, fp32 on the CPU; the indexer asserts it)."""

    def __init__(self, documents: list[torch.Tensor], use_gpu: bool):
        self.documents, self.dtype = documents, torch.float16 if use_gpu else torch.float32

    def encode_passages(self, passages):
        if not passages:
            return None, None
        docs = [self.documents[int(text)] for text in passages]
        return torch.cat(docs).to(self.dtype), [int(doc.shape[0]) for doc in docs]


def _faiss_kmeans_device(use_gpu: bool) -> str:
    """Where colbert-ai's ``compute_faiss_kmeans`` runs: ``faiss.Kmeans(gpu=use_gpu)`` takes
    every GPU faiss sees, none with faiss-cpu (then it runs on the CPU without a word)."""
    import importlib.metadata

    import faiss

    dists = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                   if d.metadata["Name"] and d.metadata["Name"].lower().startswith("faiss"))
    gpus = faiss.get_num_gpus() if use_gpu and hasattr(faiss, "get_num_gpus") else 0
    where = f"GPU ({gpus} visible to faiss)" if gpus else "CPU"
    return f"{where}, faiss {faiss.__version__} ({', '.join(dists) or 'no distribution found'})"


def colbert_indexer_build(corpus, root: pathlib.Path, nbits: int, passages: int, size: str,
                          verbose: int = 0) -> dict:
    """colbert-ai 0.2.22's own index build of the first ``passages`` passages, timed per phase.

    ``CollectionIndexer`` is what ``colbert.Indexer.index`` runs in each rank's process; here it
    runs in this process with nranks = 1 and its encoder replaced by :class:`_PrecomputedEncoder`
    (built as ``__init__`` builds it, minus the checkpoint), so the time is the work a user's
    Indexer does after encoding. Phases, by the indexer's own methods: ``setup`` (sample the pids
    and gather their embeddings, plan), ``kmeans`` (``_train_kmeans``: faiss), ``codec``
    (``_compute_avg_residual``: bucket cutoffs and weights), ``train_other`` (shuffle, split and
    save the codec), ``compress`` (``index``: every chunk compressed and saved), ``ivf``
    (``finalize``: metadata and the centroid-to-passage IVF). colbert-ai with the plugin's
    ``compat`` group only, as the stock engine is timed (torch stand-ins for its CUDA extensions).
    """
    from .bench_plaid import STOCK as BENCH_STOCK, _patch_as, _prepare_colbert_imports

    _prepare_colbert_imports()
    _patch_as(BENCH_STOCK)
    from colbert.indexing.collection_indexer import CollectionIndexer
    from colbert.indexing.index_saver import IndexSaver
    from colbert.infra import ColBERTConfig, Run, RunConfig
    from colbert.data.collection import Collection

    n = min(passages, corpus.num_passages)
    documents = []
    for chunk, first, end in corpus.chunk_ranges():
        if first >= n:
            break
        E, offsets = corpus.chunk(chunk).cpu(), corpus.chunk_offsets(chunk).cpu()
        documents += [E[int(offsets[i]):int(offsets[i + 1])] for i in range(min(end, n) - first)]
    path = root / "colbert_indexer"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    config = ColBERTConfig(dim=corpus.dim, nbits=nbits, doc_maxlen=corpus.doc_maxlen,
                           query_maxlen=corpus.query_maxlen, index_path=str(path), nranks=1,
                           avoid_fork_if_possible=True)
    spans: dict[str, float] = {}

    def timed(name, method):
        def wrapper(*args, **kwargs):
            _sync()
            start = time.perf_counter()
            result = method(*args, **kwargs)
            _sync()
            spans[name] = spans.get(name, 0.0) + time.perf_counter() - start
            return result
        return wrapper

    # colbert-ai samples pids with Python's random and shuffles the sample with torch's.
    random.seed(12345)
    torch.manual_seed(12345)
    with Run().context(RunConfig(nranks=1, root=str(root), experiment="colbert_indexer")):
        indexer = CollectionIndexer.__new__(CollectionIndexer)
        indexer.verbose, indexer.config = verbose, config
        indexer.rank, indexer.nranks = 0, 1
        indexer.use_gpu = config.total_visible_gpus > 0
        indexer.collection = Collection.cast([str(pid) for pid in range(n)])
        indexer.checkpoint = None
        indexer.encoder = _PrecomputedEncoder(documents, indexer.use_gpu)
        indexer.saver = IndexSaver(config)
        for name, method in (("setup", "setup"), ("kmeans", "_train_kmeans"),
                             ("codec", "_compute_avg_residual"), ("train", "train"),
                             ("compress", "index"), ("ivf", "finalize")):
            setattr(indexer, method, timed(name, getattr(indexer, method)))
        kmeans_on = _faiss_kmeans_device(indexer.use_gpu)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), \
                contextlib.redirect_stderr(sink):  # faiss's and tqdm's progress
            indexer.run(shared_lists=None)
    train = spans.pop("train")
    phases = {"setup": spans["setup"], "kmeans": spans["kmeans"], "codec": spans["codec"],
              "train_other": train - spans["kmeans"] - spans["codec"], "compress": spans["compress"],
              "ivf": spans["ivf"]}
    return {"suite": "build", "shape": size, "provider": COLBERT_INDEXER, "passages": n,
            "num_embeddings": int(sum(doc.shape[0] for doc in documents)),
            "num_centroids": int(indexer.num_partitions), "nbits": nbits, "kmeans_on": kmeans_on,
            "use_gpu": bool(indexer.use_gpu), "phase_seconds": phases, "seconds": sum(phases.values()),
            "index_path": str(path)}


def run_size(args, passages: int | None, out: pathlib.Path) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    corpus = make_corpus(args, passages, device)
    passages = corpus.num_passages
    size = corpus_label(corpus)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", corpus.name) + "-" if isinstance(corpus, EmbeddingCorpus) else ""
    root = pathlib.Path(args.work) / f"engines-{slug}{passages}"
    started = time.perf_counter()
    index, data = prepare(args, corpus, root)
    build_s = time.perf_counter() - started
    manifest = index.manifest
    rows = [{"suite": "build", "shape": size, "provider": "shared",
             **{key: value for key, value in manifest.items() if key not in ("key", "seconds")},
             "phase_seconds": manifest["seconds"], "seconds": manifest["seconds"]["total"],
             "reused": build_s < manifest["seconds"]["total"]}]
    if isinstance(corpus, EmbeddingCorpus):
        rows[0]["corpus_meta"] = corpus.meta
    has_fast_plaid = importlib.util.find_spec("fast_plaid") is not None
    if FAST_PLAID in args.engines and passages <= args.fast_plaid_create_max and has_fast_plaid:
        rows.append(_fast_plaid_create(corpus, root, index.manifest["nbits"], size))
    if args.colbert_build_max > 0 and (STOCK in args.engines or PLUGIN in args.engines):
        rows.append(colbert_indexer_build(corpus, root, index.manifest["nbits"], args.colbert_build_max, size))
        logger.info("%s: %s", COLBERT_INDEXER, rows[-1])
    if args.build_only:
        return rows
    if args.fairness and FAST_PLAID in args.engines and has_fast_plaid:
        rows.append({"suite": "fairness", "shape": size, "provider": FAST_PLAID,
                     **fairness_check(corpus, root, index)})
        logger.info("fairness: %s", rows[-1])
    Q = data["Q"].cpu()
    targets = data["targets"]
    exact, exact_dec = data["exact"], data["exact_decompressed"]
    nx = exact.shape[0]
    for name in args.engines:
        gc.collect()
        gpu0, rss0 = _gpu_bytes(), _rss()
        load_start = time.perf_counter()
        try:
            engine = _make_engine(name, index)
        except ImportError as error:
            logger.warning("%s is not installed here (%s): skipped", name, error)
            continue
        engine.configure(10, None)
        engine.search(Q[0], 10)
        _sync()
        first_s = time.perf_counter() - load_start
        memory = {"gpu_bytes": _gpu_bytes() - gpu0, "host_bytes": _rss() - rss0,
                  "breakdown": engine.memory_breakdown()}
        rows.append({"suite": "load", "shape": size, "provider": name, "first_query_s": first_s,
                     **memory, "gpu_bytes_per_token": memory["gpu_bytes"] / corpus.num_embeddings})
        latency_queries = args.stock_queries if name == STOCK else args.latency_queries
        for k in args.ks:
            for which in args.settings:
                for label, setting in _settings_for(name, which, k):
                    engine.configure(k, setting)
                    times, found = _latencies(engine, Q[:latency_queries], k, args.warmup)
                    row = {"suite": "latency", "shape": f"{size} k={k}", "provider": name,
                           "setting": label, "k": k, "queries": len(times),
                           "p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
                           "mean_ms": float(np.mean(times)), "ms": float(np.percentile(times, 50))}
                    scored = found[:nx]
                    for cut in (10, 100):
                        if cut <= k:
                            row[f"recall@{cut}"] = recall_at(scored, exact, cut)
                            row[f"recall@{cut}_decompressed"] = recall_at(scored, exact_dec, cut)
                    row["success@10"] = success_at(found, targets, 10)
                    rows.append(row)
                    logger.info("%s %s k=%d %s: p50 %.3f ms, recall@10 %.4f", size, name, k, label,
                                row["p50_ms"], row.get("recall@10", math.nan))
                    if which != "defaults":
                        continue
                    # The dev/small-sized set at k = 10 only: it is the slowest row per engine.
                    throughput_sizes = [args.batch] + ([args.throughput_queries] if k == 10 else [])
                    if name == STOCK:
                        throughput_sizes = [min(args.batch, args.stock_queries)]
                    # An embeddings directory may hold fewer queries than asked for.
                    throughput_sizes = sorted({min(count, Q.shape[0]) for count in throughput_sizes})
                    for count in throughput_sizes:
                        result = _throughput(engine, Q[:count], k)
                        rows.append({"suite": "throughput", "shape": f"{size} k={k} batch={count}",
                                     "provider": name, "setting": label, "k": k, "queries": count,
                                     "seconds": result["seconds"], "qps": result["qps"],
                                     "ms": 1e3 * result["seconds"] / count,
                                     "success@10": success_at(result["found"], targets, 10)})
        if name == PLUGIN and STOCK in args.engines:
            rows.append(_plugin_vs_exact(engine, Q[:nx], index, corpus, size))
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    exact_found = [e.tolist() for e in exact]
    rows.append({"suite": "exact", "shape": size, "provider": "exact fp32 MaxSim",
                 "queries": nx, "success@10": success_at(exact_found, targets[:nx], 10)})
    return rows


RERANK_CHECK_CANDIDATES = 256


def _plugin_vs_exact(engine, Q, index: SharedIndex, corpus, size: str) -> dict:
    """Exactness of the plugin's rankings against exact fp32 MaxSim over the decompressed
    embeddings ``normalize(centroid + weight)`` taken in fp32 (the plugin's semantics;
    colbert-ai's GPU codec rounds the sum to fp16 first), per query:

    * its top-10 search: every returned score equals the exact score of that pid, the list sorted;
    * a rerank of a known candidate set (the search's top 10 and RERANK_CHECK_CANDIDATES random
      pids, through ``dense_search(pids=...)``): its top 10 is the exact top 10 of the set, up to
      ties (a pid may differ only where the exact scores tie within the tolerance).
    """
    from tilemaxsim_plaid import reference
    from tilemaxsim_plaid.codecs.residual import decompress_residuals

    engine.configure(10, None)
    worst, unsorted, rerank_mismatches = 0.0, 0, 0
    centroids = torch.load(index.colbert / "centroids.pt").float()
    weights = torch.load(index.colbert / "buckets.pt")[1].float()
    nbits = index.manifest["nbits"]
    merged_codes = np.load(index.fast_plaid / "merged_codes.npy", mmap_mode="r")
    merged_residuals = np.load(index.fast_plaid / "merged_residuals.npy", mmap_mode="r")
    generator = np.random.default_rng(0)
    tolerance = 1e-4

    def exact_scores(q, pids) -> np.ndarray:
        out = []
        for pid in pids:
            lo, hi = int(corpus.offsets[pid]), int(corpus.offsets[pid + 1])
            D = decompress_residuals(torch.from_numpy(merged_codes[lo:hi].copy()),
                                     torch.from_numpy(merged_residuals[lo:hi].copy()),
                                     centroids, weights, nbits)
            out.append(float(reference.maxsim_packed(q.float(), D, torch.tensor([0, hi - lo]),
                                                     dtype=torch.float32)[0]))
        return np.array(out)

    for q in Q:
        encoded = engine._encoded(q)[None]
        pids, _, scores = engine.searcher.dense_search(encoded, 10)
        worst = max([worst, *np.abs(exact_scores(q, pids) - np.array(scores)).tolist()])
        unsorted += int(any(a < b for a, b in zip(scores, scores[1:])))
        pool = sorted(set(pids) | set(generator.choice(corpus.num_passages,
                                                      min(RERANK_CHECK_CANDIDATES, corpus.num_passages),
                                                      replace=False).tolist()))
        reranked, _, _ = engine.searcher.dense_search(encoded, 10, pids=pool)
        exact = exact_scores(q, pool)
        tenth = np.sort(exact)[::-1][min(9, len(pool) - 1)]
        by_pid = dict(zip(pool, exact))
        # Every returned pid scores at least the exact 10th score (minus the tolerance).
        rerank_mismatches += int(any(by_pid[pid] < tenth - tolerance for pid in reranked))
    return {"suite": "exactness", "shape": f"{size} k=10", "provider": PLUGIN,
            "queries": Q.shape[0], "max_abs_score_diff": worst, "unsorted_lists": unsorted,
            "rerank_candidates": RERANK_CHECK_CANDIDATES, "rerank_not_exact_top10": rerank_mismatches}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tilemaxsim bench-engines", description=__doc__.split("\n")[0])
    corpora = parser.add_mutually_exclusive_group()
    corpora.add_argument("--passages", type=int, nargs="+", default=[100_000, 1_000_000],
                         help="synthetic corpus sizes")
    corpora.add_argument("--embeddings", metavar="DIR", default=None,
                         help="a directory of precomputed embeddings (meta.json, doclens.npy, "
                              "documents.npy, queries.npy, targets.npy) instead of the synthetic corpus")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--nbits", type=int, default=2, choices=(1, 2, 4))
    parser.add_argument("--latency-queries", type=int, default=200)
    parser.add_argument("--stock-queries", type=int, default=50,
                        help="queries timed for stock colbert-ai (slower), latency and batch")
    parser.add_argument("--exact-queries", type=int, default=200,
                        help="queries with exact top-100 ground truth (the first of the latency set)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--throughput-queries", type=int, default=MSMARCO_DEV_SMALL_QUERIES)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--fairness", action="store_true")
    parser.add_argument("--build-only", action="store_true",
                        help="write the indexes and ground truth (reused by a later run), time nothing")
    parser.add_argument("--fast-plaid-create-max", type=int, default=1_000_000,
                        help="also time fast-plaid's own create() on corpora up to this many passages")
    parser.add_argument("--colbert-build-max", type=int, default=100_000,
                        help="time colbert-ai's own CollectionIndexer on the first this many passages "
                             "(0: not at all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="runs/engines", help="where the indexes are written (reused)")
    parser.add_argument("--out", default="results/engines")
    args = parser.parse_args(argv)
    if args.exact_queries > args.latency_queries:
        parser.error("--exact-queries cannot exceed --latency-queries")
    try:  # before a build of minutes: the index writer and two of the engines are colbert-ai's
        importlib.import_module("colbert.infra.config")
    except ImportError as error:
        parser.error(f"colbert-ai cannot be imported ({error}); pip install colbert-ai==0.2.22")
    if args.embeddings is not None:
        try:  # the directory is checked before anything is built (its arrays are memory-mapped)
            EmbeddingCorpus(args.embeddings)
        except ValueError as error:
            parser.error(f"--embeddings: {error}")
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)
    from .harness import write_results

    out = pathlib.Path(args.out)
    rows = []
    for passages in ([None] if args.embeddings is not None else args.passages):
        rows += run_size(args, passages, out)
        path = write_results(rows, out, "engines", meta={"argv": sys.argv if argv is None else argv})
    for row in rows:
        if row["suite"] in ("latency", "throughput", "load", "fairness", "exactness"):
            brief = {key: (round(v, 4) if isinstance(v, float) else v) for key, v in row.items()
                     if key not in ("suite", "breakdown")}
            print(row["suite"], json.dumps(brief))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
