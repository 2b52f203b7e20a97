"""Throughput of sharded MaxSim search from 1 GPU to all of them (strong scaling, one corpus).

    torchrun --nproc_per_node=2 -m experiments.bench_distributed --out results/distributed

For each corpus kind (dense fp16 embeddings; colbert-ai residual codes, nbits = 2) and each world
size w in --world-sizes (default 1 and the full world), ranks 0..w-1 form a group, each holds
1/w of the same corpus (token-balanced pid ranges), and the group answers the same query batch
with :class:`ShardedIndex.score`. The corpus is generated on the GPUs from a seed per fixed-size
token chunk, so every w sees bit-identical documents, and the merged top-k of every w is checked
against w = 1 (``topk_equal``). Time is the slowest rank's wall time per batch, median over
--reps; the local scoring and the all-gather are also timed alone, to split the time into compute
and communication. Rows go to ``<out>/distributed.json`` and ``.csv`` with provenance; the table
is printed last.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time

import torch
import torch.distributed as dist

from . import harness
from tilemaxsim_plaid.distributed import (
    DenseShard,
    ResidualShard,
    ShardedIndex,
    default_scorer,
    init_from_env,
    partition_pid_ranges,
)

__all__ = ["main", "build_parser"]

_SIZE_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
# MS MARCO passages under ColBERTv2's tokenizer: 20-180 tokens, mean ~70.
DOC_LEN_RANGE = (16, 129)


def parse_size(text: str) -> int:
    """'48GiB' -> bytes. Units: B, KiB, MiB, GiB (binary)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]iB|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"size must look like 48GiB or 512MiB, got {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").upper()])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="dense,residual", help="comma list of dense, residual")
    parser.add_argument("--dense-size", type=parse_size, default=parse_size("96GiB"),
                        help="dense corpus: bytes of fp16 token embeddings (default 96GiB: two thirds "
                             "of one H200, which must hold all of it for the 1-GPU row)")
    parser.add_argument("--residual-size", type=parse_size, default=parse_size("32GiB"),
                        help="residual corpus: bytes of codes + residuals (default 32GiB, ~13 M documents)")
    parser.add_argument("--world-sizes", default=None,
                        help="comma list of group sizes to time (default: 1 and the full world)")
    parser.add_argument("--queries", type=int, default=32, help="queries per batch (B)")
    parser.add_argument("--lq", type=int, default=32, help="query tokens")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--nbits", type=int, default=2)
    parser.add_argument("--num-centroids", type=int, default=65536)
    parser.add_argument("--max-docs-per-call", type=int, default=1 << 21,
                        help="documents per scoring call (bounds the [B, docs] buffers)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-tokens", type=int, default=1 << 22,
                        help="tokens generated per seed (fixed, so every sharding sees the same corpus)")
    parser.add_argument("--scorer", choices=("op", "reference"), default="op")
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    parser.add_argument("--out", default="results/distributed")
    parser.add_argument("--name", default="distributed", help="result file stem")
    return parser


# ---------------------------------------------------------------- corpus, identical for every sharding

def _doc_offsets(num_tokens_target: int, seed: int) -> torch.Tensor:
    """int64 [N+1] offsets of the longest prefix of seeded document lengths within the budget."""
    g = torch.Generator().manual_seed(seed)
    mean = sum(DOC_LEN_RANGE) / 2
    lengths = torch.randint(*DOC_LEN_RANGE, (int(num_tokens_target / mean * 1.1) + 16,), generator=g)
    cumulative = torch.cumsum(lengths, 0)
    num_docs = int((cumulative <= num_tokens_target).sum())
    offsets = torch.zeros(num_docs + 1, dtype=torch.int64)
    offsets[1:] = cumulative[:num_docs]
    return offsets


def _fill_tokens(out: torch.Tensor, token_start: int, make_chunk, chunk_tokens: int) -> None:
    """out[i] = token (token_start + i) of the corpus, generated chunk by chunk from its seed."""
    token_stop = token_start + out.shape[0]
    for chunk in range(token_start // chunk_tokens, -(-token_stop // chunk_tokens)):
        lo, hi = chunk * chunk_tokens, (chunk + 1) * chunk_tokens
        values = make_chunk(chunk)
        a, b = max(lo, token_start), min(hi, token_stop)
        out[a - token_start:b - token_start] = values[a - lo:b - lo]


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def build_dense_shard(offsets, pid_start, pid_stop, args, device) -> DenseShard:
    t0, t1 = int(offsets[pid_start]), int(offsets[pid_stop])
    embeddings = torch.empty(t1 - t0, args.dim, dtype=torch.float16, device=device)

    def make_chunk(chunk):
        x = torch.randn(args.chunk_tokens, args.dim, device=device, generator=_generator(device, args.seed * 7919 + chunk))
        return torch.nn.functional.normalize(x, dim=-1).half()

    _fill_tokens(embeddings, t0, make_chunk, args.chunk_tokens)
    return DenseShard(offsets=(offsets[pid_start:pid_stop + 1] - t0).to(device), pid_start=pid_start,
                      max_doc_len=DOC_LEN_RANGE[1] - 1, embeddings=embeddings)


def build_residual_shard(offsets, pid_start, pid_stop, args, device) -> ResidualShard:
    t0, t1 = int(offsets[pid_start]), int(offsets[pid_stop])
    residual_bytes = args.dim * args.nbits // 8
    codes = torch.empty(t1 - t0, dtype=torch.int32, device=device)
    residuals = torch.empty(t1 - t0, residual_bytes, dtype=torch.uint8, device=device)
    _fill_tokens(codes, t0, lambda c: torch.randint(
        0, args.num_centroids, (args.chunk_tokens,), device=device, dtype=torch.int32,
        generator=_generator(device, args.seed * 7919 + c)), args.chunk_tokens)
    _fill_tokens(residuals, t0, lambda c: torch.randint(
        0, 256, (args.chunk_tokens, residual_bytes), device=device, dtype=torch.uint8,
        generator=_generator(device, args.seed * 7919 + c + 1_000_003)), args.chunk_tokens)
    g = _generator(device, args.seed + 17)
    centroids = torch.nn.functional.normalize(
        torch.randn(args.num_centroids, args.dim, device=device, generator=g), dim=-1).half()
    bucket_weights = torch.sort(torch.randn(2**args.nbits, device=device, generator=g) * 0.05).values
    return ResidualShard(offsets=(offsets[pid_start:pid_stop + 1] - t0).to(device), pid_start=pid_start,
                         max_doc_len=DOC_LEN_RANGE[1] - 1, codes=codes, residuals=residuals,
                         centroids=centroids, bucket_weights=bucket_weights, nbits=args.nbits)


BUILDERS = {"dense": (build_dense_shard, lambda args: 2 * args.dim),
            "residual": (build_residual_shard, lambda args: 4 + args.dim * args.nbits // 8)}


# ---------------------------------------------------------------- timing

def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_collective(fn, *, reps: int, warmup: int, group, device, comm_device) -> list[float]:
    """Per-rep wall time in ms of the slowest rank of ``group`` (ranks start together)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        dist.barrier(group=group)
        started = time.perf_counter()
        fn()
        _sync(device)
        elapsed = torch.tensor([(time.perf_counter() - started) * 1e3], device=comm_device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        times.append(float(elapsed))
    return times


def _summary(times: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(times, n=5, method="inclusive") if len(times) > 1 else [times[0]] * 4
    return statistics.median(times), q[0], q[3]


def run_world(kind, world, offsets, Q, args, device, group, scorer):
    """Build this rank's shard for a group of ``world`` ranks, time it; None off the group."""
    rank = dist.get_rank()
    if rank >= world:
        return None
    build, _ = BUILDERS[kind]
    doc_lengths = offsets[1:] - offsets[:-1]
    pid_start, pid_stop = partition_pid_ranges(doc_lengths, world, balance="tokens")[rank]
    shard = build(offsets, pid_start, pid_stop, args, device)
    index = ShardedIndex(shard, scorer, group=group, max_docs_per_call=args.max_docs_per_call)
    comm_device = index.comm_device
    result = index.score(Q, args.k)  # also validates the arguments once
    timing = dict(reps=args.reps, warmup=args.warmup, group=group, device=device, comm_device=comm_device)
    total = time_collective(lambda: index.score(Q, args.k, validate=False), **timing)
    blocks = shard.blocks(args.max_docs_per_call)
    local = time_collective(lambda: [scorer(Q, b, None, validate=False) for b in blocks], **timing)
    keys = torch.zeros(Q.shape[0], args.k, dtype=torch.int64, device=comm_device)
    gathered = [torch.empty_like(keys) for _ in range(world)]
    gather = time_collective(lambda: dist.all_gather(gathered, keys, group=group), **timing)
    shard_bytes = torch.tensor([shard.nbytes()], device=comm_device)
    dist.all_reduce(shard_bytes, group=group)
    info = {"total": total, "local": local, "gather": gather, "bytes": int(shard_bytes),
            "shard_tokens": shard.num_tokens}
    del index, shard, blocks
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result, info


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device, owns_group = init_from_env(args.backend)
    try:
        rows = _run(args, device)
    finally:
        if owns_group:
            dist.destroy_process_group()
    if rows is not None:
        harness.print_table(rows)
    return 0


def _run(args, device):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    sizes = ([int(w) for w in args.world_sizes.split(",")] if args.world_sizes
             else sorted({1, world_size}))
    if any(w < 1 or w > world_size for w in sizes):
        raise ValueError(f"--world-sizes must lie in [1, {world_size}], got {sizes}")
    # Every rank creates every group, in the same order (new_group is collective).
    groups = {w: dist.new_group(list(range(w))) for w in sizes}
    ceilings = harness.measure_ceilings() if device.type == "cuda" and rank == 0 else {}
    g = torch.Generator().manual_seed(args.seed + 1)
    Q = torch.nn.functional.normalize(torch.randn(args.queries, args.lq, args.dim, generator=g), dim=-1)
    Q = Q.half().to(device)
    rows, raw = [], {}
    for kind in args.kinds.split(","):
        build, bytes_per_token = BUILDERS[kind]
        size = args.dense_size if kind == "dense" else args.residual_size
        offsets = _doc_offsets(size // bytes_per_token(args), args.seed)
        num_docs, num_tokens = offsets.numel() - 1, int(offsets[-1])
        scorer = default_scorer(kind, args.scorer)
        shape = (f"{kind} N={num_docs} T={num_tokens} B={args.queries} Lq={args.lq} d={args.dim} "
                 f"k={args.k}" + (f" nbits={args.nbits}" if kind == "residual" else ""))
        baseline = None
        for w in sizes:
            outcome = run_world(kind, w, offsets, Q, args, device, groups[w], scorer)
            dist.barrier()
            if rank != 0:
                continue
            (scores, pids), info = outcome
            if baseline is None:
                baseline = (scores, pids)
            raw[f"{kind}/w{w}"] = info
            flops = 2.0 * args.queries * args.lq * num_tokens * args.dim
            row = harness.make_row(
                "distributed", shape, f"sharded-{w}gpu", _summary(info["total"]),
                num_docs=args.queries * num_docs, nbytes=info["bytes"], flops=flops, ceilings=ceilings,
                world_size=w, ms_local_score=_summary(info["local"])[0],
                ms_allgather=_summary(info["gather"])[0],
                topk_equal_to_first=bool(torch.equal(pids, baseline[1]) and torch.equal(scores, baseline[0])),
                max_score_diff=float((scores - baseline[0]).abs().max()) if scores.numel() else 0.0,
            )
            rows.append(row)
    if rank != 0:
        return None
    for row in rows:
        first = next(r for r in rows if r["shape"] == row["shape"])
        if row is not first:
            row["speedup_vs_" + first["provider"]] = first["ms"] / row["ms"]
    meta = dict(vars(args), world_sizes=sizes, raw_times_ms=raw,
                env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                    "NVSHMEM_DISABLE_NVLS")})
    path = harness.write_results(rows, args.out, args.name, ceilings=ceilings, meta=meta)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
