"""The reproduction runner: config parsing, cache keys, timing, expected-number checks, and the
whole pipeline end to end on a tiny wiki-vital subset and a tiny synthetic index (CPU)."""

from __future__ import annotations

import json
import logging
import pathlib
import time

import pytest
import yaml

from experiments import plots, reproduce
from experiments.reproduce import StageTimer, check_expected, load_config

REPO = pathlib.Path(__file__).resolve().parents[2]

TINY = {
    "name": "tiny",
    "label": "tiny wiki-vital subset (test; not MS MARCO or BEIR)",
    "dataset": {"ir_datasets": "wiki-vital", "max_passages": 60, "max_queries": 10, "seed": 3},
    "checkpoint": {"minilm_dim": 128},
    "search": {"device": "cpu", "warmup_queries": 2},
    "evaluation": {"identity_k": [5, 10]},
    "conditions": [
        {"name": "k10", "plaid": {"k": 10, "nbits": 2},
         "expected": {"identity": {"identical_top10": 1.0}, "stock": {"MRR@10": None}}},
    ],
}

SYNTHETIC = {
    "name": "tiny-synthetic",
    "label": "tiny synthetic index (test; not MS MARCO)",
    "synthetic": {"num_passages": 1500, "num_queries": 8, "seed": 2},
    "search": {"device": "cpu", "warmup_queries": 1},
    "evaluation": {"identity_k": [10]},
    "conditions": [
        {"name": "rerank", "plaid": {"k": 10}, "candidates_sweep": [100, 300, 1000]},
        {"name": "plaid-k10", "plaid": {"k": 10, "ncells": 4, "centroid_score_threshold": 0.3,
                                        "ndocs": 256}},
    ],
}


def _write_config(tmp_path, config: dict, name="config.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


# ---------------------------------------------------------------------------------------------
# Configs and keys
# ---------------------------------------------------------------------------------------------


def test_every_shipped_config_parses_and_labels_its_collection():
    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert configs, "configs/ holds the tables"
    for path in configs:
        experiment = load_config(path)
        assert experiment.conditions, path
        for condition in experiment.conditions:
            assert set(condition.plaid) == {"k", "ncells", "centroid_score_threshold", "ndocs",
                                            "nbits"}
        dataset = (experiment.dataset or {}).get("ir_datasets", "synthetic")
        label = experiment.label.lower()
        # Offline and synthetic numbers are never presented as MS MARCO or BEIR numbers.
        if not dataset.startswith(("msmarco", "beir")):
            assert "not ms marco" in label, path


@pytest.mark.parametrize("k, expected", [
    pytest.param(10, (1, 0.5, 256), id="k10"),
    pytest.param(100, (2, 0.45, 1024), id="k100"),
    pytest.param(1000, (4, 0.4, 4096), id="k1000"),
    pytest.param(2000, (4, 0.4, 8000), id="k2000"),
])
def test_null_knobs_are_filled_as_searcher_dense_search_does(k, expected):
    filled = reproduce._plaid_knobs({"k": k})
    assert (filled["ncells"], filled["centroid_score_threshold"], filled["ndocs"]) == expected
    assert reproduce._plaid_knobs({"k": k, "ndocs": 77})["ndocs"] == 77


@pytest.mark.parametrize("change, part", [
    pytest.param({"dataset": {**TINY["dataset"], "max_passages": 61}}, "data", id="data"),
    pytest.param({"checkpoint": {"minilm_dim": 384}}, "checkpoint", id="checkpoint"),
    pytest.param({"conditions": [{"name": "k10", "plaid": {"k": 10, "nbits": 1}}]}, "index",
                 id="nbits"),
    pytest.param({"conditions": [{"name": "k10", "plaid": {"k": 10, "ndocs": 512}}]}, "results",
                 id="ndocs"),
])
def test_a_changed_setting_changes_exactly_the_folders_that_depend_on_it(tmp_path, change, part):
    base = load_config(_write_config(tmp_path, TINY, "a.yaml"))
    changed = load_config(_write_config(tmp_path, {**TINY, **change}, "b.yaml"))
    a, b = base.conditions[0], changed.conditions[0]
    folders = {
        "data": (base.data_dir(a), changed.data_dir(b)),
        "checkpoint": (base.checkpoint_dir(a), changed.checkpoint_dir(b)),
        "index": (base.index_dir(a), changed.index_dir(b)),
        "results": (base.results_dir(a), changed.results_dir(b)),
    }
    order = ["data", "checkpoint", "index", "results"]
    for name, (before, after) in folders.items():
        depends = name == part or (order.index(name) > order.index(part) and
                                   not (part == "data" and name == "checkpoint"))
        assert (before != after) == depends, name


@pytest.mark.parametrize("broken, message", [
    pytest.param({"conditions": None}, "conditions", id="no-conditions"),
    pytest.param({"synthetic": {"num_passages": 10}}, "exactly one of 'dataset'", id="both"),
    pytest.param({"conditions": [{"name": "a", "plaid": {"k": 1}}, {"name": "a", "plaid": {"k": 1}}]},
                 "used twice", id="duplicate"),
    pytest.param({"checkpoint": {}}, "checkpoint needs exactly one", id="no-checkpoint"),
    pytest.param({"conditions": [{"name": "a"}]}, "needs 'name' and 'plaid'", id="no-plaid"),
])
def test_bad_configs_are_refused_naming_the_field(tmp_path, broken, message):
    config = {key: value for key, value in {**TINY, **broken}.items() if value is not None}
    with pytest.raises(ValueError, match=message):
        load_config(_write_config(tmp_path, config))


@pytest.mark.parametrize("broken, message", [
    pytest.param({"dataset": {**TINY["dataset"], "max_pasages": 3}},
                 "unknown key 'max_pasages' in 'dataset'; did you mean 'max_passages'", id="misspelt-dataset"),
    pytest.param({"serach": {}}, "unknown key 'serach' in the top level; did you mean 'search'", id="misspelt-top"),
    pytest.param({"conditions": [{"name": "a", "plaid": {"k": 10, "ndoc": 5}}]},
                 r"condition #0 \('a'\): 'plaid'; did you mean 'ndocs'", id="misspelt-knob"),
    pytest.param({"conditions": [{"name": "a", "plaid": {"k": 10}, "expected": {"patch": {}}}]},
                 "did you mean 'patched'", id="misspelt-expected"),
    pytest.param({"search": ["device"]}, "'search' must be a mapping", id="not-a-mapping"),
])
def test_unknown_keys_are_named_with_the_closest_valid_one(tmp_path, broken, message):
    with pytest.raises(reproduce.ConfigError, match=message):
        load_config(_write_config(tmp_path, {**TINY, **broken}))


def test_a_candidates_sweep_is_one_condition_per_count(tmp_path):
    config = {**SYNTHETIC, "conditions": [
        {"name": "rerank", "plaid": {"k": 10}, "queries": 4,
         "candidates_sweep": [30000, 1000, 1000000, 250]}]}
    experiment = load_config(_write_config(tmp_path, config))
    names = [c.name for c in experiment.conditions]
    assert names == ["rerank-250", "rerank-1k", "rerank-30k", "rerank-1m"]
    assert [c.candidates for c in experiment.conditions] == [250, 1000, 30000, 1000000]
    assert {c.sweep for c in experiment.conditions} == {"rerank"}
    # The points differ in the candidate count and nothing else, and share one index.
    settings = [c.settings for c in experiment.conditions]
    assert {k for s in settings for k in s if s[k] != settings[0][k]} == {"candidates"}
    assert len({experiment.index_dir(c) for c in experiment.conditions}) == 1
    # Written out by hand, a point is the same condition (same results folder).
    single = load_config(_write_config(tmp_path, {**SYNTHETIC, "conditions": [
        {"name": "rerank-1k", "plaid": {"k": 10}, "queries": 4, "candidates": 1000}]}, "one.yaml"))
    assert single.results_dir(single.conditions[0]) == experiment.results_dir(experiment.conditions[1])


@pytest.mark.parametrize("sweep, message", [
    pytest.param([100, 1000], "at least 3 different counts", id="two-points"),
    pytest.param([100, 100, 1000], "each once", id="repeated"),
    pytest.param([100, 0, 1000], "integers >= 1", id="zero"),
    pytest.param("100,1000", "must be a list", id="not-a-list"),
])
def test_bad_candidates_sweeps_are_refused(tmp_path, sweep, message):
    config = {**SYNTHETIC, "conditions": [{"name": "r", "plaid": {"k": 10}, "candidates_sweep": sweep}]}
    with pytest.raises(reproduce.ConfigError, match=message):
        load_config(_write_config(tmp_path, config))
    both = {**SYNTHETIC, "conditions": [{"name": "r", "plaid": {"k": 10}, "candidates": 5,
                                         "candidates_sweep": [1, 2, 3]}]}
    with pytest.raises(reproduce.ConfigError, match="not both"):
        load_config(_write_config(tmp_path, both, "both.yaml"))


def test_conditions_option_selects_a_sweep_by_its_name(tmp_path, caplog):
    config = _write_config(tmp_path, SYNTHETIC)
    with caplog.at_level(logging.INFO, logger="experiments"):
        assert reproduce.main([str(config), "--dry-run", "--steps", "search", "--out",
                               str(tmp_path / "runs"), "--conditions", "rerank"]) == 0
    searched = [line.split(":")[0] for line in caplog.messages if line.startswith("[search]")]
    assert searched == ["[search] rerank-100", "[search] rerank-300", "[search] rerank-1k"]


def test_gpu_configs_carry_a_candidates_sweep():
    for name in ("wiki-vital-h200", "synthetic-scale", "synthetic-msmarco-scale", "msmarco-passage",
                 "beir"):
        sweeps = {c.sweep for c in load_config(name).conditions if c.sweep}
        assert sweeps, name


def test_yaml_errors_and_missing_configs_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(reproduce.ConfigError, match=f"{bad}: not valid YAML"):
        load_config(bad)
    with pytest.raises(reproduce.ConfigError, match="no such config file.*shipped: .*wiki-vital-cpu"):
        load_config(tmp_path / "nope.yaml")


def test_shipped_configs_load_by_name():
    assert reproduce.resolve_config("wiki-vital-cpu") == REPO / "configs" / "wiki-vital-cpu.yaml"
    assert reproduce.resolve_config("wiki-vital-cpu.yaml") == REPO / "configs" / "wiki-vital-cpu.yaml"
    assert load_config("wiki-vital-cpu").name == "wiki-vital-cpu"


def test_cli_reports_a_config_mistake_in_one_line_with_status_2(tmp_path, capsys):
    from tilemaxsim_plaid import cli

    path = _write_config(tmp_path, {**TINY, "dataset": {**TINY["dataset"], "max_pasages": 3}})
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["reproduce", str(path), "--dry-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean 'max_passages'" in err and "Traceback" not in err


def test_cli_version_help_and_unknown_command(capsys):
    from tilemaxsim_plaid import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("tilemaxsim-plaid ")
    assert cli.main([]) == 0
    listing = capsys.readouterr().out
    assert [command for command in cli.COMMANDS if command not in listing] == []
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bogus"])
    assert exit_info.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err


def test_reusing_a_folder_made_from_other_settings_is_an_error(tmp_path):
    folder = tmp_path / "made"
    reproduce._write_manifest(folder, {"a": 1})
    assert reproduce._reusable(folder, {"a": 1})
    assert not reproduce._reusable(tmp_path / "absent", {"a": 1})
    with pytest.raises(RuntimeError, match="other settings"):
        reproduce._reusable(folder, {"a": 2})


def test_subsample_keeps_relevant_passages_and_fits_the_budget():
    doc_ids = [f"d{i}" for i in range(100)]
    queries = {f"q{i}": f"query {i}" for i in range(50)}
    qrels = {f"q{i}": {f"d{2 * i}": 1} for i in range(50)}
    kept, kept_queries, kept_qrels = reproduce._subsample(
        {"max_passages": 30, "max_queries": 12, "seed": 4}, doc_ids, queries, qrels)
    assert len(kept) == 30 and len(kept_queries) == 12
    assert kept == [doc for doc in doc_ids if doc in set(kept)]  # collection order kept
    assert all(set(judged) <= set(kept) and judged for judged in kept_qrels.values())
    again = reproduce._subsample({"max_passages": 30, "max_queries": 12, "seed": 4},
                                 doc_ids, queries, qrels)
    assert again == (kept, kept_queries, kept_qrels)


def test_check_expected_statuses():
    measured = {"stock": {"MRR@10": 0.5}, "identity": {"identical_top10": 1.0}}
    checks = check_expected({"stock": {"MRR@10": 0.5004, "nDCG@10": None},
                             "identity": {"identical_top10": 0.9},
                             "patched": {"MRR@10": 0.5}, "tolerance": 1e-3}, measured)
    status = {check["name"]: check["status"] for check in checks}
    assert status == {"stock.MRR@10": "OK", "stock.nDCG@10": "n/a",
                      "identity.identical_top10": "FAIL", "patched.MRR@10": "MISSING"}


def test_cpu_stage_timer_adds_up_nested_and_repeated_stages():
    timer = StageTimer(use_cuda=False)
    with timer.stage("ignored"):  # outside a query: warm-up, nothing recorded
        pass
    timer.start_query()
    for _ in range(2):
        with timer.stage("a"):
            time.sleep(0.01)
    timer.note("candidates", 7)
    times, counts = timer.finish_query()
    assert set(times) == {"total", "a"}
    assert 20 <= times["a"] <= times["total"]
    assert counts == {"candidates": 7}
    assert timer.label == "CPU wall clock"


def test_derived_stages_add_up_to_the_total():
    stock = reproduce._derived_stages("stock", {"total": 10.0, "candidates": 2.0,
                                                "score_pids": 7.0, "decompress": 1.5, "exact": 2.5})
    assert stock == {"total": 10.0, "candidates": 2.0, "filter": 3.0, "decompress": 1.5,
                     "exact": 2.5, "other": 1.0}
    patched = reproduce._derived_stages("patched", {"total": 5.0, "candidates": 1.0,
                                                    "filter": 1.0, "exact": 2.0})
    assert sum(v for k, v in patched.items() if k != "total") == pytest.approx(5.0)


def test_dry_run_logs_every_step_and_builds_nothing(tmp_path, caplog):
    config = _write_config(tmp_path, TINY)
    out = tmp_path / "runs"
    with caplog.at_level(logging.INFO, logger="experiments"):
        assert reproduce.main([str(config), "--dry-run", "--out", str(out)]) == 0
    printed = caplog.text
    for step in ("[prepare] data: would build", "[prepare] checkpoint: would build",
                 "[prepare] index: would build", "[search] k10", "[evaluate] k10", "[report]"):
        assert step in printed
    assert not out.exists()


def test_evaluate_without_search_results_says_which_step_to_run(tmp_path):
    experiment = load_config(_write_config(tmp_path, TINY), out=tmp_path / "runs")
    with pytest.raises(RuntimeError, match="'search' step"):
        reproduce.run_evaluate(experiment)


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """prepare + search + evaluate + report on a 60-passage wiki-vital subset, on the CPU."""
    root = tmp_path_factory.mktemp("reproduce")
    config = _write_config(root, TINY)
    out = root / "runs"
    code = reproduce.main([str(config), "--out", str(out)])
    return load_config(config, out=out), code


@pytest.mark.colbert
def test_end_to_end_builds_searches_evaluates_and_reports(tiny_run):
    experiment, code = tiny_run
    assert code == 0  # the one expected number (identical top 10) is OK
    condition = experiment.conditions[0]
    index = experiment.index_dir(condition) / "index"
    assert (index / "metadata.json").exists() and (index / "ivf.pid.pt").exists()
    results = experiment.results_dir(condition)
    from tilemaxsim_plaid.evaluation import read_trec_run

    stock, patched = (read_trec_run(results / f"{s}.trec") for s in ("stock", "patched"))
    assert len(stock) == 10 and stock.keys() == patched.keys()
    # ncells=1 on 60 passages can yield fewer than k candidates; both systems see the same ones.
    assert all(1 <= len(stock[qid]) == len(patched[qid]) <= 10 for qid in stock)

    evaluation = json.loads((results / "evaluation.json").read_text())
    identity = evaluation["identity"]
    # Patched PLAID is a drop-in scorer: on the CPU both score in fp32, so the lists agree.
    assert identity["identical_top10"] == 1.0
    assert identity["kendall_tau@10"] == 1.0 and identity["rbo@10"] == pytest.approx(1.0)
    assert identity["max_abs_score_diff"] <= 1e-4
    quality = evaluation["quality"]
    assert quality["stock"] == pytest.approx(quality["patched"])
    assert 0.0 < quality["stock"]["MRR@10"] <= 1.0
    assert {c["status"] for c in evaluation["checks"]} == {"OK", "n/a"}

    latency = json.loads((results / "latency.json").read_text())
    assert latency["timer"] == "CPU wall clock" and latency["device"] == "cpu"
    assert latency["warm_queries"] == 8
    for system in ("stock", "patched"):
        summary = latency["systems"][system]["summary"]
        assert summary["total"]["median_ms"] > 0
        assert summary["exact"]["median_ms"] > 0 and summary["candidates"]["median_ms"] > 0
        assert latency["systems"][system]["missing_hooks"] == []
    assert latency["systems"]["stock"]["retrieved_candidates"]
    # Stock decompression on the CPU is observed through IndexScorer.decompress_residuals.
    assert latency["systems"]["stock"]["summary"]["decompress"]["median_ms"] > 0

    report = (experiment.report_dir / "report.md").read_text()
    for section in ("## Retrieval quality (ranx)", "## Ranking identity", "CPU wall clock",
                    "## Expected numbers", "latency_per_stage.png"):
        assert section in report
    assert (experiment.report_dir / "latency_per_stage.png").stat().st_size > 0


@pytest.mark.colbert
def test_second_run_reuses_data_checkpoint_and_index(tiny_run, caplog):
    experiment, _ = tiny_run
    with caplog.at_level(logging.INFO, logger="experiments"):
        reproduce.main([str(experiment.path), "--out", str(experiment.out), "--steps", "prepare"])
    assert caplog.text.count("reusing") == 2  # data and index (the checkpoint is not even asked for)


@pytest.mark.colbert
def test_synthetic_sweep_end_to_end(tmp_path):
    config = _write_config(tmp_path, SYNTHETIC)
    out = tmp_path / "runs"
    assert reproduce.main([str(config), "--out", str(out)]) == 0
    experiment = load_config(config, out=out)
    scored = []
    for condition in experiment.conditions:
        folder = experiment.results_dir(condition)
        latency = json.loads((folder / "latency.json").read_text())
        evaluation = json.loads((folder / "evaluation.json").read_text())
        assert evaluation["identity"]["identical_top10"] == 1.0
        # Known-item qrels written by the search step: each query's target passage.
        assert evaluation["judged_queries"] == latency["queries"]
        scored.append(latency["systems"]["patched"]["scored_docs"][0])
    assert scored[:3] == [100, 300, 1000]  # the sweep's conditions score exactly their candidates
    report_dir = experiment.report_dir
    assert (report_dir / "latency_vs_candidates.png").read_bytes()[:4] == b"\x89PNG"
    latencies = [json.loads((experiment.results_dir(c) / "latency.json").read_text())
                 for c in experiment.conditions]
    assert [r["sweep"] for r in latencies] == ["rerank"] * 3 + [None]
    (sweep,) = plots.sweeps(latencies, "candidates")
    assert [r["condition"] for r in sweep] == ["rerank-100", "rerank-300", "rerank-1k"]
    text = (report_dir / "report.md").read_text()
    assert "synthetic" in text and "![latency vs candidates]" in text
    # One query of 8 passes through: the stage means add up to the mean total.
    for result in latencies:
        for entry in result["systems"].values():
            means = plots.stage_means(entry)
            assert sum(v for k, v in means.items() if k != "total") == pytest.approx(means["total"])


def test_synthesize_entry_point_writes_a_loadable_index(tmp_path, capsys):
    from experiments import synthesize

    out = tmp_path / "syn"
    assert synthesize.main([str(out), "--passages", "300", "--num-queries", "4"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["complete"] and summary["num_chunks"] == 1
    assert (out / "ivf.pid.pt").exists() and (out / "0.codes.pt").exists()
    assert synthesize.main([str(out), "--verify"]) == 0
    assert json.loads(capsys.readouterr().out)["passages"] == 300
    (out / "0.codes.pt").unlink()
    assert synthesize.main([str(out), "--verify"]) == 1
    assert "0.codes.pt" in capsys.readouterr().err


@pytest.mark.colbert
def test_equivalence_on_the_tiny_index(tiny_run, tmp_path):
    """experiments/equivalence.py on the runner's tiny index: stock and the plugin keep the same
    candidates, and the plugin's top k is the float64 exact order of its candidates."""
    from experiments import equivalence

    experiment, _ = tiny_run
    out = tmp_path / "equivalence"
    assert equivalence.main([str(experiment.path), "--condition", "k10", "--ks", "10", "100",
                             "--runs", str(experiment.out), "--out", str(out), "--device", "cpu",
                             "--limit-queries", "6"]) == 0
    rows = json.loads((out / "equivalence.json").read_text())["rows"]
    assert [row["k"] for row in rows] == [10, 100] and all(row["queries"] == 6 for row in rows)
    for row in rows:
        assert row["candidates_equal"] + row["candidates_ties"] == 1.0
        assert row["topk_exact"] + row["topk_exact_ties"] == 1.0
        assert row["ndocs"] == (256 if row["k"] == 10 else 1024)
    assert rows[0]["topk_equal_stock"] == 1.0  # both fp32 on the CPU
    # A range of queries further on (long runs are split this way), and one past the end.
    assert equivalence.main([str(experiment.path), "--condition", "k10", "--ks", "10", "--runs",
                             str(experiment.out), "--out", str(out / "range"), "--device", "cpu",
                             "--start-query", "4", "--limit-queries", "3"]) == 0
    (row,) = json.loads((out / "range" / "equivalence.json").read_text())["rows"]
    assert row["first_query"] == 4 and row["queries"] == 3
    with pytest.raises(ValueError, match="--start-query"):
        equivalence.main([str(experiment.path), "--condition", "k10", "--ks", "10", "--runs",
                          str(experiment.out), "--out", str(out / "past"), "--device", "cpu",
                          "--start-query", "10000"])
