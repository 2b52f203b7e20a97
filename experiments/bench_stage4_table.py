"""Centroid-score tables past the table budget: one query's table whole, or split by query rows.

    python -m experiments.bench_stage4_table [--num-docs 100000] [--candidates N ...]
        [--centroids C ...] [--query-lens L ...] [--modes search rerank fp16 bf16 fp32] [--nbits 2]
        [--rounds 3] [--out DIR]      (GPU)

The plugin's stage 4 scores its candidates with an fp32 query and fp16x2 products. In a search
it reuses the [C, Lq] fp32 table stage 1 made (``centroids @ Q.T``, mode ``search``); in a
rerank the op builds it from the fp16 centroids (mode ``rerank``); a user of ``maxsim_residual``
with an fp16 query has the op build an fp16 table (mode ``fp16``), with a bf16 or fp32 one an
fp32 table (modes ``bf16``, ``fp32``). At C = 2^18 a 32-token fp32
table is 32 MiB, over ``ops.residual.MAX_CENTROID_TABLE_BYTES``. Per (C, Lq, mode) and number of
candidates (random documents of ``bench_compressed.make_index``'s MS MARCO-like index, random
codes), this times the op's default call (``default``: one query's table whole,
``ops.residual.WHOLE_TABLE_ROWS``, except one the op would build where no tile fits, which it
gathers) beside the same call under the budget alone (``split``:
``WHOLE_TABLE_ROWS = 0``, the rule before: the table split by query rows, its tiles copied out of
a caller's table, or centroid rows gathered where no 16-row tile fits, which the plugin
multiplies in tf32x3), and for a user's query the op's launch over gathered centroid rows
(``gather``), in alternated rounds, each as called (do_bench) and replayed from a CUDA
graph (``graph_ms``: the plugin replays stage 4 inside its search graph). Both must score alike
within 1e-4 (1e-2 for an fp16 query, 3e-2 for bf16). Rows go to ``OUT/stage4_table.json`` (harness format).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from unittest import mock

import torch
import torch.nn.functional as F

from experiments import harness
from experiments.bench_compressed import DIM, QUERY_LEN, make_index
from tilemaxsim_plaid.ops import residual

SUITE = "stage4_table"
CANDIDATES = (2_000, 6_000, 12_000, 25_000, 50_000, 100_000)
# The query's dtype in the modes where the op builds the table for a user's query.
USER_MODES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MODES = ("search", "rerank", *USER_MODES)
# Agreement of the calls: fp32 products and tables, or a 16-bit query's products.
TOLERANCE = {"search": 1e-4, "rerank": 1e-4, "fp16": 1e-2, "bf16": 3e-2, "fp32": 1e-4}


def budget_rule():
    """The op under MAX_CENTROID_TABLE_BYTES alone (no whole table for one query): every table
    over it split by query rows, or its centroid rows gathered."""
    return mock.patch.object(residual, "WHOLE_TABLE_ROWS", 0)


def stage4_calls(index: dict, Q: torch.Tensor, mode: str, pids: torch.Tensor):
    """``{"split": the call under budget_rule, "default": the op's default call}`` for ``pids``
    (and, for a user's query, ``"gather"``: the op's launch over gathered centroid rows).
    ``mode``: "search" (stage 1's table given), "rerank" (the op builds it), both with fp16x2
    products (``split_query``) of the fp32 ``Q``, or a user's query in USER_MODES' dtype (the
    op's own table: fp16 for fp16, else fp32). Where budget_rule fits no table tile, the plugin's call was fp32 products over
    gathered centroid rows (``plaid.backends.products_for``: tf32x3), which "split" times."""
    args = (index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], index["nbits"], pids)
    if mode in USER_MODES:
        Qd = Q.to(USER_MODES[mode])[None]
        call = dict(inv_norms=index["inv_norms"], validate=False)
        # The op's own launch where it gathers centroid rows (pair decoder, codes not ahead).
        gather = dataclasses.replace(
            residual.default_residual_config(1, Q.shape[0], False, pids.numel(),
                                             Qd.element_size(), mode == "fp16", index["nbits"]),
            centroid_table=False, decode="pairs", pipeline_codes=False)
        return {"split": lambda: _under_budget_rule(Qd, args, call),
                "default": lambda: residual.maxsim_residual(Qd, *args, **call),
                "gather": lambda: residual.maxsim_residual(Qd, *args, config=gather, **call)}
    table = index["centroids"].float() @ Q.T if mode == "search" else None
    call = dict(inv_norms=index["inv_norms"], centroid_scores=table, split_query=True,
                validate=False)
    with budget_rule():
        gathers = residual.centroid_table_tiles(index["centroids"].shape[0], 1, Q.shape[0], 4) is None
    before = {**call, "centroid_scores": None, "split_query": False} if gathers else call
    return {"split": lambda: _under_budget_rule(Q[None], args, before),
            "default": lambda: residual.maxsim_residual(Q[None], *args, **call)}


def _under_budget_rule(Q3, args, call):
    with budget_rule():
        return residual.maxsim_residual(Q3, *args, **call)


def bench_case(index: dict, Q: torch.Tensor, mode: str, candidates, rounds: int, g) -> list[dict]:
    C, num_docs = index["centroids"].shape[0], index["offsets"].numel() - 1
    tokens_per_doc = index["codes"].numel() / num_docs
    with budget_rule():
        tiles = residual.centroid_table_tiles(C, 1, Q.shape[0], 2 if mode == "fp16" else 4)
    rows = []
    for m in candidates:
        pids = torch.randperm(num_docs, generator=g)[:m].sort().values.to(Q.device)
        calls = stage4_calls(index, Q, mode, pids)
        want = calls["split"]()
        tol = TOLERANCE[mode]
        for name in calls.keys() - {"split"}:
            got = calls[name]()
            if not (torch.equal(torch.isfinite(got), torch.isfinite(want))
                    and torch.allclose(got, want, rtol=tol, atol=tol)):
                raise AssertionError(f"{mode} C={C} {m} candidates: {name!r} does not score as "
                                     "the split table")
        times = harness.rounds_ms(calls, rounds)
        lookups = m * tokens_per_doc / C
        for name, samples in times.items():
            ms = statistics.median(samples)
            rows.append(harness.make_row(
                SUITE, f"{mode} C={C} Lq={Q.shape[0]} nbits={index['nbits']} {m} candidates",
                name, (ms, min(samples), max(samples)), num_docs=m, nbytes=0, flops=0,
                ceilings={}, mode=mode, candidates=m, centroids=C, query_len=Q.shape[0],
                nbits=index["nbits"],
                table_mib=C * Q.shape[0] * (2 if mode == "fp16" else 4) / 2**20,
                split_tiles=str(tiles), lookups_per_row=lookups, rounds=samples,
                graph_ms=harness.graph_replay_ms(calls[name])))
        mine = {row["provider"]: row for row in rows[-len(calls):]}
        print(f"{mode} C={C} Lq={Q.shape[0]} (split tiles {tiles}) {m:>7} candidates "
              f"({lookups:5.2f} lookups a table row): " + ", ".join(
                  f"{name} {row['ms']:.4f} ms (graph {row['graph_ms']:.4f})"
                  for name, row in mine.items())
              + f": default/split graph {mine['default']['graph_ms'] / mine['split']['graph_ms']:.3f}",
              flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_stage4_table",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--num-docs", type=int, default=100_000)
    parser.add_argument("--candidates", type=int, nargs="+", default=list(CANDIDATES))
    parser.add_argument("--centroids", type=int, nargs="+", default=[1 << 18])
    parser.add_argument("--query-lens", type=int, nargs="+", default=[QUERY_LEN])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
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
