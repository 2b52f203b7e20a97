"""ranx evaluation wrappers and the ranking identity measures."""

from __future__ import annotations

import math
import random

import pytest

from tilemaxsim_plaid import evaluation as ev


def _random_run(rng: random.Random, queries: int, docs: int, depth: int) -> dict:
    return {f"q{q}": {f"d{d}": rng.random() for d in rng.sample(range(docs), depth)}
            for q in range(queries)}


def test_identical_runs_are_identical_on_every_measure():
    run = _random_run(random.Random(3), queries=7, docs=50, depth=20)
    identity = ev.ranking_identity(run, run, ks=(1, 10, 100))
    for k in (1, 10, 100):
        assert identity[f"identical_top{k}"] == 1.0
        assert identity[f"same_set_top{k}"] == 1.0
        assert identity[f"rbo@{k}"] == pytest.approx(1.0, abs=1e-12)
    assert identity["kendall_tau@10"] == 1.0
    assert identity["max_abs_score_diff"] == 0.0
    assert identity["queries"] == 7


def test_one_swapped_pair_by_hand():
    stock = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"x": 2.0, "y": 1.0}}
    patched = {"q1": {"b": 3.0, "a": 2.0, "c": 1.0}, "q2": {"x": 2.0, "y": 1.0}}
    identity = ev.ranking_identity(stock, patched, ks=(1, 3), rbo_p=0.9)
    assert identity["identical_top1"] == 0.5
    assert identity["same_set_top1"] == 0.5
    assert identity["identical_top3"] == 0.5
    assert identity["same_set_top3"] == 1.0
    # q1: pairs (a,b) discordant, (a,c) and (b,c) concordant -> tau = 1/3; q2: 1.
    assert identity["kendall_tau@3"] == pytest.approx((1 / 3 + 1) / 2)
    # q1 overlaps X = 0, 2, 3: (1-p)/p (2/2 p^2 + 3/3 p^3) + p^3 = 0.9 at p = 0.9.
    assert identity["rbo@3"] == pytest.approx((0.9 + 1.0) / 2)
    assert identity["max_abs_score_diff"] == 1.0


def test_a_query_missing_from_the_second_run_counts_as_an_empty_ranking():
    identity = ev.ranking_identity({"q1": {"a": 1.0}, "q2": {"b": 1.0}}, {"q1": {"a": 1.0}},
                                   ks=(10,))
    assert identity["identical_top10"] == 0.5
    assert identity["rbo@10"] == 0.5


def _tau_by_counting_pairs(order_a, order_b):
    """Tau-a over the shared documents, pair by pair: the definition, independent of scipy."""
    position_b = {doc: rank for rank, doc in enumerate(order_b)}
    shared = [doc for doc in order_a if doc in position_b]
    pairs = [(x, y) for i, x in enumerate(shared) for y in shared[i + 1:]]
    concordant = sum(position_b[x] < position_b[y] for x, y in pairs)
    return (concordant - (len(pairs) - concordant)) / len(pairs)


def test_kendall_tau_by_hand():
    # Pairs of a b c d: (a,b) and (c,d) are swapped, the other four kept -> (4 - 2) / 6.
    assert ev.kendall_tau(["a", "b", "c", "d"], ["b", "a", "d", "c"]) == pytest.approx(1 / 3)
    assert ev.kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    assert ev.kendall_tau(["a", "b"], ["a", "b"]) == 1.0


@pytest.mark.parametrize("n", [pytest.param(n, id=f"n{n}") for n in (2, 10, 45, 100, 1000)])
def test_kendall_tau_of_identical_orders_is_exactly_one(n):
    # Exactly, not approximately: identity reports compare kendall_tau@k == 1.0.
    items = [f"d{i}" for i in range(n)]
    assert ev.kendall_tau(items, list(items)) == 1.0
    assert ev.kendall_tau(items, items[::-1]) == -1.0


@pytest.mark.parametrize("n", [pytest.param(n, id=f"n{n}") for n in (2, 3, 17, 64)])
def test_kendall_tau_matches_counting_pairs(n, seed):
    rng = random.Random(seed)
    items = [f"d{i}" for i in range(n)]
    other = items[:]
    rng.shuffle(other)
    assert ev.kendall_tau(items, other) == pytest.approx(_tau_by_counting_pairs(items, other),
                                                         abs=1e-12)


def test_kendall_tau_uses_only_shared_documents():
    assert ev.kendall_tau(["a", "b", "z"], ["b", "a", "y"]) == -1.0
    assert math.isnan(ev.kendall_tau(["a", "b"], ["a", "c"]))


@pytest.mark.parametrize("short, long_, expected", [
    pytest.param([], [], 1.0, id="both-empty"),
    pytest.param(["a"], [], 0.0, id="one-empty"),
    pytest.param(["a", "b"], ["c", "d"], 0.0, id="disjoint"),
    # A prefix of the other list extrapolates to full agreement (eq. 32 of Webber et al.).
    pytest.param(["a"], ["a", "b"], 1.0, id="prefix"),
    pytest.param(["a", "b", "c"], ["b", "a", "c"], 0.9, id="swap-top-two"),
])
def test_rank_biased_overlap_by_hand(short, long_, expected):
    assert ev.rank_biased_overlap(short, long_, 0.9) == pytest.approx(expected, abs=1e-12)
    assert ev.rank_biased_overlap(long_, short, 0.9) == pytest.approx(expected, abs=1e-12)


def test_rank_biased_overlap_rejects_bad_persistence():
    with pytest.raises(ValueError, match="p must lie"):
        ev.rank_biased_overlap(["a"], ["a"], 1.0)


def test_evaluate_runs_known_item_mrr_by_hand():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    run = {"q1": {"a": 3.0, "x": 1.0}, "q2": {"x": 3.0, "b": 2.0}, "q3": {"x": 1.0}}
    results = ev.evaluate_runs(qrels, {"sys": run}, ["MRR@10", "Recall@100"])
    assert results["sys"]["MRR@10"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert results["sys"]["Recall@100"] == pytest.approx(2 / 3)


def test_compare_runs_reports_p_values_and_win_tie_loss():
    rng = random.Random(5)
    qrels = {f"q{q}": {f"d{q}": 1} for q in range(40)}
    # Relevant first for even queries, second for odd ones: differences vary, so the t-test's
    # variance is not zero.
    good = {qid: {next(iter(judged)): 10.0 if q % 2 == 0 else 1.0, "noise": 5.0}
            for q, (qid, judged) in enumerate(qrels.items())}
    bad = {qid: {"noise": 10.0, **{f"n{i}": 5.0 - i for i in range(rng.randint(3, 9))}}
           for qid in qrels}
    comparison = ev.compare_runs(qrels, {"stock": bad, "patched": good}, ["MRR@10"],
                                 stat_test="student", max_p=0.01)
    patched = comparison["systems"]["patched"]
    assert patched["scores"]["MRR@10"] == pytest.approx(0.75)
    assert comparison["systems"]["stock"]["scores"]["MRR@10"] == pytest.approx(0.0)
    assert patched["p_values"]["stock"]["MRR@10"] < 0.01
    assert patched["significant"]["stock"]["MRR@10"] is True
    assert patched["win_tie_loss"]["stock"]["MRR@10"]["W"] == 40
    assert "MRR@10" in comparison["table"]


def test_compare_runs_needs_two_systems():
    with pytest.raises(ValueError, match="at least two"):
        ev.compare_runs({"q": {"d": 1}}, {"only": {"q": {"d": 1.0}}})


def test_trec_files_round_trip_through_ranx(tmp_path):
    run = _random_run(random.Random(11), queries=5, docs=30, depth=12)
    ev.write_trec_run(run, tmp_path / "run.trec", tag="test")
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert lines[0].split()[1] == "Q0" and lines[0].split()[3] == "1"
    loaded = ev.read_trec_run(tmp_path / "run.trec")
    assert loaded.keys() == run.keys()
    for qid in run:
        assert loaded[qid] == pytest.approx(run[qid], rel=1e-8)
    qrels = {"q1": {"a": 1, "b": 2}, "q2": {"c": 1}}
    ev.write_trec_qrels(qrels, tmp_path / "qrels.trec")
    assert ev.read_trec_qrels(tmp_path / "qrels.trec") == qrels


def test_trec_run_lines_keep_the_tag_and_break_ties_by_doc_id(tmp_path):
    run = {"q2": {"b": 1.0, "c": 2.0, "a": 1.0}, "q1": {"x": 0.5}}
    ev.write_trec_run(run, tmp_path / "run.trec", tag="cond-patched")
    assert (tmp_path / "run.trec").read_text() == (
        "q1 Q0 x 1 0.5 cond-patched\n"
        "q2 Q0 c 1 2 cond-patched\n"
        "q2 Q0 a 2 1 cond-patched\n"
        "q2 Q0 b 3 1 cond-patched\n"
    )


def test_trec_run_without_documents_round_trips_as_empty(tmp_path):
    ev.write_trec_run({"q1": {}, "q2": {}}, tmp_path / "run.trec", tag="t")
    assert (tmp_path / "run.trec").read_text() == ""
    assert ev.read_trec_run(tmp_path / "run.trec") == {}


def test_trec_qrels_lines_are_ranx_trec_format(tmp_path):
    ev.write_trec_qrels({"q1": {"a": 1}, "q2": {"b": 0}}, tmp_path / "qrels.trec")
    lines = sorted((tmp_path / "qrels.trec").read_text().splitlines())
    assert lines == ["q1 0 a 1", "q2 0 b 0"]
