"""Stage 4's centroid-score table at MS MARCO's centroid count: split by query rows, or whole.

    python -m experiments.bench_stage4_table [--num-docs 100000] [--candidates N ...]
        [--centroids 262144] [--nbits 2] [--rounds 3] [--out DIR]      (GPU)

The plugin's stage 4 scores its candidates with an fp32 query, fp16x2 products and the [C, 32]
fp32 table stage 1 made (``centroids @ Q.T``). At C = 2^18 that table is 32 MiB, over
``ops.residual.MAX_CENTROID_TABLE_BYTES``: the op splits it into two tiles of 16 query rows, copies
each tile out of the caller's table into a dense one and scores the candidates once per tile, so
that each launch's table stays in L2 while the candidates' tokens look it up. Whether that pays
depends on how many lookups there are per table row. Per number of candidates (random documents
of ``bench_compressed.make_index``'s MS MARCO-like index), this times that call as the op's
default makes it (``split``) beside one launch over the whole table (``whole``: the default's
launch config with ``centroid_table=True``), in alternated rounds, each as called (do_bench)
and replayed from a CUDA graph (``graph_ms``: the plugin replays stage 4 inside its search
graph). The two must score alike up to fp32 rounding (the split sums two tiles' sums).
Rows go to ``OUT/stage4_table.json`` (harness format).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
import torch.nn.functional as F

from experiments import harness
from experiments.bench_compressed import DIM, QUERY_LEN, make_index
from tilemaxsim_plaid.ops import residual

SUITE = "stage4_table"
CANDIDATES = (2_000, 6_000, 12_000, 25_000, 50_000, 100_000)


def stage4_calls(index: dict, Q: torch.Tensor, table: torch.Tensor, pids: torch.Tensor):
    """``{"split": default call, "whole": one launch over the whole table}`` for ``pids``."""
    args = (Q[None], index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], index["nbits"], pids)
    kwargs = dict(inv_norms=index["inv_norms"], centroid_scores=table, split_query=True,
                  validate=False)
    whole = dataclasses.replace(
        residual.default_residual_config(1, Q.shape[0], True, pids.numel(), Q.element_size(),
                                         False, index["nbits"]),
        centroid_table=True)
    return {"split": lambda: residual.maxsim_residual(*args, **kwargs),
            "whole": lambda: residual.maxsim_residual(*args, config=whole, **kwargs)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_stage4_table",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--num-docs", type=int, default=100_000)
    parser.add_argument("--candidates", type=int, nargs="+", default=list(CANDIDATES))
    parser.add_argument("--centroids", type=int, default=1 << 18)
    parser.add_argument("--nbits", type=int, default=2, choices=(1, 2, 4))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/stage4_table")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU: it times GPU launches")
    if max(args.candidates) > args.num_docs:
        parser.error(f"--candidates at most --num-docs ({args.num_docs})")
    device = torch.device("cuda")
    index = make_index(args.num_docs, args.centroids, DIM, args.nbits, device)
    g = torch.Generator().manual_seed(2)
    Q = F.normalize(torch.randn(QUERY_LEN, DIM, generator=g), dim=-1).to(device)
    table = index["centroids"].float() @ Q.T  # stage 1's table: [C, Lq] fp32
    tokens_per_doc = index["codes"].numel() / args.num_docs
    rows = []
    for m in args.candidates:
        pids = torch.randperm(args.num_docs, generator=g)[:m].sort().values.to(device)
        calls = stage4_calls(index, Q, table, pids)
        want = calls["split"]()
        got = calls["whole"]()
        if not (torch.equal(torch.isfinite(got), torch.isfinite(want))
                and torch.allclose(got, want, rtol=1e-5, atol=1e-5)):
            raise AssertionError(f"{m} candidates: the whole table does not score as the split one")
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                times[name].append(harness.time_ms(fn)[0])
        lookups = m * tokens_per_doc / args.centroids
        for name, samples in times.items():
            ms = statistics.median(samples)
            rows.append(harness.make_row(
                SUITE, f"C={args.centroids} nbits={args.nbits} {m} candidates", name,
                (ms, min(samples), max(samples)), num_docs=m, nbytes=0, flops=0, ceilings={},
                candidates=m, centroids=args.centroids, nbits=args.nbits,
                lookups_per_row=lookups, rounds=samples,
                graph_ms=harness.graph_replay_ms(calls[name])))
        split, whole = rows[-2], rows[-1]
        print(f"{m:>7} candidates ({lookups:5.2f} lookups a table row): split {split['ms']:.4f} ms "
              f"(graph {split['graph_ms']:.4f}), whole {whole['ms']:.4f} (graph "
              f"{whole['graph_ms']:.4f}): whole/split graph {whole['graph_ms'] / split['graph_ms']:.3f}",
              flush=True)
    harness.write_results(rows, args.out, SUITE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
