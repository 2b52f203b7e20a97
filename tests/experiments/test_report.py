"""The reproduction report and its plots, from recorded results: stage bars that add up to the
table's totals, plots whose points differ in the plotted setting alone, no line through fewer
than three points."""

from __future__ import annotations

import gzip
import itertools
import json
import pathlib
import shutil

import pytest

pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install .[eval])")
pytest.importorskip("tabulate", reason="report tables need tabulate (a ranx dependency)")

from experiments import plots, report  # noqa: E402
from experiments.reproduce import load_config  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "reproduce"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def recorded(tmp_path) -> list[pathlib.Path]:
    """Two recorded conditions: wiki-vital d128-k10 on a CPU (stock and patched timed by stage)
    and synthetic rerank-1k on an H200 (patched as graph replays, with its eager timing pass)."""
    folders = []
    for source in sorted(FIXTURES.iterdir()):
        folder = tmp_path / "results" / source.name
        folder.mkdir(parents=True)
        (folder / "latency.json").write_bytes(gzip.decompress((source / "latency.json.gz").read_bytes()))
        shutil.copy(source / "evaluation.json", folder)
        folders.append(folder)
    return folders


def _latency_table(markdown: str) -> list[dict[str, str]]:
    section = markdown.split("## Latency per query")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in row.strip("|").split("|")))) for row in rows[2:]]


def test_stage_bars_add_up_to_the_tables_total(recorded, tmp_path):
    written = report.write_report(title="recorded", config_path="configs/x.yaml", config_name="x",
                                  result_folders=recorded, out_dir=tmp_path / "report")
    table = {(row["condition"], row["system"]): row for row in _latency_table(written.read_text())}
    bars = plots.stage_bars(plots.load_latency(recorded))
    assert len(bars) == len(table) == 5
    for label, segments, total in bars:
        row = table[tuple(label.split("\n"))]
        # What the plot draws ends where the table's total says (the cell is rounded to 0.001).
        assert sum(segments.values()) == pytest.approx(total, abs=1e-9)
        assert sum(segments.values()) == pytest.approx(float(row["total mean"]), abs=5e-4)
        stage_cells = [row[stage] for stage in plots.STAGES]
        if "—" in stage_cells:  # one graph replay per query: a single segment, the whole query
            assert set(stage_cells) == {"—"} and list(segments) == [plots.WHOLE]
        else:
            assert sum(map(float, stage_cells)) == pytest.approx(float(row["total mean"]), abs=3e-3)
    # The median is a different number, and the table says which is which.
    stock = table[("d128-k10", "stock")]
    assert float(stock["total median"]) != pytest.approx(float(stock["total mean"]), abs=1.0)
    assert (tmp_path / "report" / "latency_per_stage.png").read_bytes()[:8] == PNG_SIGNATURE


def _fake_latency(condition, total_ms: float, tokens_per_doc: float = 64.0) -> dict:
    queries = [total_ms * (1 + 0.01 * i) for i in range(5)]
    docs = min(condition.candidates or 256, 100_000)

    def system(scale: float) -> dict:
        per_query = {"total": [t * scale for t in queries],
                     "candidates": [0.0] * 5, "filter": [0.0] * 5, "decompress": [0.0] * 5,
                     "exact": [t * scale / 2 for t in queries], "other": [t * scale / 2 for t in queries]}
        return {"per_query_ms": per_query, "stages_timed": True,
                "summary": {stage: {"median_ms": values[2], "p95_ms": max(values)}
                            for stage, values in per_query.items()},
                "scored_docs": [docs] * 5, "scored_tokens": [int(docs * tokens_per_doc)] * 5}

    return {"condition": condition.name, "sweep": condition.sweep, "settings": condition.settings,
            "timer": "CPU wall clock", "device": "cpu", "num_docs": 1_000_000, "dim": 128,
            "nbits": 2, "query_tokens": 32, "ceilings": None,
            "systems": {"stock": system(1.0), "patched": system(0.1)}}


def _write(results: list[dict], root: pathlib.Path) -> list[pathlib.Path]:
    folders = []
    for result in results:
        folder = root / result["condition"]
        folder.mkdir(parents=True)
        (folder / "latency.json").write_text(json.dumps(result))
        folders.append(folder)
    return folders


def _differing_keys(group: list[dict]) -> set[str]:
    return {key for a, b in itertools.combinations(group, 2)
            for key in a["settings"].keys() | b["settings"].keys()
            if a["settings"].get(key) != b["settings"].get(key)}


def test_each_plotted_line_varies_one_setting_of_the_shipped_config(tmp_path):
    experiment = load_config("synthetic-scale")
    results = [_fake_latency(c, 1.0 + (c.candidates or 0) / 1000,
                             (c.synthetic or {}).get("doclen_median", 64))
               for c in experiment.conditions]
    (candidates,) = plots.sweeps(results, "candidates")
    assert [r["condition"] for r in candidates] == ["rerank-1k", "rerank-3k", "rerank-10k",
                                                     "rerank-30k", "rerank-100k"]
    assert _differing_keys(candidates) == {"candidates"}  # rerank-1m (fewer queries) is not in it
    (lengths,) = plots.sweeps(results, "synthetic.doclen_median")
    assert [r["condition"] for r in lengths] == ["length-32", "length-64", "length-128"]
    assert _differing_keys(lengths) == {"synthetic.doclen_median"}
    folders = _write(results, tmp_path / "results")
    made = plots.plot_all(folders, tmp_path / "plots")
    for name in ("latency vs candidates", "throughput per length", "latency per stage"):
        assert made[name].read_bytes()[:8] == PNG_SIGNATURE, name


def test_no_line_through_fewer_than_three_points(tmp_path):
    experiment = load_config("synthetic-scale")
    by_name = {c.name: c for c in experiment.conditions}
    two = [_fake_latency(by_name[name], 2.0) for name in ("rerank-1k", "rerank-10k")]
    folders = _write(two, tmp_path / "two")
    reason = plots.plot_latency_vs_candidates(folders, tmp_path)
    assert isinstance(reason, str) and "3 or more" in reason
    assert not (tmp_path / "latency_vs_candidates.png").exists()
    three = two + [_fake_latency(by_name["rerank-100k"], 9.0)]
    path = plots.plot_latency_vs_candidates(_write(three[2:], tmp_path / "third") + folders, tmp_path)
    assert path == tmp_path / "latency_vs_candidates.png"


def test_conditions_that_differ_in_more_than_length_are_not_a_length_plot(recorded, tmp_path):
    experiment = load_config("synthetic-scale")
    by_name = {c.name: c for c in experiment.conditions}
    mixed = [_fake_latency(by_name[name], 3.0, 32.0 * (n + 1))
             for n, name in enumerate(("length-32", "length-64", "plaid-k10"))]
    reason = plots.plot_throughput_per_length(_write(mixed, tmp_path / "mixed"), tmp_path)
    assert isinstance(reason, str) and "passage length alone" in reason
    # Recorded results without settings (d128-k10 and rerank-1k differ in k and more) draw no line.
    for plot in (plots.plot_throughput_per_length, plots.plot_latency_vs_candidates):
        assert isinstance(plot(recorded, tmp_path), str)


def test_report_tables_escape_cells():
    lines = report._table(["a|b", "c"], [["x|y", "1.000 / 2.000"]])
    assert lines[0].count("|") - lines[0].count("\\|") == 3
    assert "x\\|y" in lines[2] and "1.000 / 2.000" in lines[2]
