"""Read one pid range of an on-disk colbert-ai 0.2.22 PLAID index, and split an index into ranges.

colbert-ai writes an index as chunks of consecutive passages:

    metadata.json            {"config": {"dim", "nbits", ...}, "num_chunks", "num_embeddings", ...}
    {i}.metadata.json        {"passage_offset", "num_passages", "num_embeddings", "embedding_offset"}
    doclens.{i}.json         [tokens of each passage of chunk i]
    {i}.codes.pt             int32 [n_i] centroid ids
    {i}.residuals.pt         uint8 [n_i, dim * nbits / 8]
    centroids.pt, buckets.pt the codec: [C, dim] fp16, (cutoffs, weights [2**nbits])

Passage p's tokens are the ``doclens[p]`` rows that follow those of passages 0..p-1, across chunk
boundaries. A rank therefore needs the doclens (a few bytes per passage) to find its token range,
and then only the code and residual files of the chunks that overlap it.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from tilemaxsim_plaid.distributed.shards import ResidualShard, partition_pid_ranges

__all__ = ["PlaidLayout", "read_plaid_layout", "plaid_pid_ranges", "load_plaid_shard"]


@dataclasses.dataclass(frozen=True)
class PlaidLayout:
    """Where each passage and chunk of an index lives.

    Attributes:
        dim, nbits: from the index's config.
        doclens: int64 [N] tokens per passage.
        chunk_passage_offsets: first pid of each chunk, [num_chunks + 1] (last = N).
        chunk_embedding_offsets: first token row of each chunk, [num_chunks + 1] (last = T).
    """

    dim: int
    nbits: int
    doclens: torch.Tensor
    chunk_passage_offsets: list[int]
    chunk_embedding_offsets: list[int]


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def read_plaid_layout(index_path) -> PlaidLayout:
    """Read the metadata and doclens of a colbert-ai index (no codes, no residuals).

    Raises:
        FileNotFoundError: a file colbert-ai writes is missing.
        ValueError: the chunk metadata disagrees with the doclens.
    """
    metadata = _read_json(os.path.join(index_path, "metadata.json"))
    config = metadata["config"]
    doclens: list[int] = []
    passage_offsets, embedding_offsets = [0], [0]
    for chunk in range(int(metadata["num_chunks"])):
        chunk_doclens = _read_json(os.path.join(index_path, f"doclens.{chunk}.json"))
        chunk_meta = _read_json(os.path.join(index_path, f"{chunk}.metadata.json"))
        if chunk_meta["num_passages"] != len(chunk_doclens) or chunk_meta["num_embeddings"] != sum(chunk_doclens):
            raise ValueError(
                f"chunk {chunk} of {index_path}: metadata says {chunk_meta['num_passages']} passages / "
                f"{chunk_meta['num_embeddings']} tokens, doclens.{chunk}.json has {len(chunk_doclens)} / "
                f"{sum(chunk_doclens)}"
            )
        doclens.extend(chunk_doclens)
        passage_offsets.append(passage_offsets[-1] + len(chunk_doclens))
        embedding_offsets.append(embedding_offsets[-1] + sum(chunk_doclens))
    return PlaidLayout(
        dim=int(config["dim"]),
        nbits=int(config["nbits"]),
        doclens=torch.tensor(doclens, dtype=torch.int64),
        chunk_passage_offsets=passage_offsets,
        chunk_embedding_offsets=embedding_offsets,
    )


def plaid_pid_ranges(index_path, world_size: int, *, balance: str = "tokens") -> list[tuple[int, int]]:
    """Split an index's pids into ``world_size`` contiguous ranges (reads only its doclens).

    Args:
        index_path: a colbert-ai index directory.
        world_size: number of ranks.
        balance: ``"tokens"`` or ``"docs"``, see :func:`~.shards.partition_pid_ranges`.

    Returns:
        (pid_start, pid_stop) per rank.
    """
    return partition_pid_ranges(read_plaid_layout(index_path).doclens, world_size, balance=balance)


def load_plaid_shard(index_path, pid_start: int, pid_stop: int, *, layout: PlaidLayout | None = None) -> ResidualShard:
    """Load passages [pid_start, pid_stop) of a colbert-ai index as a CPU :class:`ResidualShard`.

    Only the ``{i}.codes.pt`` / ``{i}.residuals.pt`` files of chunks overlapping the range are read.
    Centroids and bucket weights keep the dtypes colbert-ai saved (fp16 centroids).

    Args:
        index_path: a colbert-ai index directory.
        pid_start, pid_stop: the passage range, 0 <= pid_start <= pid_stop <= N.
        layout: a :func:`read_plaid_layout` result to reuse (default: read it).
    """
    layout = layout or read_plaid_layout(index_path)
    num_docs = layout.doclens.numel()
    if not 0 <= pid_start <= pid_stop <= num_docs:
        raise ValueError(f"pid range [{pid_start}, {pid_stop}) is outside the index's [0, {num_docs})")
    doc_offsets = torch.zeros(num_docs + 1, dtype=torch.int64)
    torch.cumsum(layout.doclens, 0, out=doc_offsets[1:])
    token_start, token_stop = int(doc_offsets[pid_start]), int(doc_offsets[pid_stop])

    codes, residuals = [], []
    bounds = layout.chunk_embedding_offsets
    for chunk in range(len(bounds) - 1):
        lo, hi = max(bounds[chunk], token_start), min(bounds[chunk + 1], token_stop)
        if lo >= hi:
            continue
        chunk_codes = torch.load(os.path.join(index_path, f"{chunk}.codes.pt"), map_location="cpu")
        chunk_residuals = torch.load(os.path.join(index_path, f"{chunk}.residuals.pt"), map_location="cpu")
        codes.append(chunk_codes[lo - bounds[chunk]:hi - bounds[chunk]].to(torch.int32))
        residuals.append(chunk_residuals[lo - bounds[chunk]:hi - bounds[chunk]])
    residual_bytes = layout.dim * layout.nbits // 8
    codes = torch.cat(codes) if codes else torch.empty(0, dtype=torch.int32)
    residuals = torch.cat(residuals) if residuals else torch.empty(0, residual_bytes, dtype=torch.uint8)

    centroids = torch.load(os.path.join(index_path, "centroids.pt"), map_location="cpu")
    _cutoffs, bucket_weights = torch.load(os.path.join(index_path, "buckets.pt"), map_location="cpu")
    offsets = doc_offsets[pid_start:pid_stop + 1] - token_start
    return ResidualShard(
        offsets=offsets,
        pid_start=pid_start,
        max_doc_len=int(layout.doclens[pid_start:pid_stop].max()) if pid_stop > pid_start else 0,
        codes=codes.contiguous(),
        residuals=residuals.contiguous(),
        centroids=centroids,
        bucket_weights=bucket_weights,
        nbits=layout.nbits,
    )
