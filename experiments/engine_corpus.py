"""A structured synthetic corpus of token embeddings with known-item queries, generated chunk by
chunk on any device, for comparing search engines on one collection.

Unlike :mod:`tilemaxsim_plaid.synthetic` (which writes residual codes directly and has no
uncompressed embeddings), this corpus *is* a set of embeddings, so an engine's results can be
checked against exact MaxSim over the embeddings themselves, and clustering them means something:

* ``num_topics`` topic anchors (random unit vectors); each topic owns ``directions_per_topic``
  token directions, perturbed copies of its anchor (``direction_spread``: noise norm relative to
  the anchor), so the directions of a topic form a family, as k-means centroids of real
  ColBERT embeddings do.
* A passage has one topic; each of its tokens is, with probability ``topic_fraction``, one of
  its topic's directions (Zipf-like popularity within the topic), otherwise any direction of
  the corpus; plus per-token noise of norm ``token_noise``; unit-normalised; stored as fp16.
* Passage lengths: log-normal (median ``doclen_median``, shape ``doclen_sigma``) clipped to
  ``[min_doclen, doc_maxlen]``, MS MARCO-like short passages under ColBERTv2's 180-token cap.
* A query has ``query_tokens`` tokens: each, with probability ``query_target_fraction``, a copy
  of a token of one target passage (without replacement while the passage has enough), else
  one of the target's topic directions; plus noise of norm ``query_noise``. Its target is the
  one relevant passage (a known-item query, as MS MARCO's are mostly single-answer), and the
  other passages of its topic compete with it.

Everything derives from ``seed``; chunk ``c`` is drawn from its own generator, so any chunk can
be regenerated alone, in any order, on the device that generated it (CPU and CUDA generators
give different, equally valid corpora). Numbers measured on it are synthetic-corpus numbers.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tilemaxsim_plaid.synthetic import DOC_MAXLEN, DOCLEN_MEDIAN, DOCLEN_SIGMA, MIN_DOCLEN

__all__ = ["CorpusSpec", "Corpus", "EmbeddingCorpus", "EmbeddingList", "ExactTopK", "EMBEDDINGS_META_KEYS"]


@dataclass(frozen=True)
class CorpusSpec:
    """Everything that determines a corpus; equal specs on one device give identical tensors.

    ``num_topics`` None takes one topic per 256 passages (at least 8), so a topic holds
    about as many passages whatever the corpus size."""

    num_passages: int
    dim: int = 128
    doclen_median: float = DOCLEN_MEDIAN
    doclen_sigma: float = DOCLEN_SIGMA
    min_doclen: int = MIN_DOCLEN
    doc_maxlen: int = DOC_MAXLEN
    num_topics: int | None = None
    directions_per_topic: int = 32
    direction_spread: float = 0.6
    topic_fraction: float = 0.8
    token_noise: float = 0.35
    num_queries: int = 256
    query_tokens: int = 32
    query_target_fraction: float = 0.5
    query_noise: float = 0.8
    seed: int = 0
    chunk_passages: int = 25_000

    def __post_init__(self):
        if not isinstance(self.num_passages, int) or self.num_passages < 1:
            raise ValueError(f"num_passages must be a positive int, got {self.num_passages!r}")
        if self.dim < 8 or self.dim % 8:
            raise ValueError(f"dim must be a positive multiple of 8, got {self.dim}")
        if not 1 <= self.min_doclen <= self.doc_maxlen:
            raise ValueError(f"need 1 <= min_doclen <= doc_maxlen, got {self.min_doclen}, {self.doc_maxlen}")
        if not 0.0 <= self.topic_fraction <= 1.0:
            raise ValueError(f"topic_fraction must be in [0, 1], got {self.topic_fraction}")
        if self.num_queries < 0 or self.query_tokens < 1 or self.chunk_passages < 1:
            raise ValueError("num_queries >= 0, query_tokens >= 1 and chunk_passages >= 1 are required")

    @property
    def topics(self) -> int:
        return self.num_topics or max(8, self.num_passages // 256)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class ExactTopK:
    """Running top-k of exact scores over chunks: ``scores`` fp32 [B, k], ``pids`` int64 [B, k]."""

    scores: torch.Tensor
    pids: torch.Tensor

    @classmethod
    def empty(cls, num_queries: int, k: int, device) -> "ExactTopK":
        return cls(torch.full((num_queries, k), -math.inf, device=device),
                   torch.full((num_queries, k), -1, dtype=torch.int64, device=device))

    def update(self, chunk_scores: torch.Tensor, first_pid: int) -> None:
        """Merge [B, n] scores of passages ``first_pid .. first_pid + n - 1``."""
        pids = torch.arange(first_pid, first_pid + chunk_scores.shape[1], device=chunk_scores.device)
        scores = torch.cat((self.scores, chunk_scores.float()), 1)
        ids = torch.cat((self.pids, pids.expand(chunk_scores.shape[0], -1)), 1)
        k = self.scores.shape[1]
        # Stable sort by descending score: ties keep the lower pid first (earlier chunks, then
        # ascending pid inside a chunk), so the result does not depend on the chunk size.
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
        self.scores, self.pids = scores.gather(1, order), ids.gather(1, order)


class _Chunked(abc.ABC):
    """What the index writer reads: lengths, offsets and chunks of fp16 embeddings."""

    num_passages: int
    dim: int
    doc_maxlen: int
    query_maxlen: int
    chunk_passages: int
    doclens: np.ndarray
    offsets: np.ndarray
    device: torch.device

    @property
    def num_embeddings(self) -> int:
        return int(self.offsets[-1])

    def chunk_ranges(self) -> Iterator[tuple[int, int, int]]:
        """``(chunk_index, first_pid, end_pid)`` for every chunk, in order."""
        size = self.chunk_passages
        for index, start in enumerate(range(0, self.num_passages, size)):
            yield index, start, min(start + size, self.num_passages)

    def _chunk_bounds(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_passages
        end = min(start + self.chunk_passages, self.num_passages)
        if not 0 <= start < end:
            raise IndexError(f"chunk {index} is out of range")
        return start, end

    def chunk_offsets(self, index: int) -> torch.Tensor:
        """int64 [passages + 1] row offsets of chunk ``index``'s passages inside :meth:`chunk`."""
        start, end = self._chunk_bounds(index)
        return torch.from_numpy(self.offsets[start:end + 1] - self.offsets[start]).to(self.device)

    @abc.abstractmethod
    def chunk(self, index: int) -> torch.Tensor:
        """Chunk ``index``'s token embeddings, fp16 [tokens, dim], passages in pid order."""


class EmbeddingList(_Chunked):
    """A user's own document embeddings (a list of [len_i, d] tensors) in the writer's interface."""

    def __init__(self, documents: list[torch.Tensor], *, doc_maxlen: int | None = None,
                 query_maxlen: int = 32, chunk_passages: int = 25_000, device=None):
        if not documents:
            raise ValueError("documents must hold at least one passage")
        dims = {int(doc.shape[-1]) for doc in documents}
        if len(dims) != 1 or any(doc.dim() != 2 for doc in documents):
            raise ValueError(f"documents must all be [len, d] with one d, got dims {sorted(dims)}")
        self.documents = documents
        self.num_passages, self.dim = len(documents), dims.pop()
        self.doclens = np.array([doc.shape[0] for doc in documents], dtype=np.int64)
        if (self.doclens < 1).any():
            raise ValueError(f"passage {int(np.argmin(self.doclens))} has no tokens")
        self.offsets = np.concatenate(([0], np.cumsum(self.doclens)))
        self.doc_maxlen = doc_maxlen or int(self.doclens.max())
        self.query_maxlen, self.chunk_passages = query_maxlen, chunk_passages
        self.device = torch.device(device) if device is not None else documents[0].device

    def key(self) -> dict:
        return {"documents": self.num_passages, "embeddings": self.num_embeddings, "dim": self.dim}

    def chunk(self, index: int) -> torch.Tensor:
        start, end = self._chunk_bounds(index)
        return torch.cat(self.documents[start:end]).to(self.device, torch.float16)


# meta.json of an embeddings directory: every key, with its type.
EMBEDDINGS_META_KEYS = {"name": str, "encoder": str, "dim": int, "doc_maxlen": int, "query_maxlen": int,
                        "num_passages": int, "num_queries": int, "note": str}


class EmbeddingCorpus(_Chunked):
    """A directory of precomputed embeddings (an encoder's output) as a corpus with queries.

    The directory holds ``meta.json`` (the keys of :data:`EMBEDDINGS_META_KEYS`),
    ``doclens.npy`` int64 [N] (every entry >= 1), ``documents.npy`` float16 [sum(doclens), dim]
    (the passages' token embeddings concatenated in pid order), ``queries.npy`` float16
    [num_queries, query_maxlen, dim] and ``targets.npy`` int64 [num_queries] (each query's
    relevant pid, -1 where it has none); ``doc_ids.json`` and ``query_ids.json`` are not read.
    ``documents.npy`` is memory-mapped: a chunk is read from disk when it is asked for.

    Raises:
        ValueError: a file is missing or unreadable, or a key, dtype or shape disagrees with the
            format or with the other files (the message names the file).
    """

    def __init__(self, directory, *, chunk_passages: int = 25_000, device="cpu"):
        self.directory = pathlib.Path(directory)
        if not self.directory.is_dir():
            raise ValueError(f"embeddings directory {str(self.directory)!r} does not exist")
        self.meta = self._meta()
        m = self.meta
        self.name, self.dim = m["name"], m["dim"]
        self.doc_maxlen, self.query_maxlen = m["doc_maxlen"], m["query_maxlen"]
        self.doclens = self._array("doclens.npy", np.int64, (m["num_passages"],))
        if (self.doclens < 1).any():
            bad = int(np.flatnonzero(self.doclens < 1)[0])
            raise ValueError(f"doclens.npy: passage {bad} has {int(self.doclens[bad])} tokens (need >= 1)")
        self.num_passages = int(self.doclens.shape[0])
        self.offsets = np.concatenate(([0], np.cumsum(self.doclens)))
        self.documents = self._array("documents.npy", np.float16, (int(self.offsets[-1]), self.dim),
                                     what="sum(doclens.npy) rows of meta.json's dim")
        self._queries = self._array("queries.npy", np.float16, (m["num_queries"], self.query_maxlen, self.dim))
        self.targets = self._array("targets.npy", np.int64, (m["num_queries"],))
        if ((self.targets < -1) | (self.targets >= self.num_passages)).any():
            bad = int(np.flatnonzero((self.targets < -1) | (self.targets >= self.num_passages))[0])
            raise ValueError(f"targets.npy: query {bad} targets pid {int(self.targets[bad])}, outside "
                             f"0..{self.num_passages - 1} (or -1 for none)")
        if chunk_passages < 1:
            raise ValueError(f"chunk_passages must be >= 1, got {chunk_passages}")
        self.chunk_passages = chunk_passages
        self.device = torch.device(device)

    def _meta(self) -> dict:
        path = self.directory / "meta.json"
        if not path.is_file():
            raise ValueError(f"embeddings directory {str(self.directory)!r} has no meta.json")
        try:
            meta = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"meta.json is not JSON: {error}") from None
        if not isinstance(meta, dict):
            raise ValueError(f"meta.json must hold an object, got {type(meta).__name__}")
        for key, kind in EMBEDDINGS_META_KEYS.items():
            value = meta.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"meta.json: {key!r} must be a {kind.__name__}, got {value!r}")
        for key in ("dim", "doc_maxlen", "query_maxlen", "num_passages"):
            if meta[key] < 1:
                raise ValueError(f"meta.json: {key!r} must be >= 1, got {meta[key]}")
        if meta["num_queries"] < 0:
            raise ValueError(f"meta.json: 'num_queries' must be >= 0, got {meta['num_queries']}")
        return meta

    def _array(self, name: str, dtype, shape: tuple[int, ...], what: str | None = None) -> np.ndarray:
        path = self.directory / name
        if not path.is_file():
            raise ValueError(f"embeddings directory {str(self.directory)!r} has no {name}")
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as error:
            raise ValueError(f"{name} is not a plain .npy array: {error}") from None
        if array.dtype != np.dtype(dtype):
            raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {array.dtype.name}")
        if tuple(array.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} ({what or 'from meta.json'}), got "
                             f"{tuple(array.shape)}")
        return array if array.ndim > 1 else np.array(array)

    def key(self) -> dict:
        """What identifies the corpus for reusing a written index: its meta and file sizes."""
        sizes = {name: (self.directory / name).stat().st_size
                 for name in ("doclens.npy", "documents.npy", "queries.npy", "targets.npy")}
        return {"embeddings": self.meta, "directory": str(self.directory.resolve()), "bytes": sizes}

    def chunk(self, index: int) -> torch.Tensor:
        start, end = self._chunk_bounds(index)
        rows = np.array(self.documents[int(self.offsets[start]):int(self.offsets[end])])
        return torch.from_numpy(rows).to(self.device)

    def queries(self) -> tuple[torch.Tensor, np.ndarray]:
        """``(Q, targets)``: fp16 [num_queries, query_maxlen, dim] and int64 [num_queries]."""
        return torch.from_numpy(np.array(self._queries)).to(self.device), self.targets.copy()


class Corpus(_Chunked):
    """The corpus of ``spec`` on ``device``: lengths, chunks of embeddings, queries."""

    def __init__(self, spec: CorpusSpec, device="cpu"):
        self.spec = spec
        self.device = torch.device(device)
        rng = np.random.default_rng([spec.seed, 1])
        lengths = np.exp(rng.normal(math.log(spec.doclen_median), spec.doclen_sigma, spec.num_passages))
        self.doclens = np.clip(np.rint(lengths), spec.min_doclen, spec.doc_maxlen).astype(np.int64)
        self.topics = rng.integers(0, spec.topics, spec.num_passages)
        self.offsets = np.concatenate(([0], np.cumsum(self.doclens)))
        self._directions: torch.Tensor | None = None
        self.num_passages, self.dim, self.doc_maxlen = spec.num_passages, spec.dim, spec.doc_maxlen
        self.query_maxlen, self.chunk_passages = spec.query_tokens, spec.chunk_passages

    def key(self) -> dict:
        return {"corpus": self.spec.to_dict(), "device": self.device.type}

    def _generator(self, *key: int) -> torch.Generator:
        seed = int(np.random.default_rng([self.spec.seed, *key]).integers(0, 2**62))
        return torch.Generator(device=self.device).manual_seed(seed)

    def directions(self) -> torch.Tensor:
        """[topics * directions_per_topic, dim] fp32 unit token directions (topic-major)."""
        if self._directions is None:
            s, g = self.spec, self._generator(2)
            anchors = F.normalize(torch.randn(s.topics, 1, s.dim, device=self.device, generator=g), dim=-1)
            noise = torch.randn(s.topics, s.directions_per_topic, s.dim, device=self.device, generator=g)
            directions = anchors + s.direction_spread * noise / math.sqrt(s.dim)
            self._directions = F.normalize(directions.reshape(-1, s.dim), dim=-1)
        return self._directions

    def chunk(self, index: int) -> torch.Tensor:
        """Chunk ``index``'s token embeddings, fp16 [tokens, dim], passages in pid order."""
        s = self.spec
        start, end = self._chunk_bounds(index)
        g = self._generator(3, index)
        lengths = torch.from_numpy(self.doclens[start:end]).to(self.device)
        topics = torch.from_numpy(self.topics[start:end]).to(self.device)
        tokens = int(lengths.sum())
        token_topic = torch.repeat_interleave(topics, lengths)
        # Zipf-like popularity inside a topic: direction j with probability ~ 1 / (j + 1).
        ranks = torch.arange(s.directions_per_topic, device=self.device, dtype=torch.float32)
        within = torch.multinomial(1.0 / (ranks + 1.0), tokens, replacement=True, generator=g)
        anywhere = torch.randint(0, s.topics * s.directions_per_topic, (tokens,), device=self.device,
                                 generator=g)
        own = torch.rand(tokens, device=self.device, generator=g) < s.topic_fraction
        direction = torch.where(own, token_topic * s.directions_per_topic + within, anywhere)
        noise = torch.randn(tokens, s.dim, device=self.device, generator=g)
        embeddings = self.directions()[direction] + s.token_noise * noise / math.sqrt(s.dim)
        return F.normalize(embeddings, dim=-1).half()

    def query_targets(self) -> np.ndarray:
        """The target passage of each query (distinct, spread over the corpus, sorted)."""
        n = min(self.spec.num_queries, self.spec.num_passages)
        rng = np.random.default_rng([self.spec.seed, 4])
        return np.sort(rng.choice(self.spec.num_passages, size=n, replace=False))

    def queries(self) -> tuple[torch.Tensor, np.ndarray]:
        """``(Q, targets)``: fp16 [num_queries, query_tokens, dim] unit-norm queries and their
        target pids. Each chunk holding a target is generated once."""
        s = self.spec
        targets = self.query_targets()
        Q = torch.empty(targets.shape[0], s.query_tokens, s.dim, dtype=torch.float16, device=self.device)
        chunk_of = targets // s.chunk_passages
        for index in np.unique(chunk_of):
            E = self.chunk(int(index))
            offsets = self.chunk_offsets(int(index))
            for row in np.flatnonzero(chunk_of == index):
                g = self._generator(5, int(targets[row]))
                local = int(targets[row]) - int(index) * s.chunk_passages
                first, length = int(offsets[local]), int(offsets[local + 1] - offsets[local])
                if length >= s.query_tokens:
                    picks = torch.randperm(length, device=self.device, generator=g)[: s.query_tokens]
                else:
                    picks = torch.randint(0, length, (s.query_tokens,), device=self.device, generator=g)
                topic = int(self.topics[targets[row]])
                ranks = torch.arange(s.directions_per_topic, device=self.device, dtype=torch.float32)
                generic = topic * s.directions_per_topic + torch.multinomial(
                    1.0 / (ranks + 1.0), s.query_tokens, replacement=True, generator=g)
                copied = torch.rand(s.query_tokens, device=self.device, generator=g) < s.query_target_fraction
                noise = torch.randn(s.query_tokens, s.dim, device=self.device, generator=g)
                q = torch.where(copied[:, None], E[first + picks].float(), self.directions()[generic])
                q = q + s.query_noise * noise / math.sqrt(s.dim)
                Q[row] = F.normalize(q, dim=-1).half()
        return Q, targets
