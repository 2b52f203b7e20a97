"""Synthetic PLAID indexes at MS MARCO scale, written in colbert-ai 0.2.22's on-disk format.

Encoding 8.8M passages takes GPU-days; the latency of PLAID's stages depends only on the index's
shapes and statistics (how many tokens per passage, how tokens spread over centroids, how many
candidates a query touches), not on the text. This module writes an index whose files are the
ones ``colbert.Indexer`` writes (same names, dtypes, shapes, JSON layout), so stock colbert-ai's
``Searcher``/``IndexScorer`` and the plugin load and search it unchanged:

=====================  =======================================================================
``centroids.pt``       fp16 [C, dim], unit rows; C = 2**floor(log2(16 * sqrt(num_embeddings)))
``buckets.pt``         (cutoffs fp32 [2**nbits - 1], weights fp32 [2**nbits])
``avg_residual.pt``    fp32 0-dim tensor
``{i}.codes.pt``       int32 [n_i]; ``{i}.residuals.pt`` uint8 [n_i, dim * nbits / 8]
``doclens.{i}.json``   list of ints; ``{i}.metadata.json`` passage/embedding offsets
``ivf.pid.pt``         (int32 pids per centroid, sorted and unique, zero-padded; int64 lengths)
``plan.json``,         ``{"config": ColBERTConfig.export(), ...}`` as ``CollectionIndexer``
``metadata.json``      writes them
=====================  =======================================================================

What is modelled, and why (every knob is a field of :class:`SyntheticIndexSpec`):

* Passage lengths: a log-normal clipped to ``[min_doclen, doc_maxlen]``; ColBERT keeps one
  vector per non-punctuation token and truncates at ``doc_maxlen`` (180 for ColBERTv2), so the
  distribution is right-skewed with a hard cap.
* Centroids are not isotropic: real k-means centroids come in families of related directions,
  which is what lets PLAID's centroid-score threshold keep a *set* of cells per query token. Each
  centroid is a perturbed copy of one of ``C / centroids_per_topic`` topic anchors.
* Codes: real IVF lists are skewed (a few centroids hold far more tokens than the mean). Centroid
  popularity is log-normal; a passage draws most tokens from its topic's centroids and the rest
  from the whole index, so passages have the locality that makes candidate generation selective.
* Residuals: colbert-ai's bucket cutoffs are the quantiles of the residual distribution, so every
  bucket is equally likely; uniform random bytes therefore have the real index's statistics.
  Cutoffs and weights are the quantiles of a normal with ``residual_std`` per dimension.
* Queries: 32 tokens, each a noisy copy of a centroid a target passage uses (or of one of its
  topic's centroids), so a query has a known answer and realistic centroid scores.

Writing is chunked (25,000 passages a chunk, as colbert-ai does) and resumable: a chunk whose
files exist is skipped, so memory stays bounded by one chunk plus the IVF under construction.
Numbers measured on these indexes are synthetic-index numbers, never MS MARCO numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "MSMARCO_PASSAGES",
    "SyntheticIndexSpec",
    "num_partitions_for",
    "sample_doclens",
    "write_synthetic_index",
    "load_synthetic_queries",
    "synthetic_index_complete",
    "ivf_from_pairs",
    "colbert_ivf",
]

# MS MARCO passage ranking's collection size, the scale the generator must be able to reach.
MSMARCO_PASSAGES = 8_841_823
# MS MARCO-like passage lengths in tokens: log-normal (median, shape), clipped to [min, max]; the
# median of 64 with shape 0.45 gives a mean near 70 tokens, a modelling choice, not a measured
# statistic; the maximum is ColBERTv2's doc_maxlen.
DOCLEN_MEDIAN, DOCLEN_SIGMA, MIN_DOCLEN, DOC_MAXLEN = 64.0, 0.45, 4, 180
# colbert-ai's Collection.get_chunksize() for one rank: min(25_000, 1 + N).
COLBERT_CHUNK_PASSAGES = 25_000
SYNTHETIC_MANIFEST = "synthetic.json"
SYNTHETIC_QUERIES = "synthetic_queries.pt"


@dataclass(frozen=True)
class SyntheticIndexSpec:
    """Everything that determines a synthetic index; equal specs write identical files.

    Attributes:
        num_passages: passages in the index (>= 1).
        dim: token dimension (ColBERTv2: 128); ``dim * nbits`` must be a multiple of 8.
        nbits: residual bits per dimension (1, 2 or 4).
        doclen_median, doclen_sigma: log-normal passage lengths in tokens (median and shape;
            default DOCLEN_MEDIAN and DOCLEN_SIGMA, MS MARCO-like).
        min_doclen, doc_maxlen: the clip range (default MIN_DOCLEN and DOC_MAXLEN, ColBERTv2's).
        num_centroids: C; None uses colbert-ai's rule on the generated embedding count.
        centroids_per_topic: centroids per family of related directions.
        centroid_spread: noise norm relative to the anchor; 1.0 puts a centroid at cosine ~0.7
            from its anchor and ~0.5 from its siblings.
        popularity_sigma: log-normal shape of centroid popularity (IVF list skew).
        topic_fraction: share of a passage's tokens drawn from its own topic.
        residual_std: per-dimension residual standard deviation; 0.05 keeps a decompressed
            token at cosine ~0.9 from its centroid at dim 128, nbits 2.
        num_queries, query_maxlen, query_noise: synthetic queries written next to the index.
        seed: the one seed every random draw derives from.
        checkpoint: recorded as the index's checkpoint (``Searcher`` loads it when none is
            given); any colbert-ai checkpoint of the same ``dim`` works for text queries.
    """

    num_passages: int
    dim: int = 128
    nbits: int = 2
    doclen_median: float = DOCLEN_MEDIAN
    doclen_sigma: float = DOCLEN_SIGMA
    min_doclen: int = MIN_DOCLEN
    doc_maxlen: int = DOC_MAXLEN
    num_centroids: int | None = None
    centroids_per_topic: int = 64
    centroid_spread: float = 1.0
    popularity_sigma: float = 1.0
    topic_fraction: float = 0.7
    residual_std: float = 0.05
    num_queries: int = 256
    query_maxlen: int = 32
    query_noise: float = 0.6
    seed: int = 0
    checkpoint: str | None = None

    def __post_init__(self):
        if not isinstance(self.num_passages, int) or self.num_passages < 1:
            raise ValueError(f"num_passages must be a positive int, got {self.num_passages!r}")
        if self.nbits not in (1, 2, 4):
            raise ValueError(f"nbits must be 1, 2 or 4, got {self.nbits!r}")
        if self.dim % 8 or (self.dim * self.nbits) % 8:
            raise ValueError(f"dim must be a multiple of 8, got {self.dim!r}")
        if not 1 <= self.min_doclen <= self.doc_maxlen:
            raise ValueError(
                f"need 1 <= min_doclen <= doc_maxlen, got {self.min_doclen}, {self.doc_maxlen}"
            )
        if not 0.0 <= self.topic_fraction <= 1.0:
            raise ValueError(f"topic_fraction must lie in [0, 1], got {self.topic_fraction!r}")
        if self.num_centroids is not None and (
            self.num_centroids < 1 or self.num_centroids & (self.num_centroids - 1)
        ):
            raise ValueError(f"num_centroids must be a power of two, got {self.num_centroids!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def num_partitions_for(num_embeddings: float) -> int:
    """colbert-ai's centroid count: ``2 ** floor(log2(16 * sqrt(num_embeddings)))``."""
    return int(2 ** math.floor(math.log2(16 * math.sqrt(num_embeddings))))


def sample_doclens(spec: SyntheticIndexSpec) -> np.ndarray:
    """Passage lengths in tokens, int64 [num_passages] (deterministic in ``spec.seed``)."""
    rng = np.random.default_rng([spec.seed, 1])
    lengths = rng.lognormal(math.log(spec.doclen_median), spec.doclen_sigma, spec.num_passages)
    return np.clip(np.rint(lengths), spec.min_doclen, spec.doc_maxlen).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The codec: centroids, popularity, buckets
# ---------------------------------------------------------------------------------------------


@dataclass
class _Codec:
    centroids: torch.Tensor  # fp32 [C, dim], unit rows
    topic_of_centroid: np.ndarray  # int64 [C]: centroid c belongs to topic c // per_topic
    topic_cdf: np.ndarray  # float64 [T]: cumulative topic popularity, last = 1
    global_cdf: np.ndarray  # float64 [C]: cumulative centroid popularity, last = 1
    within_topic_keys: np.ndarray  # float64 [C]: topic + cumulative share inside the topic
    per_topic: int
    bucket_cutoffs: torch.Tensor  # fp32 [2**nbits - 1]
    bucket_weights: torch.Tensor  # fp32 [2**nbits]
    avg_residual: torch.Tensor  # fp32 0-dim


def _normal_quantiles(probabilities: np.ndarray, std: float) -> torch.Tensor:
    erfinv = torch.special.erfinv(torch.as_tensor(2 * probabilities - 1, dtype=torch.float64))
    return (std * math.sqrt(2) * erfinv).to(torch.float32)


def _make_codec(spec: SyntheticIndexSpec, num_centroids: int) -> _Codec:
    generator = torch.Generator().manual_seed(spec.seed * 7919 + 2)
    rng = np.random.default_rng([spec.seed, 2])
    per_topic = max(1, min(spec.centroids_per_topic, num_centroids))
    num_topics = math.ceil(num_centroids / per_topic)

    anchors = torch.nn.functional.normalize(
        torch.randn(num_topics, spec.dim, generator=generator), dim=-1
    )
    topic_of_centroid = np.arange(num_centroids, dtype=np.int64) // per_topic
    noise = torch.randn(num_centroids, spec.dim, generator=generator) / math.sqrt(spec.dim)
    centroids = anchors[torch.from_numpy(topic_of_centroid)] + spec.centroid_spread * noise
    centroids = torch.nn.functional.normalize(centroids, dim=-1)

    popularity = rng.lognormal(0.0, spec.popularity_sigma, num_centroids)
    global_cdf = np.cumsum(popularity) / popularity.sum()
    topic_mass = np.bincount(topic_of_centroid, weights=popularity, minlength=num_topics)
    topic_cdf = np.cumsum(topic_mass) / topic_mass.sum()
    # Keys t + (share of topic t's mass up to and including centroid c): increasing over c, so
    # one searchsorted on t + u (u uniform) draws a centroid of topic t by popularity.
    share = popularity / topic_mass[topic_of_centroid]
    cumulative_share = np.zeros(num_centroids)
    for topic_start in range(0, num_centroids, per_topic):
        block = slice(topic_start, topic_start + per_topic)
        cumulative_share[block] = np.cumsum(share[block])
    within_topic_keys = topic_of_centroid + np.minimum(cumulative_share, 1.0)
    # The last key of every topic is exactly t + 1 so that u < 1 never falls past it.
    last_of_topic = np.minimum(np.arange(1, num_topics + 1) * per_topic, num_centroids) - 1
    within_topic_keys[last_of_topic] = np.arange(1, num_topics + 1)

    levels = 2**spec.nbits
    # colbert-ai: cutoffs at quantiles i / 2**nbits, weights at (i + 0.5) / 2**nbits.
    bucket_cutoffs = _normal_quantiles(np.arange(1, levels) / levels, spec.residual_std)
    bucket_weights = _normal_quantiles((np.arange(levels) + 0.5) / levels, spec.residual_std)
    avg_residual = torch.tensor(spec.residual_std * math.sqrt(2 / math.pi), dtype=torch.float32)
    return _Codec(centroids, topic_of_centroid, topic_cdf, global_cdf, within_topic_keys,
                  per_topic, bucket_cutoffs, bucket_weights, avg_residual)


def _draw_codes(codec: _Codec, topics: np.ndarray, topic_fraction: float,
                rng: np.random.Generator) -> np.ndarray:
    """One centroid id per token, int64 [n]: from the token's topic, else from the whole index."""
    n = topics.shape[0]
    from_topic = rng.random(n) < topic_fraction
    codes = np.empty(n, dtype=np.int64)
    keys = topics[from_topic] + rng.random(int(from_topic.sum()))
    codes[from_topic] = np.searchsorted(codec.within_topic_keys, keys, side="right")
    codes[~from_topic] = np.searchsorted(codec.global_cdf, rng.random(int((~from_topic).sum())),
                                         side="right")
    return np.minimum(codes, codec.global_cdf.shape[0] - 1)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def _ujson():
    # colbert-ai writes its JSON with ujson (e.g. '/' escaped as '\/'); use it for identical files.
    import ujson

    return ujson


def _colbert_config_export(spec: SyntheticIndexSpec, index_path: pathlib.Path) -> dict:
    """The ``config`` entry colbert-ai writes into plan.json and metadata.json."""
    from colbert.infra.config import ColBERTConfig

    config = ColBERTConfig(
        dim=spec.dim,
        nbits=spec.nbits,
        doc_maxlen=spec.doc_maxlen,
        query_maxlen=spec.query_maxlen,
        checkpoint=spec.checkpoint,
        index_name=index_path.name,
        index_root=str(index_path.parent),
        experiment="synthetic",
        nranks=1,
        avoid_fork_if_possible=True,
    )
    exported = config.export()
    # An index built from an in-memory list stores this summary (CoreConfig.__export_value);
    # Searcher turns it into a Collection it never reads when asked only for pids.
    exported["collection"] = [
        f"list with {spec.num_passages} elements starting with...",
        [f"synthetic passage {pid}" for pid in range(min(3, spec.num_passages))],
    ]
    return exported


def _chunk_ranges(num_passages: int) -> Iterator[tuple[int, int, int]]:
    chunk_size = min(COLBERT_CHUNK_PASSAGES, 1 + num_passages)
    for chunk_idx, start in enumerate(range(0, num_passages, chunk_size)):
        yield chunk_idx, start, min(start + chunk_size, num_passages)


def _chunk_written(index_path: pathlib.Path, chunk_idx: int) -> bool:
    names = (f"{chunk_idx}.codes.pt", f"{chunk_idx}.residuals.pt", f"doclens.{chunk_idx}.json",
             f"{chunk_idx}.metadata.json")
    return all((index_path / name).exists() for name in names)


def _save_atomically(obj, path: pathlib.Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save(obj, partial)
    os.replace(partial, path)


def _write_text_atomically(text: str, path: pathlib.Path) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def synthetic_index_complete(index_path, spec: SyntheticIndexSpec | None = None) -> bool:
    """True when ``index_path`` holds a finished synthetic index (of ``spec``, if given)."""
    manifest = pathlib.Path(index_path) / SYNTHETIC_MANIFEST
    if not manifest.exists():
        return False
    recorded = json.loads(manifest.read_text())
    return recorded.get("complete", False) and (spec is None or recorded["spec"] == spec.to_dict())


def write_synthetic_index(spec: SyntheticIndexSpec, index_path, *, progress: bool = True) -> dict:
    """Write (or finish writing) the synthetic index ``spec`` at ``index_path``.

    A folder holding another spec's files is refused rather than mixed: delete it first.

    Args:
        spec: what to generate.
        index_path: the index folder (created); its name is the index name.
        progress: show tqdm bars for the chunk loop and the IVF.

    Returns:
        The manifest written to ``synthetic.json``: the spec, embedding and centroid counts,
        doc-length statistics and seconds spent.
    """
    from tqdm import tqdm

    index_path = pathlib.Path(index_path)
    index_path.mkdir(parents=True, exist_ok=True)
    manifest_path = index_path / SYNTHETIC_MANIFEST
    if manifest_path.exists():
        recorded = json.loads(manifest_path.read_text())
        if recorded["spec"] != spec.to_dict():
            raise ValueError(
                f"{index_path} holds a synthetic index of another spec ({recorded['spec']}); "
                "remove the folder or choose another path"
            )
        if recorded.get("complete"):
            return recorded
    _write_text_atomically(json.dumps({"spec": spec.to_dict(), "complete": False}, indent=2),
                           manifest_path)
    started = time.perf_counter()
    ujson = _ujson()

    doclens = sample_doclens(spec)
    num_embeddings = int(doclens.sum())
    num_centroids = spec.num_centroids or num_partitions_for(num_embeddings)
    codec = _make_codec(spec, num_centroids)
    chunks = list(_chunk_ranges(spec.num_passages))
    config_export = _colbert_config_export(spec, index_path)

    plan = {"config": config_export, "num_chunks": len(chunks), "num_partitions": num_centroids,
            "num_embeddings_est": float(num_embeddings),
            "avg_doclen_est": float(num_embeddings / spec.num_passages)}
    _write_text_atomically(ujson.dumps(plan, indent=4) + "\n", index_path / "plan.json")
    _save_atomically(codec.centroids.half(), index_path / "centroids.pt")
    _save_atomically((codec.bucket_cutoffs, codec.bucket_weights), index_path / "buckets.pt")
    _save_atomically(codec.avg_residual, index_path / "avg_residual.pt")

    topic_rng = np.random.default_rng([spec.seed, 3])
    doc_topics = np.searchsorted(codec.topic_cdf, topic_rng.random(spec.num_passages), side="right")
    doc_topics = np.minimum(doc_topics, codec.topic_cdf.shape[0] - 1)
    packed_width = spec.dim * spec.nbits // 8

    # Unique (centroid, pid) pairs per chunk, kept for the IVF: pids rise chunk by chunk, so a
    # stable sort by centroid at the end leaves every list sorted by pid, as torch.unique does.
    ivf_codes, ivf_pids = [], []
    query_sources: dict[int, np.ndarray] = {}
    query_rng = np.random.default_rng([spec.seed, 4])
    query_targets = np.sort(query_rng.choice(spec.num_passages,
                                             size=min(spec.num_queries, spec.num_passages),
                                             replace=False))
    embedding_offset = 0
    for chunk_idx, start, end in tqdm(chunks, desc="synthetic chunks", disable=not progress):
        chunk_doclens = doclens[start:end]
        chunk_tokens = int(chunk_doclens.sum())
        chunk_rng = np.random.default_rng([spec.seed, 5, chunk_idx])
        token_topics = np.repeat(doc_topics[start:end], chunk_doclens)
        codes = _draw_codes(codec, token_topics, spec.topic_fraction, chunk_rng)
        token_pids = np.repeat(np.arange(start, end, dtype=np.int64), chunk_doclens)

        pair_keys = np.unique(codes * spec.num_passages + token_pids)
        ivf_codes.append((pair_keys // spec.num_passages).astype(np.int32))
        ivf_pids.append((pair_keys % spec.num_passages).astype(np.int32))

        chunk_offsets = np.concatenate(([0], np.cumsum(chunk_doclens)))
        for pid in query_targets[(query_targets >= start) & (query_targets < end)]:
            local = int(pid) - start
            query_sources[int(pid)] = codes[chunk_offsets[local]:chunk_offsets[local + 1]]

        if not _chunk_written(index_path, chunk_idx):
            residuals = chunk_rng.integers(0, 256, size=(chunk_tokens, packed_width), dtype=np.uint8)
            _save_atomically(torch.from_numpy(codes.astype(np.int32)),
                             index_path / f"{chunk_idx}.codes.pt")
            _save_atomically(torch.from_numpy(residuals), index_path / f"{chunk_idx}.residuals.pt")
            _write_text_atomically(ujson.dumps([int(x) for x in chunk_doclens]),
                                   index_path / f"doclens.{chunk_idx}.json")
            chunk_metadata = {"passage_offset": start, "num_passages": end - start,
                              "num_embeddings": chunk_tokens, "embedding_offset": embedding_offset}
            _write_text_atomically(ujson.dumps(chunk_metadata, indent=4) + "\n",
                                   index_path / f"{chunk_idx}.metadata.json")
        embedding_offset += chunk_tokens

    _write_ivf(index_path, ivf_codes, ivf_pids, num_centroids)
    _write_queries(index_path, spec, codec, query_targets, query_sources, doc_topics)

    metadata = {"config": config_export, "num_chunks": len(chunks),
                "num_partitions": num_centroids, "num_embeddings": num_embeddings,
                "avg_doclen": num_embeddings / spec.num_passages}
    _write_text_atomically(ujson.dumps(metadata, indent=4) + "\n", index_path / "metadata.json")

    manifest = {
        "spec": spec.to_dict(),
        "complete": True,
        "num_embeddings": num_embeddings,
        "num_centroids": num_centroids,
        "num_chunks": len(chunks),
        "doclen": {"mean": float(doclens.mean()), "p50": float(np.percentile(doclens, 50)),
                   "p95": float(np.percentile(doclens, 95)), "max": int(doclens.max())},
        "seconds": time.perf_counter() - started,
        "note": "synthetic index: statistics are modelled, numbers from it are not MS MARCO's",
    }
    _write_text_atomically(json.dumps(manifest, indent=2), manifest_path)
    return manifest


def ivf_from_pairs(chunk_codes: list[np.ndarray], chunk_pids: list[np.ndarray],
                   num_centroids: int) -> tuple[np.ndarray, np.ndarray]:
    """PLAID's inverted lists (int32 pids per centroid, ascending; int64 lengths) from each chunk's
    unique (centroid, pid) pairs, chunks in pid order (the lists are emptied on the way).

    Each chunk's pairs come sorted by centroid, then pid (np.unique), and chunks come in pid
    order, so placing every chunk's pids after the earlier chunks' pids of the same centroid (a
    counting sort) leaves each list sorted by pid. Unlike one global argsort, this needs no
    int64 index over all pairs: at MS MARCO's size the pairs take ~4 GB and the IVF ~2 GB more.
    """
    lengths = np.zeros(num_centroids, dtype=np.int64)
    for codes in chunk_codes:
        lengths += np.bincount(codes, minlength=num_centroids)
    cursor = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    ivf = np.empty(int(lengths.sum()), dtype=np.int32)
    while chunk_codes:
        codes, pids = chunk_codes.pop(0), chunk_pids.pop(0)
        centroids, first, counts = np.unique(codes, return_index=True, return_counts=True)
        rank_in_list = np.arange(codes.shape[0]) - np.repeat(first, counts)
        ivf[cursor[codes] + rank_in_list] = pids
        cursor[centroids] += counts
    return ivf, lengths


def colbert_ivf(ivf: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``ivf.pid.pt``'s tensors as colbert-ai's ``optimize_ivf`` saves them: padded with
    ``max(lengths)`` zeros when the last list's stride would run past the end."""
    ivf_t, lengths_t = torch.from_numpy(ivf), torch.from_numpy(lengths.astype(np.int64))
    max_stride = int(lengths_t.max())
    if int(lengths_t[:-1].sum()) + max_stride > ivf_t.shape[0]:
        ivf_t = torch.cat((ivf_t, torch.zeros(max_stride, dtype=ivf_t.dtype)))
    return ivf_t, lengths_t


def _write_ivf(index_path: pathlib.Path, chunk_codes: list[np.ndarray],
               chunk_pids: list[np.ndarray], num_centroids: int) -> None:
    """``ivf.pid.pt`` as colbert-ai's ``optimize_ivf`` writes it (:func:`ivf_from_pairs`)."""
    _save_atomically(colbert_ivf(*ivf_from_pairs(chunk_codes, chunk_pids, num_centroids)),
                     index_path / "ivf.pid.pt")


def _write_queries(index_path: pathlib.Path, spec: SyntheticIndexSpec, codec: _Codec,
                   targets: np.ndarray, sources: dict[int, np.ndarray],
                   doc_topics: np.ndarray) -> None:
    """Queries whose tokens copy centroids of a target passage (or of its topic), plus noise."""
    rng = np.random.default_rng([spec.seed, 6])
    generator = torch.Generator().manual_seed(spec.seed * 7919 + 6)
    chosen = np.empty((targets.shape[0], spec.query_maxlen), dtype=np.int64)
    for row, pid in enumerate(targets):
        passage_codes = sources[int(pid)]
        from_passage = rng.random(spec.query_maxlen) < 0.5
        chosen[row] = np.where(
            from_passage,
            rng.choice(passage_codes, size=spec.query_maxlen),
            _draw_codes(codec, np.full(spec.query_maxlen, doc_topics[pid]), 1.0, rng),
        )
    centroids = codec.centroids[torch.from_numpy(chosen)]
    noise = torch.randn(centroids.shape, generator=generator) / math.sqrt(spec.dim)
    queries = torch.nn.functional.normalize(centroids + spec.query_noise * noise, dim=-1)
    _save_atomically({"Q": queries.half(), "target_pids": torch.from_numpy(targets)},
                     index_path / SYNTHETIC_QUERIES)


def load_synthetic_queries(index_path) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries written with a synthetic index.

    Returns:
        ``(Q, target_pids)``: fp16 [num_queries, query_maxlen, dim] unit rows, and int64
        [num_queries] the passage each query was drawn from.
    """
    stored = torch.load(pathlib.Path(index_path) / SYNTHETIC_QUERIES, map_location="cpu")
    return stored["Q"], stored["target_pids"]


def verify_synthetic_index(index_path, *, progress: bool = True) -> dict:
    """Check a written index chunk by chunk, without loading it whole: what colbert-ai's loader
    will assume (metadata totals, per-chunk code and residual shapes, code range, IVF lists
    sorted, unique and in range). Residual files are opened memory-mapped, so an 8.8M-passage
    index needs only its codes and IVF in memory, one chunk at a time.

    Raises:
        ValueError naming the file and what is wrong.

    Returns:
        Totals: passages, embeddings, chunks, partitions, IVF entries.
    """
    from tqdm import tqdm

    path = pathlib.Path(index_path)

    def fail(name: str, problem: str):
        raise ValueError(f"{path / name}: {problem}")

    for name in ("metadata.json", "centroids.pt", "buckets.pt", "ivf.pid.pt"):
        if not (path / name).exists():
            fail(name, "missing (an unfinished write? rerun the same command to finish it)")
    metadata = json.loads((path / "metadata.json").read_text())
    num_chunks, num_partitions = metadata["num_chunks"], metadata["num_partitions"]
    dim, nbits = metadata["config"]["dim"], metadata["config"]["nbits"]
    centroids = torch.load(path / "centroids.pt", mmap=True)
    if tuple(centroids.shape) != (num_partitions, dim):
        fail("centroids.pt", f"shape {tuple(centroids.shape)}, metadata says ({num_partitions}, {dim})")
    passages = embeddings = 0
    for i in tqdm(range(num_chunks), desc="verify chunks", disable=not progress):
        doclens = json.loads((path / f"doclens.{i}.json").read_text())
        chunk = json.loads((path / f"{i}.metadata.json").read_text())
        if (chunk["passage_offset"], chunk["embedding_offset"]) != (passages, embeddings):
            fail(f"{i}.metadata.json", f"offsets {chunk['passage_offset']}, {chunk['embedding_offset']} "
                                       f"after {passages} passages and {embeddings} embeddings")
        tokens = sum(doclens)
        if (chunk["num_passages"], chunk["num_embeddings"]) != (len(doclens), tokens):
            fail(f"{i}.metadata.json", f"counts disagree with doclens.{i}.json")
        codes = torch.load(path / f"{i}.codes.pt")
        if codes.dtype != torch.int32 or tuple(codes.shape) != (tokens,):
            fail(f"{i}.codes.pt", f"{codes.dtype} {tuple(codes.shape)}, expected int32 ({tokens},)")
        if tokens and (int(codes.min()) < 0 or int(codes.max()) >= num_partitions):
            fail(f"{i}.codes.pt", f"codes outside [0, {num_partitions})")
        residuals = torch.load(path / f"{i}.residuals.pt", mmap=True)
        if residuals.dtype != torch.uint8 or tuple(residuals.shape) != (tokens, dim * nbits // 8):
            fail(f"{i}.residuals.pt", f"{residuals.dtype} {tuple(residuals.shape)}, expected uint8 "
                                      f"({tokens}, {dim * nbits // 8})")
        passages += len(doclens)
        embeddings += tokens
    if embeddings != metadata["num_embeddings"]:
        fail("metadata.json", f"num_embeddings {metadata['num_embeddings']}, chunks hold {embeddings}")
    ivf, lengths = torch.load(path / "ivf.pid.pt")
    if lengths.shape != (num_partitions,) or int(lengths.sum()) > ivf.shape[0]:
        fail("ivf.pid.pt", f"{lengths.shape[0]} lists of {int(lengths.sum())} pids in {ivf.shape[0]} entries")
    entries = ivf[: int(lengths.sum())].long()
    if entries.numel() and (int(entries.min()) < 0 or int(entries.max()) >= passages):
        fail("ivf.pid.pt", f"pids outside [0, {passages})")
    # Where each list after the first begins: the order may restart there.
    list_starts = torch.cumsum(lengths, 0)[:-1]
    starts = torch.zeros(entries.shape[0], dtype=torch.bool)
    starts[list_starts[list_starts < entries.shape[0]]] = True
    if entries.numel() > 1 and not bool(((entries[1:] > entries[:-1]) | starts[1:]).all()):
        fail("ivf.pid.pt", "a list is not strictly increasing (sorted, unique pids)")
    return {"passages": passages, "embeddings": embeddings, "chunks": num_chunks,
            "partitions": num_partitions, "ivf_entries": int(lengths.sum())}
