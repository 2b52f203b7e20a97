"""Retrieval quality with ranx, and how identical two rankings of the same queries are.

Quality (MRR@10, nDCG@10, Recall@100, Recall@1000) and the paired significance test go through
ranx only, so the numbers are the ones every ranx user gets. The identity measures answer a
different question, the one a drop-in scorer must answer: does the patched system return the
same list as the stock one? They compare two runs directly, without qrels:

* ``identical_top{k}``: fraction of queries whose top k is the same list in the same order;
* ``same_set_top{k}``: fraction whose top k holds the same documents in any order (a swap of two
  documents whose scores tie within rounding changes the order, not the set);
* ``kendall_tau@{k}``: Kendall's tau-a (by ``scipy.stats.kendalltau``; a ranking has no
  ties, so tau-b and tau-c equal it) between the two orders of the documents both top-k lists
  hold, averaged over queries that share at least two documents;
* ``rbo@{k}``: rank-biased overlap (Webber, Moffat and Zobel, 2010, extrapolated form, eq. 32),
  persistence ``p``; 1.0 for identical lists;
* ``max_abs_score_diff``: the largest |score_a - score_b| over documents that both runs
  returned for the same query.

A run is ``{query_id: {doc_id: score}}``; qrels are ``{query_id: {doc_id: relevance}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "DEFAULT_METRICS",
    "RANX_METRIC_NAMES",
    "ranked_list",
    "evaluate_runs",
    "compare_runs",
    "kendall_tau",
    "rank_biased_overlap",
    "ranking_identity",
    "read_trec_run",
    "write_trec_run",
    "read_trec_qrels",
    "write_trec_qrels",
]

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

# The paper's table reports these; names as printed, mapped to ranx's metric names.
DEFAULT_METRICS = ("MRR@10", "nDCG@10", "Recall@100", "Recall@1000")
RANX_METRIC_NAMES = {"MRR@10": "mrr@10", "nDCG@10": "ndcg@10", "Recall@100": "recall@100",
                     "Recall@1000": "recall@1000", "Recall@10": "recall@10",
                     "Recall@50": "recall@50", "nDCG@100": "ndcg@100", "MRR@100": "mrr@100"}


def _ranx_name(metric: str) -> str:
    if metric in RANX_METRIC_NAMES:
        return RANX_METRIC_NAMES[metric]
    return metric.lower()


def ranked_list(scores: Mapping[str, float]) -> list[str]:
    """Document ids by descending score, ties broken by doc id so the order is deterministic."""
    return [doc_id for doc_id, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))]


# ---------------------------------------------------------------------------------------------
# ranx
# ---------------------------------------------------------------------------------------------


def _ranx_inputs(qrels: Qrels, runs: Mapping[str, Run]):
    from ranx import Qrels as RanxQrels
    from ranx import Run as RanxRun

    if not qrels:
        raise ValueError("qrels must hold at least one judged query")
    ranx_qrels = RanxQrels.from_dict({qid: dict(docs) for qid, docs in qrels.items()})
    ranx_runs = []
    for name, run in runs.items():
        # ranx scores a query missing from a run as 0 for every metric only if the run knows the
        # query; an empty ranking is the honest entry for "returned nothing".
        complete = {qid: dict(run.get(qid, {})) for qid in qrels}
        ranx_runs.append(RanxRun.from_dict(complete, name=name))
    return ranx_qrels, ranx_runs


def evaluate_runs(
    qrels: Qrels, runs: Mapping[str, Run], metrics: Sequence[str] = DEFAULT_METRICS
) -> dict[str, dict[str, float]]:
    """Mean of each metric for each run, computed by ``ranx.evaluate`` over the judged queries.

    Args:
        qrels: relevance judgements; only these queries are evaluated.
        runs: ``{system_name: run}``.
        metrics: names as in :data:`DEFAULT_METRICS` (or any ranx metric name).

    Returns:
        ``{system_name: {metric: mean}}``.
    """
    from ranx import evaluate

    ranx_qrels, ranx_runs = _ranx_inputs(qrels, runs)
    names = [_ranx_name(metric) for metric in metrics]
    results = {}
    for run in ranx_runs:
        scores = evaluate(ranx_qrels, run, names, make_comparable=True)
        if len(names) == 1:
            scores = {names[0]: scores}
        results[run.name] = {metric: float(scores[name]) for metric, name in zip(metrics, names)}
    return results


def compare_runs(
    qrels: Qrels,
    runs: Mapping[str, Run],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    stat_test: str = "student",
    max_p: float = 0.01,
) -> dict:
    """``ranx.compare`` of the runs: means, paired significance test p-values, win/tie/loss.

    Args:
        qrels, runs, metrics: as in :func:`evaluate_runs`.
        stat_test: ranx's test: ``student`` (paired t-test), ``fisher`` (randomisation),
            ``tukey``.
        max_p: the significance level ranx marks differences at.

    Returns:
        ``{"stat_test", "max_p", "metrics", "systems": {name: {"scores": {metric: mean},
        "p_values": {other: {metric: p}}, "significant": {other: {metric: bool}},
        "win_tie_loss": {other: {metric: {"W", "T", "L"}}}}}, "table": str}`` with metric
        names as given.
    """
    from ranx import compare

    if len(runs) < 2:
        raise ValueError(f"runs must hold at least two systems to compare, got {list(runs)}")
    ranx_qrels, ranx_runs = _ranx_inputs(qrels, runs)
    names = [_ranx_name(metric) for metric in metrics]
    report = compare(ranx_qrels, ranx_runs, names, stat_test=stat_test, max_p=max_p,
                     make_comparable=True, rounding_digits=4)
    raw = report.to_dict()
    to_display = dict(zip(names, metrics))
    systems = {}
    for system in raw["model_names"]:
        entry = raw[system]
        p_values = {
            other: {to_display[m]: float(p) for m, p in per_metric.items()}
            for other, per_metric in entry["comparisons"].items()
        }
        systems[system] = {
            "scores": {to_display[m]: float(v) for m, v in entry["scores"].items()},
            "p_values": p_values,
            "significant": {
                other: {m: p <= max_p for m, p in per_metric.items()}
                for other, per_metric in p_values.items()
            },
            "win_tie_loss": {
                other: {to_display[m]: dict(wtl) for m, wtl in per_metric.items()}
                for other, per_metric in entry["win_tie_loss"].items()
            },
        }
    return {"stat_test": stat_test, "max_p": max_p, "metrics": list(metrics),
            "systems": systems, "table": str(report)}


# ---------------------------------------------------------------------------------------------
# Ranking identity
# ---------------------------------------------------------------------------------------------


def kendall_tau(order_a: Sequence[str], order_b: Sequence[str]) -> float:
    """Kendall's tau-a between two orders of the documents they share (nan below two shared).

    tau-a = (concordant - discordant) / (n choose 2) over the n shared documents, each placed
    by its position in ``order_a`` and in ``order_b``. Computed by ``scipy.stats.kendalltau``
    with ``variant="c"``: a ranking has no ties, so tau-a, tau-b and tau-c all agree, and
    tau-c is the one scipy computes with a single division, so identical orders give exactly
    1.0 (tau-b divides by two square roots and gives 1 - 1 ulp at n = 10).
    """
    from scipy.stats import kendalltau

    position_b = {doc: rank for rank, doc in enumerate(order_b)}
    shared = [doc for doc in order_a if doc in position_b]
    if len(shared) < 2:
        return math.nan
    # shared is in order_a's order, so its positions in order_a are 0..n-1.
    tau, _ = kendalltau(range(len(shared)), [position_b[doc] for doc in shared], variant="c")
    return float(tau)


def rank_biased_overlap(order_a: Sequence[str], order_b: Sequence[str], p: float = 0.9) -> float:
    """Extrapolated rank-biased overlap of two rankings (Webber et al. 2010, eq. 32).

    Written here because no dependency has it (ranx's ``rbp`` is rank-biased precision, a
    measure against qrels, not an overlap of two rankings). Handles lists of different lengths (a system that returned fewer than k documents); two
    empty lists are identical (1.0), one empty list shares nothing (0.0).
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p!r}")
    short, long_ = (order_a, order_b) if len(order_a) <= len(order_b) else (order_b, order_a)
    s, l = len(short), len(long_)
    if l == 0:
        return 1.0
    if s == 0:
        return 0.0
    seen_short, seen_long = set(), set()
    overlap = 0  # X_d: |short[:min(d, s)] ∩ long[:d]|
    total = 0.0
    overlap_at_s = 0
    for depth in range(1, l + 1):
        item_long = long_[depth - 1]
        if depth <= s:
            item_short = short[depth - 1]
            if item_short == item_long:
                overlap += 1
            else:
                overlap += (item_short in seen_long) + (item_long in seen_short)
            seen_short.add(item_short)
            seen_long.add(item_long)
            if depth == s:
                overlap_at_s = overlap
        else:
            overlap += item_long in seen_short
            seen_long.add(item_long)
            total += overlap_at_s * (depth - s) / (s * depth) * p**depth
        total += overlap / depth * p**depth
    return float((1 - p) / p * total + ((overlap - overlap_at_s) / l + overlap_at_s / s) * p**l)


def ranking_identity(
    run_a: Run, run_b: Run, *, ks: Sequence[int] = (10, 100), rbo_p: float = 0.9
) -> dict[str, float]:
    """How identical two runs over the same queries are (see the module docstring).

    Args:
        run_a, run_b: ``{query_id: {doc_id: score}}``; the queries of ``run_a`` are compared
            (a query ``run_b`` lacks counts as an empty ranking).
        ks: depths of the top-k comparisons.
        rbo_p: RBO persistence (0.9 weighs the top 10 ranks at about 86%).

    Returns:
        ``{"queries", "identical_top{k}", "same_set_top{k}", "kendall_tau@{k}", "rbo@{k}"
        for each k, "max_abs_score_diff", "mean_abs_score_diff"}``.
    """
    if not run_a:
        raise ValueError("run_a must hold at least one query")
    results: dict[str, float] = {"queries": float(len(run_a))}
    orders_a = {qid: ranked_list(scores) for qid, scores in run_a.items()}
    orders_b = {qid: ranked_list(run_b.get(qid, {})) for qid in run_a}
    for k in ks:
        identical = same_set = 0
        taus, rbos = [], []
        for qid in run_a:
            top_a, top_b = orders_a[qid][:k], orders_b[qid][:k]
            identical += top_a == top_b
            same_set += set(top_a) == set(top_b)
            tau = kendall_tau(top_a, top_b)
            if not math.isnan(tau):
                taus.append(tau)
            rbos.append(rank_biased_overlap(top_a, top_b, rbo_p))
        results[f"identical_top{k}"] = identical / len(run_a)
        results[f"same_set_top{k}"] = same_set / len(run_a)
        results[f"kendall_tau@{k}"] = float(np.mean(taus)) if taus else math.nan
        results[f"rbo@{k}"] = float(np.mean(rbos))
    differences = [
        abs(float(score) - float(run_b[qid][doc_id]))
        for qid, scores in run_a.items()
        for doc_id, score in scores.items()
        if doc_id in run_b.get(qid, {})
    ]
    results["max_abs_score_diff"] = max(differences) if differences else math.nan
    results["mean_abs_score_diff"] = float(np.mean(differences)) if differences else math.nan
    return results


# ---------------------------------------------------------------------------------------------
# TREC files: written without ranx by the search step, read (and qrels written) with ranx
# ---------------------------------------------------------------------------------------------


def write_trec_run(run: Run, path, tag: str) -> None:
    """Write ``run`` as a TREC run file: ``qid Q0 docid rank score tag``, best first.

    Scores keep 9 significant digits, enough for fp32 scores to round-trip.
    """
    # Not ranx.Run.save, which would do the same job but does not fit here: (1) the search step
    # runs where the GPU is and needs only torch, colbert-ai and this package (ranx is the
    # `eval` extra); (2) Run.from_dict raises on a run without a single document (max() of
    # an empty sequence); (3) ranx orders tied scores by an unstable argsort, while the rank
    # column here is ranked_list's order (ties by doc id), the order ranking_identity compares.
    with open(path, "w", encoding="utf-8") as handle:
        for qid in sorted(run):
            scores = run[qid]
            for rank, doc_id in enumerate(ranked_list(scores), start=1):
                handle.write(f"{qid} Q0 {doc_id} {rank} {float(scores[doc_id]):.9g} {tag}\n")


def read_trec_run(path) -> dict[str, dict[str, float]]:
    """Read a TREC run file with ranx into ``{qid: {doc_id: score}}``.

    A file without a line (every query returned nothing) reads as ``{}``: ranx raises on a
    run without a single document.
    """
    from ranx import Run as RanxRun

    with open(path, encoding="utf-8") as handle:
        if not any(line.strip() for line in handle):
            return {}
    loaded = RanxRun.from_file(str(path), kind="trec").to_dict()
    return {qid: dict(docs) for qid, docs in loaded.items()}


def write_trec_qrels(qrels: Qrels, path) -> None:
    """Write qrels with ``ranx.Qrels.save`` as a TREC qrels file (``qid 0 docid relevance``)."""
    from ranx import Qrels as RanxQrels

    RanxQrels.from_dict({qid: dict(docs) for qid, docs in qrels.items()}).save(str(path), kind="trec")


def read_trec_qrels(path) -> dict[str, dict[str, int]]:
    """Read a TREC qrels file with ranx into ``{qid: {doc_id: relevance}}``."""
    from ranx import Qrels as RanxQrels

    loaded = RanxQrels.from_file(str(path), kind="trec").to_dict()
    return {qid: {doc: int(rel) for doc, rel in docs.items()} for qid, docs in loaded.items()}
