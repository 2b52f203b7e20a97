"""Fabricated corpora and a two-process gloo launcher for the distributed tests.

Workers are started with the ``spawn`` method (a fork after torch has started threads can hang),
so every function a worker runs lives at module level and is imported by name in the child.
"""

from __future__ import annotations

import datetime
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A collective that waits longer than this means a rank failed and the other is stuck: fail fast
# instead of the 30-minute default.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
WORLD_SIZE = 2


def _worker(rank: int, world_size: int, init_file: str, scenario, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    try:
        scenario(*args)
    finally:
        dist.destroy_process_group()


def run_on_two_ranks(tmp_path, scenario, *args) -> None:
    """Run ``scenario(*args)`` on ranks 0 and 1 of a fresh gloo group; a failure on any rank
    fails the caller with that rank's traceback."""
    init_file = os.path.join(str(tmp_path), "dist_init")
    mp.start_processes(_worker, args=(WORLD_SIZE, init_file, scenario, args), nprocs=WORLD_SIZE,
                       join=True, start_method="spawn")


def random_packed_corpus(lengths: list[int], dim: int, *, seed: int, dtype=torch.float16):
    """Unit-norm token embeddings [T, d] and offsets [N+1] for documents of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    embeddings = torch.nn.functional.normalize(torch.randn(int(offsets[-1]), dim, generator=g), dim=-1)
    return embeddings.to(dtype), offsets


def random_queries(num_queries: int, Lq: int, dim: int, *, seed: int, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(num_queries, Lq, dim, generator=g), dim=-1).to(dtype)


def random_residual_codes(num_tokens: int, dim: int, nbits: int, num_centroids: int, *, seed: int):
    """(codes int32 [T], residuals uint8 [T, d*nbits/8], centroids fp16 [C, d], bucket_weights [2**nbits])."""
    g = torch.Generator().manual_seed(seed)
    centroids = torch.nn.functional.normalize(torch.randn(num_centroids, dim, generator=g), dim=-1).half()
    codes = torch.randint(0, num_centroids, (num_tokens,), generator=g, dtype=torch.int32)
    residuals = torch.randint(0, 256, (num_tokens, dim * nbits // 8), generator=g, dtype=torch.uint8)
    bucket_weights = torch.sort(torch.randn(2**nbits, generator=g) * 0.05).values
    return codes, residuals, centroids, bucket_weights


def write_plaid_index(path, chunk_doclens: list[list[int]], *, dim: int, nbits: int,
                      num_centroids: int, seed: int) -> None:
    """Write the files colbert-ai 0.2.22 reads for an index's codec, doclens and codes (the
    layout of ``CollectionIndexer``), with random codes: no encoder, no k-means."""
    os.makedirs(path, exist_ok=True)
    total = sum(sum(c) for c in chunk_doclens)
    codes, residuals, centroids, bucket_weights = random_residual_codes(
        total, dim, nbits, num_centroids, seed=seed)
    cutoffs = torch.sort(torch.randn(2**nbits - 1) * 0.03).values
    torch.save(centroids, os.path.join(path, "centroids.pt"))
    torch.save((cutoffs, bucket_weights), os.path.join(path, "buckets.pt"))
    torch.save(torch.tensor([0.02]), os.path.join(path, "avg_residual.pt"))
    passage_offset = embedding_offset = 0
    for chunk, doclens in enumerate(chunk_doclens):
        n = sum(doclens)
        torch.save(codes[embedding_offset:embedding_offset + n].clone(), os.path.join(path, f"{chunk}.codes.pt"))
        torch.save(residuals[embedding_offset:embedding_offset + n].clone(),
                   os.path.join(path, f"{chunk}.residuals.pt"))
        with open(os.path.join(path, f"doclens.{chunk}.json"), "w") as f:
            json.dump(doclens, f)
        with open(os.path.join(path, f"{chunk}.metadata.json"), "w") as f:
            json.dump({"passage_offset": passage_offset, "num_passages": len(doclens),
                       "num_embeddings": n, "embedding_offset": embedding_offset}, f)
        passage_offset += len(doclens)
        embedding_offset += n
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump({"config": {"dim": dim, "nbits": nbits}, "num_chunks": len(chunk_doclens),
                   "num_partitions": num_centroids, "num_embeddings": total,
                   "avg_doclen": total / passage_offset}, f)
