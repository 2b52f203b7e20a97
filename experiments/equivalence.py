"""Ranking equivalence of the plugin on a real PLAID index, query by query.

For every query and every k (with colbert-ai's own ncells / threshold / ndocs defaults for that k):

1. Candidate sets after stages 2-3: the plugin's against stock colbert-ai's on the same index.
   A difference counts as a tie when it comes from equal scores at a cutoff (see _candidate_tie:
   colbert-ai's own tie order reproduces stock's set, or every differing passage sits within
   TIE_TOLERANCE of a stage-2 or stage-3 cutoff).
2. The plugin's top k against the exact order of its candidates: float64 MaxSim over PLAID's
   decompressed (fp32) embeddings. Lists that differ only between passages whose exact scores
   are within TIE_TOLERANCE count as ties.
3. The plugin's top k against stock's (the same list, or the same set).

    python -m experiments.equivalence configs/wiki-vital.yaml --condition d128-k10 \
        --ks 10 100 1000 --out results/equivalence/wiki-vital-cpu

Runs where the index runs (CPU: the plugin's exact torch path against colbert-ai's C++ path;
GPU: the fused kernels against colbert-ai's fp16 GPU path). Queries come from the runner's
`prepare` step, encoded once and cached next to the index: all of them, or the config's
`search.precompute_queries` when it sets a number (configs/wiki-vital-h200.yaml: 1,000).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time

import torch

from . import reproduce

TIE_TOLERANCE = 1e-4
MAX_EXAMPLES = 20




@contextlib.contextmanager
def _capture(owner, name: str, record, static: bool = False):
    """Replace ``owner.name`` by a wrapper that calls ``record(result, *args)`` after it."""
    raw = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
    function = raw.__func__ if isinstance(raw, staticmethod) else raw

    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        record(result, *args)
        return result

    setattr(owner, name, staticmethod(wrapper) if static else wrapper)
    try:
        yield
    finally:
        setattr(owner, name, raw)


def _progress(items, label):
    from tqdm import tqdm

    return tqdm(items, desc=label, unit="q", mininterval=5)


def _stock_pass(ranker, config, Q_all, k):
    """Stock colbert-ai: (top-k lists, the candidate set it scores exactly) per query."""
    from colbert.search.index_storage import IndexScorer

    seen: list = []
    tops, candidates = [], []
    # Stage 4 starts with decompress_residuals (CPU) or lookup_pids (GPU) of the candidates.
    with reproduce._system(["compat"]), \
            _capture(IndexScorer, "decompress_residuals",
                     lambda result, pids, *rest: seen.append(torch.as_tensor(pids).tolist()),
                     static=True), \
            _capture(IndexScorer, "lookup_pids",
                     lambda result, self, pids, *rest: seen.append(torch.as_tensor(pids).tolist())):
        for Q in _progress(Q_all, f"stock k={k}"):
            seen.clear()
            Q_in = Q[None].cuda().half() if ranker.use_gpu else Q[None]
            pids, _ = ranker.rank(config, Q_in)
            tops.append(pids[:k])
            candidates.append(set(seen[-1]) if seen else set())
    return tops, candidates


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


def _candidate_tie(index, config, centroid_scores, stage_1: list, ours: set, stock: set) -> bool:
    """True when the two candidate sets differ only through score ties at a cutoff.

    Either (a) redoing stages 2-3 in float64 with colbert-ai's tie order (its priority queue of
    (score, pid) pairs puts the larger pid first among equal scores) gives stock's set, or (b)
    every passage in only one set scores within TIE_TOLERANCE of a cutoff: the ndocs-th best
    stage-2 score, or either set's lowest stage-3 score (summation order alone moves such
    passages across a cutoff).
    """
    from tilemaxsim_plaid.reference import centroid_interaction

    cs = centroid_scores.double()
    codes, offsets = index.codes.cpu(), index.offsets.cpu()
    keep = cs.max(-1).values >= config.centroid_score_threshold
    first = torch.tensor(stage_1, dtype=torch.int64)
    pruned = centroid_interaction(cs, codes, offsets, first, keep=keep).tolist()

    def stock_order(pids, scores, count):
        ranked = sorted(zip(scores, pids), reverse=True)  # equal scores: larger pid first
        return [pid for _, pid in ranked[:count]]

    survivors = stock_order(stage_1, pruned, config.ndocs)
    full_survivors = centroid_interaction(cs, codes, offsets, torch.tensor(survivors, dtype=torch.int64))
    if set(stock_order(survivors, full_survivors.tolist(), config.ndocs // 4)) == stock:
        return True

    ranked_pruned = sorted(pruned, reverse=True)
    cutoff_2 = ranked_pruned[config.ndocs - 1] if len(stage_1) > config.ndocs else float("-inf")
    pruned_of = dict(zip(stage_1, pruned))
    pool = sorted(ours | stock)
    full = dict(zip(pool, centroid_interaction(cs, codes, offsets, torch.tensor(pool)).tolist()))
    cutoffs_3 = [min(full[p] for p in side) for side in (ours, stock) if side]

    def at_a_cutoff(pid):
        near_2 = pid in pruned_of and abs(pruned_of[pid] - cutoff_2) <= TIE_TOLERANCE
        return near_2 or any(abs(full[pid] - c) <= TIE_TOLERANCE for c in cutoffs_3)

    return all(at_a_cutoff(pid) for pid in ours ^ stock)


def _patched_pass(ranker, config, Q_all, k, stock_tops, stock_candidates) -> dict:
    """The plugin, compared query by query with stock's lists (nothing per query is kept)."""
    from tilemaxsim_plaid.plaid import graphs, scoring
    from tilemaxsim_plaid.plaid.device_index import device_index

    seen: dict = {}

    def record_stage_1(result, index, config_, centroid_scores):
        pids, valid = result[:2]
        seen["centroid_scores"] = centroid_scores.detach().cpu()
        seen["stage_1"] = (pids if valid is None else pids[valid]).tolist()

    def record_stage_4(result, index, Q, pids, valid, *rest):
        seen["stage_4"] = set((pids if valid is None else pids[valid]).tolist())

    counts = dict(candidates_equal=0, candidates_ties=0, topk_exact=0, topk_exact_ties=0,
                  topk_equal_stock=0, topk_same_set_stock=0)
    # Which queries differ beyond ties (their numbers, for a closer look), the first few.
    examples = {"candidates_differ": [], "topk_not_exact": []}
    # Eagerly, so the stage functions are called (a CUDA graph replay would skip them).
    with reproduce._system(["compat", "scoring"]), graphs.disabled(), \
            _capture(scoring, "_generate_candidates", record_stage_1), \
            _capture(scoring, "_stage_4", record_stage_4):
        index = device_index(ranker)
        for number, (Q, stock_top, stock_set) in enumerate(
                zip(_progress(Q_all, f"patched k={k}"), stock_tops, stock_candidates)):
            seen.clear()
            pids, _ = ranker.rank(config, Q[None])
            top, ours = pids[:k], seen.get("stage_4", set())
            if ours == stock_set:
                counts["candidates_equal"] += 1
            elif _candidate_tie(index, config, seen["centroid_scores"], seen["stage_1"], ours,
                                stock_set):
                counts["candidates_ties"] += 1
            else:
                examples["candidates_differ"].append(number)
            score, exact = _exact_order(index, Q, ours)
            if exact[:k] == top:
                counts["topk_exact"] += 1
            elif _same_up_to_ties(exact[:k], top, score):
                counts["topk_exact_ties"] += 1
            else:
                examples["topk_not_exact"].append(number)
            counts["topk_equal_stock"] += top == stock_top
            counts["topk_same_set_stock"] += set(top) == set(stock_top)
    return counts, {name: numbers[:MAX_EXAMPLES] for name, numbers in examples.items()}


def run(args) -> dict:
    experiment = reproduce.load_config(args.config, out=args.runs)
    if not experiment.search["precompute_queries"]:
        experiment.search["precompute_queries"] = True  # every query, encoded once and cached
    condition = next(c for c in experiment.conditions if c.name == args.condition)
    reproduce.prepare_data(experiment, condition)
    reproduce.prepare_index(experiment, condition)
    index_path = experiment.index_dir(condition) / "index"
    embeddings = torch.load(reproduce.precompute_query_embeddings(experiment, condition))
    start = args.start_query
    if not 0 <= start < embeddings["Q"].shape[0]:
        raise ValueError(f"--start-query {start}: the condition has {embeddings['Q'].shape[0]} queries")
    # Long runs go in ranges of queries (--start-query, --limit-queries), one result file each.
    Q_all = embeddings["Q"][start:].float()
    if args.limit_queries:
        Q_all = Q_all[: args.limit_queries]
    use_gpu = args.device == "cuda"

    from colbert.modeling.colbert import ColBERT
    from colbert.search.index_storage import IndexScorer

    from tilemaxsim_plaid.plaid.scoring import dense_search_knobs

    with reproduce._system(["compat"]):
        ColBERT.try_load_torch_extensions(use_gpu)
        ranker = IndexScorer(str(index_path), use_gpu=use_gpu)
    rows = []
    for k in args.ks:
        config = reproduce._colbert_config(condition, index_path)
        config.configure(**dense_search_knobs(k))
        started = time.perf_counter()
        stock_tops, stock_candidates = _stock_pass(ranker, config, Q_all, k)
        counts, examples = _patched_pass(ranker, config, Q_all, k, stock_tops, stock_candidates)
        n = len(Q_all)
        row = {"k": k, "queries": n, "first_query": start, **dense_search_knobs(k),
               **{name: value / n for name, value in counts.items()},
               **{f"{name}_examples": [start + number for number in numbers]
                  for name, numbers in examples.items()},
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
    parser.add_argument("--start-query", type=int, default=0, help="skip the queries before this one")
    parser.add_argument("--limit-queries", type=int, help="at most this many queries from --start-query")
    args = parser.parse_args(argv)
    result = run(args)
    from .harness import write_results

    path = write_results(result["rows"], args.out, "equivalence",
                         meta={k: v for k, v in result.items() if k != "rows"} | {"argv": sys.argv})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
