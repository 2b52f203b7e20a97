"""Stage 4's centroid-score table past the table budget: split by query rows, or whole.

    python -m experiments.bench_stage4_table [--num-docs 100000] [--candidates N ...]
        [--centroids C ...] [--query-lens L ...] [--modes search rerank] [--nbits 2]
        [--rounds 3] [--out DIR]      (GPU)

The plugin's stage 4 scores its candidates with an fp32 query and fp16x2 products. In a search
it reuses the [C, Lq] fp32 table stage 1 made (``centroids @ Q.T``, mode ``search``); in a
rerank the op builds it from the fp16 centroids (mode ``rerank``). At C = 2^18 a 32-token table
is 32 MiB, over ``ops.residual.MAX_CENTROID_TABLE_BYTES``: the op splits it by query rows
(``centroid_table_tiles``; a caller's table is copied out tile by tile), and scores the
candidates once per tile so that each launch's table stays in L2 while their tokens look it up;
where even a 16-row tile is over the budget it gathers centroid rows instead (and the plugin
multiplies in tf32x3, as the default row here does). Per (C, Lq, mode)
and number of candidates (random documents of ``bench_compressed.make_index``'s MS MARCO-like
index, random codes), this times the op's default call (``default``) beside one launch over
the whole table (``whole``: the default's launch config with ``centroid_table=True``), in
alternated rounds, each as called (do_bench) and replayed from a CUDA graph (``graph_ms``: the
plugin replays stage 4 inside its search graph). Both must score alike within 1e-4.
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
MODES = ("search", "rerank")


def stage4_calls(index: dict, Q: torch.Tensor, table: torch.Tensor | None, pids: torch.Tensor):
    """``{"default": the plugin's stage-4 call, "whole": one launch over the whole table}`` for
    ``pids``; ``table``: stage 1's [C, Lq] (a search), or None (a rerank: the op builds it).
    Where no table tile fits the budget, the plugin's call is fp32 products over gathered
    centroid rows (``plaid.backends.products_for``: tf32x3), which the default row times."""
    args = (Q[None], index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], index["nbits"], pids)
    kwargs = dict(inv_norms=index["inv_norms"], centroid_scores=table, split_query=True,
                  validate=False)
    whole = dataclasses.replace(
        residual.default_residual_config(1, Q.shape[0], True, pids.numel(), Q.element_size(),
                                         False, index["nbits"]),
        centroid_table=True)
    gathers = residual.centroid_table_tiles(index["centroids"].shape[0], 1, Q.shape[0], 4) is None
    default = ({**kwargs, "centroid_scores": None, "split_query": False} if gathers else kwargs)
    return {"default": lambda: residual.maxsim_residual(*args, **default),
            "whole": lambda: residual.maxsim_residual(*args, config=whole, **kwargs)}


def bench_case(index: dict, Q: torch.Tensor, mode: str, candidates, rounds: int, g) -> list[dict]:
    C, num_docs = index["centroids"].shape[0], index["offsets"].numel() - 1
    table = index["centroids"].float() @ Q.T if mode == "search" else None
    tokens_per_doc = index["codes"].numel() / num_docs
    tiles = residual.centroid_table_tiles(C, 1, Q.shape[0], 4)
    rows = []
    for m in candidates:
        pids = torch.randperm(num_docs, generator=g)[:m].sort().values.to(Q.device)
        calls = stage4_calls(index, Q, table, pids)
        want, got = calls["default"](), calls["whole"]()
        if not (torch.equal(torch.isfinite(got), torch.isfinite(want))
                and torch.allclose(got, want, rtol=1e-4, atol=1e-4)):
            raise AssertionError(f"{mode} C={C} {m} candidates: the whole table does not score "
                                 "as the default")
        times = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name].append(harness.time_ms(fn)[0])
        lookups = m * tokens_per_doc / C
        for name, samples in times.items():
            ms = statistics.median(samples)
            rows.append(harness.make_row(
                SUITE, f"{mode} C={C} Lq={Q.shape[0]} nbits={index['nbits']} {m} candidates",
                name, (ms, min(samples), max(samples)), num_docs=m, nbytes=0, flops=0,
                ceilings={}, mode=mode, candidates=m, centroids=C, query_len=Q.shape[0],
                nbits=index["nbits"], table_mib=C * Q.shape[0] * 4 / 2**20,
                default_tiles=str(tiles), lookups_per_row=lookups, rounds=samples,
                graph_ms=harness.graph_replay_ms(calls[name])))
        default, whole = rows[-2], rows[-1]
        print(f"{mode} C={C} Lq={Q.shape[0]} (default tiles {tiles}) {m:>7} candidates "
              f"({lookups:5.2f} lookups a table row): default {default['ms']:.4f} ms (graph "
              f"{default['graph_ms']:.4f}), whole {whole['ms']:.4f} (graph {whole['graph_ms']:.4f}): "
              f"whole/default graph {whole['graph_ms'] / default['graph_ms']:.3f}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_stage4_table",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--num-docs", type=int, default=100_000)
    parser.add_argument("--candidates", type=int, nargs="+", default=list(CANDIDATES))
    parser.add_argument("--centroids", type=int, nargs="+", default=[1 << 18])
    parser.add_argument("--query-lens", type=int, nargs="+", default=[QUERY_LEN])
    parser.add_argument("--modes", nargs="+", default=["search"], choices=MODES)
    parser.add_argument("--nbits", type=int, default=2, choices=(1, 2, 4))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/stage4_table")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU: it times GPU launches")
    if max(args.candidates) > args.num_docs:
        parser.error(f"--candidates at most --num-docs ({args.num_docs})")
    device = torch.device("cuda")
    rows = []
    for C in args.centroids:
        index = make_index(args.num_docs, C, DIM, args.nbits, device)
        g = torch.Generator().manual_seed(2)
        for Lq in args.query_lens:
            Q = F.normalize(torch.randn(Lq, DIM, generator=g), dim=-1).to(device)
            for mode in args.modes:
                rows += bench_case(index, Q, mode, args.candidates, args.rounds, g)
        del index
    harness.write_results(rows, args.out, SUITE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
