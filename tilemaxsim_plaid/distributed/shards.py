"""One rank's slice of a corpus: a contiguous range of global pids in one of three encodings.

Every encoding is PLAID's packed layout: per-token tensors concatenated over documents, plus
int64 ``offsets`` [N+1] (document n owns token rows ``offsets[n]:offsets[n+1]``), plus tensors
every shard shares (the codec). A shard keeps pid ``pid_start + n`` for its local document n, so a
shard never stores global ids and slicing it is a view.

* :class:`DenseShard`: fp16/bf16/fp32 token embeddings [T, d].
* :class:`ResidualShard`: colbert-ai's residual codes (centroid id + packed nbits buckets per dim).
* :class:`PQShard`: product-quantization codes [T, M] against codebooks [M, 256, d/M].

Shards are split by contiguous pid ranges (never round-robin) because that is how an on-disk
PLAID index is already laid out: a rank reads only the chunk files that overlap its range.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

__all__ = [
    "DenseShard",
    "ResidualShard",
    "PQShard",
    "SHARD_KINDS",
    "partition_pid_ranges",
]


def partition_pid_ranges(doc_lengths: torch.Tensor, world_size: int, *, balance: str = "tokens"):
    """Split pids [0, N) into ``world_size`` contiguous, non-empty ranges.

    Args:
        doc_lengths: int [N], tokens per document (only used when balancing by tokens).
        world_size: number of ranks (>= 1).
        balance: ``"tokens"`` gives every rank about the same number of tokens (the work and the
            bytes of a scan are proportional to tokens, not documents); ``"docs"`` the same number
            of documents.

    Returns:
        A list of ``world_size`` (pid_start, pid_stop) pairs tiling [0, N) in rank order.

    Raises:
        ValueError: world_size < 1, world_size > N, or an unknown ``balance``.
    """
    num_docs = int(doc_lengths.numel())
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if world_size > num_docs:
        raise ValueError(
            f"world size {world_size} is larger than the corpus ({num_docs} documents): "
            "every rank needs at least one document"
        )
    if balance == "docs":
        cuts = [(r * num_docs) // world_size for r in range(world_size + 1)]
    elif balance == "tokens":
        cumulative = torch.cumsum(doc_lengths.to(torch.int64).cpu(), 0)
        total = int(cumulative[-1]) if num_docs else 0
        targets = torch.tensor([(r * total) // world_size for r in range(1, world_size)], dtype=torch.int64)
        # A cut after the first document whose running total reaches the target.
        inner = (torch.searchsorted(cumulative, targets, right=False) + 1).tolist()
        cuts = [0] + inner + [num_docs]
        # Keep every range non-empty (skewed lengths could put two cuts on one document):
        # push cuts forward, then back from the end, one document apart at least.
        for r in range(1, world_size):
            cuts[r] = max(cuts[r], cuts[r - 1] + 1)
        for r in range(world_size - 1, 0, -1):
            cuts[r] = min(cuts[r], cuts[r + 1] - 1)
    else:
        raise ValueError(f"balance must be 'tokens' or 'docs', got {balance!r}")
    return [(cuts[r], cuts[r + 1]) for r in range(world_size)]


@dataclasses.dataclass(frozen=True)
class _PackedShard:
    """Fields common to every encoding. Subclasses name their per-token and shared tensors."""

    offsets: torch.Tensor  # int64 [N+1], offsets[0] == 0
    pid_start: int
    max_doc_len: int

    kind: ClassVar[str] = ""
    # Tensors with one row per token: sliced together with the offsets.
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ()
    # Tensors every shard holds whole (the codec).
    SHARED_FIELDS: ClassVar[tuple[str, ...]] = ()
    # Fields that have a None default only because dataclass inheritance requires one.
    REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        missing = [n for n in self.REQUIRED_FIELDS if getattr(self, n) is None]
        if missing:
            raise TypeError(f"{type(self).__name__} needs {', '.join(missing)}")
        if self.offsets.dim() != 1 or self.offsets.numel() < 1 or self.offsets.dtype != torch.int64:
            raise ValueError(f"offsets must be int64 [N+1], got {self.offsets.dtype} {tuple(self.offsets.shape)}")
        rows = {n: getattr(self, n).shape[0] for n in self.TOKEN_FIELDS if getattr(self, n) is not None}
        if len(set(rows.values())) > 1:
            raise ValueError(f"per-token tensors must have one row per token each, got rows {rows}")

    @property
    def num_docs(self) -> int:
        return self.offsets.numel() - 1

    @property
    def pid_stop(self) -> int:
        return self.pid_start + self.num_docs

    @property
    def num_tokens(self) -> int:
        return getattr(self, self.TOKEN_FIELDS[0]).shape[0]

    @property
    def device(self) -> torch.device:
        return self.offsets.device

    def nbytes(self) -> int:
        """Bytes this shard holds on its device (per-token tensors, offsets and codec)."""
        names = ("offsets",) + self.TOKEN_FIELDS + self.SHARED_FIELDS
        return sum(t.numel() * t.element_size() for t in (getattr(self, n) for n in names) if t is not None)

    def to(self, device) -> "_PackedShard":
        names = ("offsets",) + self.TOKEN_FIELDS + self.SHARED_FIELDS
        moved = {n: getattr(self, n).to(device) for n in names if getattr(self, n) is not None}
        return dataclasses.replace(self, **moved)

    def docs(self, start: int, stop: int) -> "_PackedShard":
        """Local documents [start, stop) as a shard of their own (views, no copy).

        Reads two offsets on the host: call it when building blocks, not per query.
        """
        if not 0 <= start <= stop <= self.num_docs:
            raise ValueError(f"document range [{start}, {stop}) is outside [0, {self.num_docs})")
        token_start, token_stop = (int(v) for v in self.offsets[[start, stop]].tolist())
        sliced = {n: getattr(self, n)[token_start:token_stop]
                  for n in self.TOKEN_FIELDS if getattr(self, n) is not None}
        offsets = self.offsets[start:stop + 1] - token_start
        lengths = offsets[1:] - offsets[:-1]
        max_len = int(lengths.max()) if lengths.numel() else 0
        return dataclasses.replace(self, offsets=offsets, pid_start=self.pid_start + start,
                                   max_doc_len=max_len, **sliced)

    def blocks(self, max_docs: int | None) -> list["_PackedShard"]:
        """This shard cut into consecutive pieces of at most ``max_docs`` documents."""
        if max_docs is None or max_docs >= self.num_docs:
            return [self]
        if max_docs < 1:
            raise ValueError(f"max_docs must be >= 1, got {max_docs}")
        return [self.docs(s, min(s + max_docs, self.num_docs)) for s in range(0, self.num_docs, max_docs)]

    def layout(self) -> dict:
        """What every rank must agree on (plus this shard's pid range): exchanged at start-up."""
        return {
            "kind": self.kind,
            "dim": self.dim,
            "pid_start": self.pid_start,
            "pid_stop": self.pid_stop,
            "num_tokens": self.num_tokens,
            "codec": self.codec_signature(),
        }

    @classmethod
    def _from_corpus(cls, offsets: torch.Tensor, pid_start: int, pid_stop: int, **fields):
        whole = cls(offsets=offsets.to(torch.int64), pid_start=0, max_doc_len=0, **fields)
        if not 0 <= pid_start <= pid_stop <= whole.num_docs:
            raise ValueError(
                f"pid range [{pid_start}, {pid_stop}) is outside the corpus [0, {whole.num_docs})"
            )
        return whole.docs(pid_start, pid_stop)


@dataclasses.dataclass(frozen=True)
class DenseShard(_PackedShard):
    """Dense token embeddings of documents [pid_start, pid_stop).

    Attributes:
        embeddings: [T, d] fp16/bf16/fp32, the shard's tokens.
    """

    embeddings: torch.Tensor = None

    kind: ClassVar[str] = "dense"
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("embeddings",)
    REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ("embeddings",)

    @property
    def dim(self) -> int:
        return self.embeddings.shape[-1]

    def codec_signature(self) -> dict:
        return {"dtype": str(self.embeddings.dtype)}

    @classmethod
    def from_corpus(cls, embeddings, offsets, pid_start: int, pid_stop: int) -> "DenseShard":
        """Documents [pid_start, pid_stop) of a whole packed corpus (views into it).

        Args:
            embeddings: [T, d] all tokens.
            offsets: int64 [N+1] over ``embeddings``.
        """
        return cls._from_corpus(offsets, pid_start, pid_stop, embeddings=embeddings)


@dataclasses.dataclass(frozen=True)
class ResidualShard(_PackedShard):
    """colbert-ai residual codes of documents [pid_start, pid_stop), in colbert-ai's bit layout.

    Attributes:
        codes: int32 [T], centroid id per token.
        residuals: uint8 [T, d * nbits / 8], packed bucket indices.
        centroids: [C, d] (fp16 as colbert-ai stores them), shared by all ranks.
        bucket_weights: [2**nbits], shared by all ranks.
        nbits: bits per dimension (1, 2 or 4).
        inv_norms: optional fp32 [T] from ``codecs.residual.residual_inverse_norms``, computed once
            per index (4 bytes per token) so the residual kernel can skip the centroid rows.
    """

    codes: torch.Tensor = None
    residuals: torch.Tensor = None
    centroids: torch.Tensor = None
    bucket_weights: torch.Tensor = None
    nbits: int = 2
    inv_norms: torch.Tensor | None = None

    kind: ClassVar[str] = "residual"
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("codes", "residuals", "inv_norms")
    SHARED_FIELDS: ClassVar[tuple[str, ...]] = ("centroids", "bucket_weights")
    REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ("codes", "residuals", "centroids", "bucket_weights")

    @property
    def dim(self) -> int:
        return self.centroids.shape[-1]

    def codec_signature(self) -> dict:
        return {
            "nbits": self.nbits,
            "num_centroids": self.centroids.shape[0],
            "residual_bytes": self.residuals.shape[-1],
        }

    @classmethod
    def from_corpus(cls, codes, residuals, offsets, centroids, bucket_weights, nbits: int,
                    pid_start: int, pid_stop: int, *, inv_norms=None) -> "ResidualShard":
        """Documents [pid_start, pid_stop) of a whole residual-coded corpus (views into it)."""
        return cls._from_corpus(offsets, pid_start, pid_stop, codes=codes, residuals=residuals,
                                centroids=centroids, bucket_weights=bucket_weights, nbits=nbits,
                                inv_norms=inv_norms)


@dataclasses.dataclass(frozen=True)
class PQShard(_PackedShard):
    """Product-quantization codes of documents [pid_start, pid_stop), the arguments of
    ``ops.pq.maxsim_pq``.

    Attributes:
        codes: uint8 [T, M], one byte per sub-quantizer.
        codebooks: [M, 256, d / M], shared by all ranks. Token t decodes to the concatenation
            over m of ``codebooks[m, codes[t, m]]``, plus ``centroids[centroid_codes[t]]`` when the
            codes quantize PLAID residuals, times ``inv_norms[t]`` when given.
        centroid_codes: optional int32 [T], for codes trained on residuals.
        centroids: optional [C, d], shared by all ranks, with ``centroid_codes``.
        inv_norms: optional fp32 [T].
    """

    codes: torch.Tensor = None
    codebooks: torch.Tensor = None
    centroid_codes: torch.Tensor | None = None
    centroids: torch.Tensor | None = None
    inv_norms: torch.Tensor | None = None

    kind: ClassVar[str] = "pq"
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("codes", "centroid_codes", "inv_norms")
    SHARED_FIELDS: ClassVar[tuple[str, ...]] = ("codebooks", "centroids")
    REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ("codes", "codebooks")

    @property
    def dim(self) -> int:
        return self.codebooks.shape[0] * self.codebooks.shape[-1]

    def codec_signature(self) -> dict:
        return {"num_subquantizers": self.codebooks.shape[0], "codebook_size": self.codebooks.shape[1],
                "on_residuals": self.centroid_codes is not None}

    @classmethod
    def from_corpus(cls, codes, offsets, codebooks, pid_start: int, pid_stop: int, *,
                    centroid_codes=None, centroids=None, inv_norms=None) -> "PQShard":
        """Documents [pid_start, pid_stop) of a whole PQ-coded corpus (views into it)."""
        return cls._from_corpus(offsets, pid_start, pid_stop, codes=codes, codebooks=codebooks,
                                centroid_codes=centroid_codes, centroids=centroids, inv_norms=inv_norms)


SHARD_KINDS = {cls.kind: cls for cls in (DenseShard, ResidualShard, PQShard)}
