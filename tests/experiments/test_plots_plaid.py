"""The end-to-end benchmark's plots, drawn from result files shaped as bench_plaid writes them."""

import csv
import json

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install .[eval])")

from experiments import plots_plaid  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rows(stock_ms: float, default_products: str | None) -> list[dict]:
    rows = []
    for shape in ("wiki2000 k=10", "synthetic1000000 k=100"):
        rows.append({"suite": "search", "shape": shape, "provider": "colbert-ai", "ms": stock_ms,
                     "search_call": stock_ms - 1, "encode": 4.0, "dense_search": stock_ms - 4,
                     "candidates": 1.0, "stages_2_3": 3.0, "stage_4": 2.5, "sort": 0.3})
        rows.append({"suite": "search", "shape": shape, "provider": "tilemaxsim", "ms": 0.9,
                     "search_call": 0.8, "encode": 0.5, "dense_search": 0.3})
        rows.append({"suite": "search", "shape": shape, "provider": "tilemaxsim-eager", "ms": 4.0,
                     "search_call": 3.9, "encode": 2.9, "dense_search": 1.1, "candidates": 0.3,
                     "stages_2_3": 0.3, "stage_4": 0.3, "sort": 0.2})
    rows.append({"suite": "equivalence", "shape": "wiki k=10", "provider": "tilemaxsim", "same_as_stock": 0.8})
    for size, scale in ((100_000, 1.0), (1_000_000, 9.0)):
        row = {"suite": "rerank", "shape": f"pids={size} Lq=32", "provider": "tilemaxsim",
               "size": size, "ours_scoring_ms": 1.1 * scale, "ours_fp16x2_scoring_ms": 1.1 * scale,
               "ours_fp16_scoring_ms": 0.9 * scale}
        if default_products is None:  # a run before the "auto" default: the default was tf32x3
            row["ours_scoring_ms"] = 2.8 * scale
        else:
            row |= {"default_products": default_products, "ours_tf32x3_scoring_ms": 2.8 * scale}
        if size == 100_000:
            row["stock_rank_wall_ms"] = 250.0
        rows.append(row)
    return rows


def _write_json(folder, rows):
    folder.mkdir(parents=True)
    doc = {"provenance": {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "colbert_ai": "0.2.22"},
           "ceilings": {}, "meta": {}, "rows": rows}
    (folder / "plaid.json").write_text(json.dumps(doc))
    return folder / "plaid.json"


def _write_csv(folder, rows):
    folder.mkdir(parents=True)
    keys = list(dict.fromkeys(key for row in rows for key in row))
    with open(folder / "plaid.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return folder / "plaid.csv"


def test_every_plot_is_drawn_from_json_and_csv_runs(tmp_path):
    first = _write_json(tmp_path / "run1" / "plaid", _rows(12.0, None))
    second = _write_csv(tmp_path / "run2" / "plaid", _rows(15.0, "fp16x2"))
    written = plots_plaid.plot_all([first, second.parent], tmp_path / "plots")
    assert sorted(path.name for path in written) == ["rerank.png", "search_latency.png", "search_stages.png"]
    for path in written:
        assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 10_000


def test_csv_and_json_runs_load_the_same_numbers(tmp_path):
    rows = _rows(12.0, "fp16x2")
    from_json = plots_plaid.load_run(_write_json(tmp_path / "a" / "plaid", rows))
    from_csv = plots_plaid.load_run(_write_csv(tmp_path / "b", rows))
    assert from_json["name"] == "a" and from_csv["name"] == "b"
    assert from_json["provenance"]["gpu"] == "NVIDIA H200" and from_csv["provenance"] == {}
    for a, b in zip(from_json["rows"], from_csv["rows"]):
        assert {k: v for k, v in a.items()} == {k: v for k, v in b.items() if v is not None}


def test_a_run_without_search_or_rerank_rows_draws_nothing_for_them(tmp_path):
    only_rerank = [row for row in _rows(12.0, "fp16x2") if row["suite"] == "rerank"]
    written = plots_plaid.plot_all([_write_json(tmp_path / "run", only_rerank)])
    assert [path.name for path in written] == ["rerank.png"]
    assert written[0].parent == tmp_path / "run"  # beside the run by default


@pytest.mark.parametrize("make, match", [
    (lambda tmp: tmp / "missing.json", "no such file"),
    (lambda tmp: tmp, "no plaid.json or plaid.csv"),
    (lambda tmp: (tmp / "notes.txt").write_text("x") and tmp / "notes.txt", "expected plaid.json or plaid.csv"),
    (lambda tmp: (tmp / "plaid.json").write_text("{}") and tmp / "plaid.json", "no 'rows'"),
])
def test_bad_runs_are_named(tmp_path, make, match):
    with pytest.raises((FileNotFoundError, ValueError), match=match):
        plots_plaid.load_run(make(tmp_path))


def test_rerank_sizes_are_joined_by_a_line_only_from_three_on():
    assert plots_plaid.rerank_line_style([100_000, 1_000_000]) == "none"
    assert plots_plaid.rerank_line_style([100_000, 100_000, 1_000_000]) == "none"
    assert plots_plaid.rerank_line_style([10_000, 100_000, 1_000_000]) == "-"


def test_stage_bars_are_means_that_add_up_to_the_rows_total(tmp_path):
    rows = _rows(12.0, "fp16x2")
    for row in rows:
        if row["suite"] != "search":
            continue
        if row["provider"] == "tilemaxsim":
            row |= {"mean_encode": 0.6, "mean_dense_search": 0.35}
        else:  # stages of each query add up to its encode + dense_search, so the means do
            stages = {"candidates": 1.5, "stages_2_3": 2.5, "stage_4": 3.0, "sort": 0.5}
            row |= {f"mean_{stage}": value for stage, value in stages.items()}
            row |= {"mean_encode": 4.5, "mean_dense_search": sum(stages.values())}
    run = plots_plaid.load_run(_write_json(tmp_path / "means", rows))
    labels, bars, statistic = plots_plaid.search_stage_bars(run)
    assert statistic == "mean" and len(bars) == 6
    by_label = dict(zip(labels, bars))
    for shape in ("wiki2000 k=10", "synthetic1000000 k=100"):
        for provider, name in (("colbert-ai", "stock"), ("tilemaxsim-eager", "plugin, eager"),
                               ("tilemaxsim", "plugin")):
            row = next(r for r in rows if r.get("shape") == shape and r["provider"] == provider)
            assert sum(by_label[f"{shape} | {name}"]) == pytest.approx(
                row["mean_encode"] + row["mean_dense_search"])
    # A run written before the means were: medians, and the axis says they need not add up.
    old = plots_plaid.load_run(_write_json(tmp_path / "medians", _rows(12.0, "fp16x2")))
    assert plots_plaid.search_stage_bars(old)[2] == "median"
