"""The results table: rows chosen by provenance, .gz read, commands from READMEs, every headline
present over the committed results."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import results_table as rt

FIXTURE = Path(__file__).parent / "fixtures" / "results_table" / "results"
REPO_RESULTS = Path(__file__).resolve().parents[2] / "results"

DENSE_PADDED = ("dense", "dense", "1q N=100k Ld=128 d=128", "tilemaxsim")


@pytest.fixture(scope="module")
def fixture_measurements():
    return rt.load_measurements(FIXTURE)


def test_latest_is_decided_by_commit_order_not_folder_name(fixture_measurements):
    rows = [m for m in fixture_measurements if m.key == DENSE_PADDED]
    assert {Path(m.source).parent.name for m in rows} == {"a-newer", "z-older"}
    best = rt.latest(fixture_measurements)[DENSE_PADDED]
    # a-newer sorts first by name, but its commit (e8ae285) is later in git log than 9c0f00d.
    assert best.source.endswith("bench/a-newer/dense.json")
    assert best.provenance["commit"].startswith("e8ae285")
    assert best.values["ms"] == pytest.approx(0.7166, abs=1e-3)


def test_gz_files_are_read(fixture_measurements):
    plaid = [m for m in fixture_measurements if m.kind == "plaid"]
    assert plaid and all(m.source.endswith("plaid.json.gz") for m in plaid)
    assert {m.suite for m in plaid} == {"search", "rerank"}


def test_commands_come_from_argv_then_readme_lines(fixture_measurements):
    best = rt.latest(fixture_measurements)
    assert best[DENSE_PADDED].command == "python3 -m experiments.bench --out a-newer"
    older = next(m for m in fixture_measurements if m.key == DENSE_PADDED and "z-older" in m.source)
    assert older.command == "bash experiments/gpu_suite.sh full"
    pq = best[("bench_compressed", "compressed", "1q N=100k mean70 C=65536 nbits=2 d=128",
               "tilemaxsim_pq_M16")]
    assert pq.command == "python -m experiments.bench_compressed --out compressed"
    rerank = best[("plaid", "rerank", "pids=100000 Lq=32", "tilemaxsim")]
    assert rerank.command.startswith("python -m experiments.bench_plaid run ")


def test_a_csv_takes_its_logs_provenance_and_the_readme_line_naming_its_path(fixture_measurements):
    """A CSV with no JSON beside it: GPU, versions and commit from the ``provenance:`` line of its
    run's log, the command from the README line naming it by its path from the README's folder
    (not the README's first command, the tests')."""
    row = next(m for m in fixture_measurements
               if m.key == ("bench_compressed", "compressed", "1q N=10k mean70 C=4096 nbits=2 d=128",
                            "tilemaxsim_residual"))
    assert row.provenance["gpu"] == "NVIDIA H200" and row.provenance["torch"] == "2.11.0+cu130"
    assert row.provenance["commit"].startswith("346c7f6")
    assert row.command == "python3 -m experiments.bench_compressed --out c16"
    assert row.values["ms"] == pytest.approx(0.0612)


def _headline_table(text: str) -> dict[str, list[str]]:
    body = text.split("## Headline", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_table_rows_provenance_and_paper_columns(tmp_path):
    out = tmp_path / "TABLE.md"
    assert rt.main(["--results", str(FIXTURE), "--out", str(out), "--no-plot"]) == 0
    text = out.read_text()
    rows = _headline_table(text)
    padded = rows["dense padded, 1 query x 100k docs (Ld 128, d 128)"]
    assert padded["measured (latest)"].startswith("0.717 ms, 139.5 M docs/s")
    assert padded["alternative, same run"] == "flash_maxsim 0.766 ms"
    assert "80.2 %" in padded["paper claims"] and "82 M docs/s" in padded["paper claims"]
    assert (padded["GPU"], padded["torch"], padded["triton"], padded["CUDA"], padded["commit"]) == \
        ("NVIDIA H200", "2.11.0+cu130", "3.6.0", "13.0", "e8ae285")
    assert padded["command"] == "`python3 -m experiments.bench --out a-newer`"
    rerank = rows["PLAID rerank of 100k candidates (scoring)"]
    assert rerank["measured (latest)"].startswith("0.713 ms scoring")
    assert rerank["alternative, same run"] == "colbert-ai rank() 304.4 ms"
    assert "268 ms -> 1.2 ms" in rerank["paper claims"]
    ratio = rows["PLAID rerank, 1M vs 100k candidates"]
    assert ratio["measured (latest)"].startswith("1.10x")
    assert "500K" in ratio["paper claims"]
    # Workloads the fixture has no file for are listed, empty, not dropped.
    assert rows["two GPUs, dense 5.6M docs, 32 queries"]["measured (latest)"] == "—"
    # Deterministic: the same input writes the same bytes.
    again = tmp_path / "again.md"
    rt.main(["--results", str(FIXTURE), "--out", str(again), "--no-plot"])
    assert again.read_text() == text
    # The kernel targets beside the table, one table per GPU, from the same results.
    targets = (tmp_path / "TARGETS.md").read_text().splitlines()
    assert targets[2] == "Written by `tilemaxsim results`."
    assert "## H200" in targets and "## H100" in targets
    assert sum(line.startswith("| packed one query, read |") for line in targets) == 2


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install .[eval])")
    path = rt.plot_headlines(rt.load_measurements(FIXTURE), tmp_path / "plot.png")
    assert path is not None and path.stat().st_size > 0


def test_every_headline_has_a_row_over_the_committed_results(tmp_path):
    assert not list(REPO_RESULTS.rglob("*.py")), "no Python under results/"
    measurements = rt.load_measurements(REPO_RESULTS)
    missing = [h.name for h, m, _ in rt.headline_rows(measurements) if m is None]
    assert not missing, f"headlines without a measurement: {missing}"
    out = tmp_path / "TABLE.md"
    out.write_text(rt.render_table(measurements, out, REPO_RESULTS))
    rows = _headline_table(out.read_text())
    assert set(rows) == {h.name for h in rt.HEADLINES}
    assert all(row["measured (latest)"] != "—" and row["commit"] != "—" for row in rows.values())
    # Every headline figure names its GPU (a speed figure without one is not reported).
    assert all(row["GPU"] not in ("—", "not recorded") for row in rows.values()), \
        [name for name, row in rows.items() if row["GPU"] in ("—", "not recorded")]


def test_readme_headline_block_is_rewritten_between_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nintro\n\n<!-- headline:start (generated; do not edit) -->\nold\n"
                      "<!-- headline:end -->\n\n## Install\n")
    out = tmp_path / "results" / "TABLE.md"
    assert rt.main(["--results", str(FIXTURE), "--out", str(out), "--no-plot",
                    "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n<!-- headline:start (generated; do not edit) -->\n")
    assert text.endswith("<!-- headline:end -->\n\n## Install\n") and "\nold\n" not in text
    assert "| PLAID rerank of 100k candidates | 0.713 ms scoring" in " ".join(text.split())
    assert "[`results/TABLE.md`](results/TABLE.md)" in text
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="--readme"):
        rt.update_readme(readme, "block")


def test_readme_headline_names_the_card_of_a_row_measured_on_another(tmp_path):
    measurements = rt.load_measurements(REPO_RESULTS)
    by_name = {h.name: m for h, m, _ in rt.headline_rows(measurements)}
    gpus = {name: by_name[name].provenance["gpu"] for name, _ in rt.README_ROWS}
    block = rt.render_readme_headline(measurements, "results/TABLE.md")
    lines = [line for line in block.splitlines() if line.startswith("|")]
    header_gpu = lines[0].split("|")[1].strip().removeprefix("workload (").removesuffix(")")
    assert header_gpu in gpus.values()
    assert sum(gpu == header_gpu for gpu in gpus.values()) * 2 >= len(gpus)
    for (name, label), line in zip(rt.README_ROWS, lines[2:]):
        cell = line.split("|")[1].strip()
        assert cell.startswith(label)
        assert (f"[{gpus[name]}]" in cell) == (gpus[name] != header_gpu), (name, cell)
