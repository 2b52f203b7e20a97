"""Ranking equivalence of the plugin on a real PLAID index, query by query.

For every query and every k (with colbert-ai's own ncells / threshold / ndocs defaults for that k):

1. Candidate sets after stages 2-3: the plugin's against stock colbert-ai's on the same index.
   A difference counts as a tie when every differing passage scores within TIE_TOLERANCE of the
   plugin's stage-3 cutoff (float64 centroid interaction).
2. The plugin's top k against the exact order of its candidates: float64 MaxSim over PLAID's
   decompressed (fp32) embeddings. Lists that differ only between passages whose exact scores
   are within TIE_TOLERANCE count as ties.
3. The plugin's top k against stock's (the same list, or the same set).

    python -m experiments.equivalence configs/wiki-vital.yaml --condition d128-k10 \
        --ks 10 100 1000 --out results/equivalence/wiki-vital-cpu

Runs where the index runs (CPU: the plugin's exact torch path against colbert-ai's C++ path;
GPU: the fused kernels against colbert-ai's fp16 GPU path). Queries come from the runner's
`prepare` step (all of them, encoded once and cached next to the index).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time

import torch

from experiments import reproduce

TIE_TOLERANCE = 1e-4


def _upstream_knobs(k: int) -> dict:
    """colbert-ai's Searcher.dense_search defaults for k."""
    if k <= 10:
        return dict(ncells=1, centroid_score_threshold=0.5, ndocs=256)
    if k <= 100:
        return dict(ncells=2, centroid_score_threshold=0.45, ndocs=1024)
    return dict(ncells=4, centroid_score_threshold=0.4, ndocs=max(k * 4, 4096))


@contextlib.contextmanager
def _capture(owner, name: str, record, static: bool = False):
    """Replace ``owner.name`` by a wrapper that passes its arguments to ``record`` first."""
    raw = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
    function = raw.__func__ if isinstance(raw, staticmethod) else raw

    def wrapper(*args, **kwargs):
        record(*args, **kwargs)
        return function(*args, **kwargs)

    setattr(owner, name, staticmethod(wrapper) if static else wrapper)
    try:
        yield
    finally:
        setattr(owner, name, raw)


def _stock_pass(ranker, config, Q_all, k):
    """Stock colbert-ai: (top-k lists, stage-4 candidate sets)."""
    from colbert.search.index_storage import IndexScorer

    seen: list = []
    record_cpu = lambda pids, *rest, **kw: seen.append(torch.as_tensor(pids).tolist())  # noqa: E731
    record_gpu = lambda pids, *rest, **kw: seen.append(torch.as_tensor(pids).tolist())  # noqa: E731
    tops, candidates = [], []
    with reproduce._system(["compat"]), \
            _capture(IndexScorer, "decompress_residuals", record_cpu, static=True), \
            _capture(IndexScorer, "lookup_pids", lambda self, pids, *a, **kw: record_gpu(pids)):
        for Q in _progress(Q_all, f"stock k={k}"):
            seen.clear()
            Q_in = Q[None].cuda().half() if ranker.use_gpu else Q[None]
            pids, _ = ranker.rank(config, Q_in)
            tops.append(pids[:k])
            candidates.append(set(seen[-1]) if seen else set())
    return tops, candidates


def _patched_pass(ranker, config, Q_all, k):
    """The plugin: (top-k list, stage-4 candidate set, centroid scores) per query."""
    from tilemaxsim_plaid.plaid import graphs, scoring

    seen: dict = {}

    def record_stage_1(index, config_, centroid_scores, *rest):
        seen["centroid_scores"] = centroid_scores

    def record_stage_4(index, Q, pids, valid, *rest, **kw):
        seen["stage_4"] = (pids if valid is None else pids[valid]).tolist()

    results = []
    # Eagerly, so the stage functions are called (a CUDA graph replay would skip them).
    with reproduce._system(["compat", "scoring"]), graphs.disabled(), \
            _capture(scoring, "_generate_candidates", record_stage_1), \
            _capture(scoring, "_stage_4", record_stage_4):
        for Q in _progress(Q_all, f"patched k={k}"):
            seen.clear()
            pids, scores = ranker.rank(config, Q[None])
            results.append((pids[:k], set(seen.get("stage_4", [])),
                            seen["centroid_scores"].detach().cpu()))
    return results


def _progress(items, label):
    from tqdm import tqdm

    return tqdm(items, desc=label, unit="q", mininterval=5)


def _exact_order(index, Q, pids):
    """float64 MaxSim over PLAID's decompressed embeddings: ({pid: score}, pids by score)."""
    from tilemaxsim_plaid.plaid.backends import decompress_tokens
    from tilemaxsim_plaid.plaid.extensions import packed_token_rows
    from tilemaxsim_plaid.reference import segment_maxsim

    pid_tensor = torch.tensor(sorted(pids), dtype=torch.int64, device=index.device)
    lengths = index.doclens[pid_tensor]
    rows = packed_token_rows(index.offsets[pid_tensor], lengths)
    D = decompress_tokens(index, rows).double()
    scores = segment_maxsim(D @ Q.to(index.device).double().T, lengths).cpu()
    by_pid = dict(zip(pid_tensor.tolist(), scores.tolist()))
    return by_pid, sorted(by_pid, key=lambda p: (-by_pid[p], p))


def _same_up_to_ties(reference: list, actual: list, score: dict) -> bool:
    return len(reference) == len(actual) and all(
        abs(score[a] - score[b]) <= TIE_TOLERANCE for a, b in zip(reference, actual))


def _candidate_tie(index, centroid_scores, ours: set, stock: set) -> bool:
    """True when every passage in only one of the sets scores (stage-3 centroid interaction,
    float64) within TIE_TOLERANCE of the plugin's cutoff, its lowest kept score. A difference
    that starts at stage 2 is not excused here: it counts as a mismatch."""
    from tilemaxsim_plaid.reference import centroid_interaction

    pool = torch.tensor(sorted(ours | stock), dtype=torch.int64)
    full = centroid_interaction(centroid_scores.double(), index.codes.cpu(), index.offsets.cpu(), pool)
    kept = [float(score) for pid, score in zip(pool.tolist(), full) if pid in ours]
    cutoff = min(kept) if kept else float("inf")
    return all(abs(float(score) - cutoff) <= TIE_TOLERANCE
               for pid, score in zip(pool.tolist(), full) if (pid in ours) != (pid in stock))


def run(args) -> dict:
    experiment = reproduce.load_config(args.config, out=args.runs)
    experiment.search["precompute_queries"] = True
    condition = next(c for c in experiment.conditions if c.name == args.condition)
    reproduce.prepare_data(experiment, condition)
    reproduce.prepare_index(experiment, condition)
    index_path = experiment.index_dir(condition) / "index"
    embeddings = torch.load(reproduce.precompute_query_embeddings(experiment, condition))
    Q_all = embeddings["Q"].float()
    if args.limit_queries:
        Q_all = Q_all[: args.limit_queries]
    use_gpu = args.device == "cuda"

    from colbert.modeling.colbert import ColBERT
    from colbert.search.index_storage import IndexScorer

    from tilemaxsim_plaid.plaid.device_index import device_index

    with reproduce._system(["compat"]):
        ColBERT.try_load_torch_extensions(use_gpu)
        ranker = IndexScorer(str(index_path), use_gpu=use_gpu)
    rows = []
    for k in args.ks:
        config = reproduce._colbert_config(condition, index_path)
        config.configure(**_upstream_knobs(k))
        started = time.perf_counter()
        stock_tops, stock_candidates = _stock_pass(ranker, config, Q_all, k)
        ours = _patched_pass(ranker, config, Q_all, k)
        with reproduce._system(["compat", "scoring"]):
            index = device_index(ranker)
        counts = dict(candidates_equal=0, candidates_ties=0, topk_exact=0, topk_exact_ties=0,
                      topk_equal_stock=0, topk_same_set_stock=0)
        for Q, stock_top, stock_set, (top, our_set, centroid_scores) in zip(
                Q_all, stock_tops, stock_candidates, ours):
            if our_set == stock_set:
                counts["candidates_equal"] += 1
            elif _candidate_tie(index, centroid_scores, our_set, stock_set):
                counts["candidates_ties"] += 1
            score, exact = _exact_order(index, Q, our_set)
            if exact[:k] == top:
                counts["topk_exact"] += 1
            elif _same_up_to_ties(exact[:k], top, score):
                counts["topk_exact_ties"] += 1
            counts["topk_equal_stock"] += top == stock_top
            counts["topk_same_set_stock"] += set(top) == set(stock_top)
        n = len(Q_all)
        row = {"k": k, "queries": n, **_upstream_knobs(k),
               **{name: value / n for name, value in counts.items()},
               "seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps(row))
        rows.append(row)
    return {"config": str(args.config), "condition": args.condition, "device": args.device,
            "tie_tolerance": TIE_TOLERANCE, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="equivalence", description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--condition", required=True, help="a condition of the config (its index)")
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--runs", default="runs", help="the runner's output root (index cache)")
    parser.add_argument("--out", default="results/equivalence")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--limit-queries", type=int)
    args = parser.parse_args(argv)
    result = run(args)
    from experiments.harness import write_results

    path = write_results(result["rows"], args.out, "equivalence",
                         meta={k: v for k, v in result.items() if k != "rows"} | {"argv": sys.argv})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
