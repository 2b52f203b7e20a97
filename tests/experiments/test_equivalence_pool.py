"""Pooling equivalence results over ranges of queries: query-weighted fractions, every example,
and refusal of overlapping ranges or mixed settings."""

from __future__ import annotations

import json

import pytest

from experiments import equivalence_pool


def _row(first, queries, exact, examples, k=1000, ndocs=4096):
    return {"k": k, "queries": queries, "first_query": first, "ncells": 4,
            "centroid_score_threshold": 0.4, "ndocs": ndocs, "candidates_equal": 1.0,
            "candidates_ties": 0.0, "topk_exact": exact, "topk_exact_ties": 1.0 - exact,
            "topk_equal_stock": 0.5, "topk_same_set_stock": 1.0,
            "candidates_differ_examples": [], "topk_not_exact_examples": examples, "seconds": 10.0}


def test_fractions_are_weighted_by_queries(tmp_path, capsys):
    files = []
    for name, row in (("a", _row(0, 2000, 0.9, [])), ("b", _row(2000, 1000, 0.6, [2500]))):
        path = tmp_path / name / "equivalence.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"provenance": {"commit": name}, "rows": [row]}))
        files.append(str(path))
    assert equivalence_pool.main([str(tmp_path / "pooled"), *files]) == 0
    document = json.loads((tmp_path / "pooled" / "equivalence.json").read_text())
    (row,) = document["rows"]
    assert row["queries"] == 3000 and row["ranges"] == [[0, 2000], [2000, 3000]]
    assert row["topk_exact"] == pytest.approx((0.9 * 2000 + 0.6 * 1000) / 3000)
    assert row["topk_exact"] + row["topk_exact_ties"] == pytest.approx(1.0)
    assert row["topk_not_exact_examples"] == [2500] and row["seconds"] == 20.0
    assert [p["commit"] for p in document["meta"]["pooled_from"]] == ["a", "b"]
    assert "wrote" in capsys.readouterr().out


def test_overlapping_ranges_and_mixed_settings_are_refused():
    with pytest.raises(ValueError, match="overlap"):
        equivalence_pool.pool([_row(0, 2000, 0.9, []), _row(1500, 1000, 0.9, [])])
    with pytest.raises(ValueError, match="ndocs"):
        equivalence_pool.pool([_row(0, 10, 0.9, []), _row(10, 10, 0.9, [], ndocs=1024)])
    assert [r["k"] for r in equivalence_pool.pool([_row(0, 5, 1.0, [], k=100), _row(0, 5, 1.0, [])])] == [100, 1000]
