"""``python -m tilemaxsim_plaid.distributed``: sharded exact MaxSim search from the command line.

Run one process per GPU with torchrun; every rank reads its own pid range and all ranks write
nothing but rank 0, which writes the merged ranking::

    torchrun --nproc_per_node=2 -m tilemaxsim_plaid.distributed \\
        --plaid-index /path/to/index --queries queries.pt --k 100 --output ranking.tsv

``--queries`` is a ``torch.save`` of a [B, Lq, d] tensor, or of a dict with ``"Q"`` and optional
``"query_lengths"``. ``--dense`` is a ``torch.save`` of ``{"embeddings": [T, d], "offsets": [N+1]}``,
loaded memory-mapped so a rank pages in only its own range. The output is a ``.tsv`` in
colbert-ai's ranking format (qid, pid, rank from 1, score) or a ``.pt`` dict of scores and pids.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from tilemaxsim_plaid.distributed.launch import init_from_env
from tilemaxsim_plaid.distributed.scorers import default_scorer
from tilemaxsim_plaid.distributed.sharded_index import ShardedDenseIndex, ShardedResidualIndex

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tilemaxsim_plaid.distributed",
        description="Exact MaxSim top-k over a corpus sharded by pid ranges across the ranks of torchrun.",
    )
    corpus = parser.add_mutually_exclusive_group(required=True)
    corpus.add_argument("--plaid-index", help="a colbert-ai 0.2.22 index directory (residual codes)")
    corpus.add_argument("--dense", help='torch.save of {"embeddings": [T, d], "offsets": [N+1]}')
    parser.add_argument("--queries", required=True, help='torch.save of Q [B, Lq, d] or {"Q", "query_lengths"}')
    parser.add_argument("--k", type=int, default=10, help="documents per query (default 10)")
    parser.add_argument("--batch-size", type=int, default=None, help="queries per round (default all)")
    parser.add_argument("--max-docs-per-call", type=int, default=None,
                        help="score a shard in blocks of this many documents (bounds memory)")
    parser.add_argument("--balance", choices=("tokens", "docs"), default="tokens",
                        help="split pid ranges by equal tokens (default) or equal documents")
    parser.add_argument("--scorer", choices=("op", "reference"), default="op",
                        help="Triton kernels (default) or the plain-torch float64 reference")
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    parser.add_argument("--output", default=None, help=".tsv ranking or .pt dict, written by rank 0")
    return parser


def _load_queries(path: str):
    loaded = torch.load(path, map_location="cpu")
    if isinstance(loaded, dict):
        return loaded["Q"], loaded.get("query_lengths")
    return loaded, None


def _write_output(path: str, scores: torch.Tensor, pids: torch.Tensor) -> None:
    scores, pids = scores.cpu(), pids.cpu()
    if path.endswith(".tsv"):
        with open(path, "w") as f:
            for qid, (row_scores, row_pids) in enumerate(zip(scores.tolist(), pids.tolist())):
                for rank, (score, pid) in enumerate(zip(row_scores, row_pids), start=1):
                    f.write(f"{qid}\t{pid}\t{rank}\t{score}\n")
    else:
        torch.save({"scores": scores, "pids": pids}, path)


def main(argv=None) -> int:
    """Entry point of ``python -m tilemaxsim_plaid.distributed`` (and of torchrun ``-m``)."""
    args = build_parser().parse_args(argv)
    device, owns_group = init_from_env(args.backend)
    try:
        Q, query_lengths = _load_queries(args.queries)
        if args.plaid_index:
            kind = "residual"
            index = ShardedResidualIndex.from_plaid_index(
                args.plaid_index, device=device, scorer=default_scorer(kind, args.scorer),
                balance=args.balance, max_docs_per_call=args.max_docs_per_call)
        else:
            kind = "dense"
            corpus = torch.load(args.dense, map_location="cpu", mmap=True)
            index = ShardedDenseIndex.from_corpus(
                corpus["embeddings"], corpus["offsets"], device=device,
                scorer=default_scorer(kind, args.scorer), balance=args.balance,
                max_docs_per_call=args.max_docs_per_call)
            Q = Q.to(corpus["embeddings"].dtype)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        started = time.perf_counter()
        scores, pids = index.score(Q, args.k, query_lengths=query_lengths, batch_size=args.batch_size)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if dist.get_rank() == 0:
            if args.output:
                _write_output(args.output, scores if scores.dim() == 2 else scores[None],
                              pids if pids.dim() == 2 else pids[None])
            queries = Q.shape[0] if Q.dim() == 3 else 1
            print(f"{kind}: {queries} queries x {index.num_docs} documents on {index.world_size} rank(s), "
                  f"top-{args.k} in {elapsed_ms:.1f} ms" + (f"; wrote {args.output}" if args.output else ""))
    finally:
        if owns_group:
            dist.destroy_process_group()
    return 0
