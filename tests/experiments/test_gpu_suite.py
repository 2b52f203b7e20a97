"""experiments/gpu_suite.py on the CPU: the suites' commands, and the runner on toy suites."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import time
from pathlib import Path

import pytest

from experiments import gpu_suite
from experiments.gpu_suite import ROOT, Step

PY = sys.executable
OPTS = argparse.Namespace(before=".before", rounds=1, only=None)
WORK = Path("W")
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not colbert"]
PLAID_RUN = ["-m", "experiments.bench_plaid", "run", "--bundle", f"{ROOT}/runs/plaid_bench"]
PLAID_TAIL = ["--synthetic-dir", f"{ROOT}/runs/plaid_bench_synthetic/synthetic.nbits2",
              "--num-queries", "32", "--equivalence-queries", "500"]
RERANK = ["--rerank-sizes", "100000", "1000000", "--stock-rerank-max", "100000"]
XDIST = list(gpu_suite.parallel_workers())  # pytest-xdist's workers where it is installed

# Every suite's steps (but the wheel install, which depends on .whl/): name -> argv after python.
EXPECTED = {
    "kernels": {
        "dense-tests": [*PYTEST, "tests/kernels/test_maxsim_dense.py"],
        "bench-dense": ["-m", "experiments.bench", "--no-sweeps", "--out", "W/bench"],
    },
    "compressed": {
        "compressed-tests": [*PYTEST, "tests/kernels/test_maxsim_residual.py", "tests/kernels/test_maxsim_pq.py",
                             "tests/kernels/test_maxsim_pq_mma.py", "tests/kernels/test_maxsim_pq_lut_shared.py",
                             "tests/codecs", "tests/ops", "-k", "not any_config"],
        "bench-compressed": ["-m", "experiments.bench_compressed", "--out", "W/compressed"],
    },
    "plaid": {
        "plaid-kernel-tests": [*PYTEST, "tests/plaid/test_centroid.py", "tests/plaid/test_ivf.py",
                               "tests/plaid/test_sort.py"],
        "bench-plaid": [*PLAID_RUN, "--out", "W/plaid", *PLAID_TAIL, *RERANK],
    },
    "reproduce": {
        "reproduce-wiki": ["-m", "experiments.reproduce", "configs/wiki-vital-h200.yaml", "--steps", "search",
                           "--out", "runs/wvgpu"],
        "reproduce-synthetic": ["-m", "experiments.reproduce", "configs/synthetic-scale.yaml", "--steps",
                                "prepare,search", "--out", "runs/syngpu", "--conditions",
                                "rerank,rerank-1m,plaid-k10,plaid-k100,plaid-k1000"],
    },
    "reproduce-d384": {
        "reproduce-d384": ["-m", "experiments.reproduce", "configs/wiki-vital-h200-d384.yaml", "--steps",
                           "search", "--out", "runs/wv384gpu"],
    },
    "reproduce-lengths": {
        "reproduce-lengths": ["-m", "experiments.reproduce", "configs/synthetic-scale.yaml", "--steps",
                              "prepare,search", "--out", "runs/synlen", "--conditions",
                              "length-32,length-64,length-128"],
    },
    "equivalence": {
        "equivalence": ["-m", "experiments.equivalence", "configs/wiki-vital-h200.yaml", "--condition",
                        "d128-k10", "--ks", "10", "100", "1000", "--runs", "runs/wvgpu", "--out",
                        "W/equivalence", "--device", "cuda"],
    },
    "engines": {
        "bench-engines": ["-m", "experiments.bench_engines", "--passages", "100000", "1000000", "--fairness",
                          "--fast-plaid-create-max", "100000", "--stock-queries", "30", "--latency-queries",
                          "100", "--exact-queries", "100", "--colbert-build-max", "0", "--work",
                          "/tmp/engines", "--out", "W/engines"],
    },
    "engines-msmarco": {
        "engines-build": ["-m", "experiments.bench_engines", "--passages", "8841823", "--build-only",
                          "--latency-queries", "100", "--exact-queries", "100", "--colbert-build-max", "0",
                          "--work", "/tmp/engines", "--out", "W/engines-build"],
        "bench-engines": ["-m", "experiments.bench_engines", "--passages", "8841823", "--fairness",
                          "--stock-queries", "20", "--latency-queries", "100", "--exact-queries", "100",
                          "--colbert-build-max", "0", "--work", "/tmp/engines", "--out", "W/engines"],
        "profile-search": ["-m", "experiments.profile_search", "--index", "/tmp/engines/engines-8841823/colbert",
                           "--out", "W/profile-search"],
    },
    "variants": {
        "dense-variants": ["-m", "experiments.bench_dense_variants", "--cells", "headline",
                           "d192-lognormal-30", "d64-lognormal-30", "d128-lognormal-30",
                           "d256-lognormal-30", "d256-lognormal-70", "d256-heavy-512",
                           "d384-lognormal-70", "d512-Lq31", "d512-lognormal-150", "d768-Lq31",
                           "--variants", "int64 rows", "int32 rows", "--out", "W/dense-variants"],
        "residual-scale": ["-m", "experiments.bench_residual_scale", "--out", "W/residual-scale"],
    },
    "validate": {
        "validate-tests": [*PYTEST, *XDIST, "tests/ops/test_validation.py", "tests/ops/test_dense.py",
                           "tests/ops/test_residual.py", "tests/ops/test_pq.py",
                           "tests/kernels/test_value_range.py"],
        "bench-validate": ["-m", "experiments.bench_validate", "--out", "W/validate"],
        "host-profile": ["-m", "experiments.bench_validate", "--num-docs", "2000", "--rounds", "1",
                         "--nbits", "2", "--host-profile", "--out", "W/validate-host"],
    },
    "residual-caps": {
        "residual-caps": ["-m", "experiments.bench_residual_scale", "--centroids", "65536", "--caps",
                          "0", "104", "112", "128", "--out", "W/residual-caps"],
    },
    "residual-decoders": {
        "decoder-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_residual.py",
                          "tests/kernels/test_maxsim_dense.py", "tests/kernels/test_nan_policy.py",
                          "-k", "permute or running or ptx or pipelined"],
        "pq-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_pq.py"],
        "residual-decoders": ["-m", "experiments.bench_residual_scale", "--centroids", "65536",
                              "--decoders", "pairs", "permute", "--pipeline-codes",
                              "--out", "W/residual-decoders"],
    },
    "residual-mma": {
        "residual-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_residual_mma.py",
                           "tests/kernels/test_maxsim_pq_mma.py", "tests/ops/test_residual.py", "tests/kernels/test_maxsim_residual.py",
                           "tests/kernels/test_nan_policy.py",
                           "tests/experiments/test_bench_centroid_table.py"],
        "residual-mma": ["-m", "experiments.bench_residual_scale", "--centroids", "65536",
                         "262144", "--nbits", "2", "4", "--repeats", "2", "--mma-grabs", "4",
                         "8", "--out", "W/residual-mma"],
        "centroid-table": ["-m", "experiments.bench_centroid_table", "--out", "W/centroid-table"],
    },
    "dense-rows": {
        "dense-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_dense.py",
                        "tests/kernels/test_nan_policy.py", "tests/ops/test_dense.py"],
        "dense-rows": ["-m", "experiments.bench_dense_variants", "--cells", "headline",
                       "d128-lognormal-30", "d64-lognormal-30", "Lq64", "d64-Lq64", "d144-Lq48",
                       "B4", "B4-Lq33", "B16-Lq16", "B32-Lq8", "B32-Lq33", "B4-padded", "d64",
                       "d64-Lq16", "d64-Lq24", "d64-lognormal-150", "d64-heavy-512",
                       "d64-uniform", "d80", "d96-lognormal-30",
                       "--variants", "masked rows", "repeated rows", "flat documents",
                       "loop per document",
                       "--rounds", "3", "--out", "W/dense-rows"],
    },
    "dense-flat": {
        "flat-tests": [*PYTEST, *XDIST, "-k", "flat", "tests/kernels/test_maxsim_dense.py",
                       "tests/kernels/test_nan_policy.py"],
        "dense-flat": ["-m", "experiments.bench_dense_variants", "--cells", "d64-lognormal-30",
                       "d96-lognormal-30", "d128-lognormal-30", "d144-lognormal-30",
                       "d192-lognormal-30", "d256-lognormal-30", "headline", "d64",
                       "d64-heavy-512", "--variants", "flat documents", "loop per document",
                       "--rounds", "5", "--out", "W/dense-flat"],
    },
    "peer-roof": {
        "sweep-eighth": ["-m", "experiments.sweep_configs", "--cells", "eighth", "--budget",
                         "150", "--out", "W/sweep-eighth"],
        "peer-roof": ["-m", "experiments.bench_dense_variants", "--cells", "headline",
                      "d512-lognormal-150", "d160-padded", "--variants", "default",
                      "--rounds", "5", "--out", "W/peer-roof"],
        "per-document": ["-m", "experiments.bench_dense_variants", "--cells", "headline", "d64",
                         "d64-lognormal-30", "d128-lognormal-30", "d256-lognormal-70", "d96",
                         "d144", "d160", "Lq64", "d64-lognormal-150", "--variants",
                         "per document", "held query", "--rounds", "5", "--out", "W/per-document"],
        "wide-per-document": ["-m", "experiments.bench_dense_variants", "--cells",
                              "d256-lognormal-70", "d256-lognormal-150", "d256-uniform",
                              "d256-heavy-512", "d384-lognormal-30", "d384-lognormal-70", "d512",
                              "d512-lognormal-150", "d512-uniform", "d512-heavy-512",
                              "d768-lognormal-30", "d768-Lq31", "--variants", "held query",
                              "slower card", "--rounds", "5", "--out", "W/wide-per-document"],
    },
    "remainder-chunk": {
        "dense-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_dense.py",
                        "tests/ops/test_dense.py"],
        "remainder-chunk": ["-m", "experiments.bench_dense_variants", "--cells", "d144-Lq16",
                            "d144", "d144-Lq33", "d144-Lq48", "d144-Lq64", "d144-lognormal-30",
                            "d96", "d96-Lq48", "d96-lognormal-30", "d80", "d160", "d192-Lq64",
                            "d144-padded", "d160-padded", "d320-padded",
                            "--variants", "masked remainder", "widest chunks", "--rounds", "3",
                            "--out", "W/remainder-chunk"],
    },
    "slots-length": {
        "slots-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_dense.py", "-k",
                        "slots or length or any_config"],
        "slots-length": ["-m", "experiments.bench_dense_variants", "--cells", "B4", "B4-Lq33",
                         "B16-Lq16", "B32-Lq8", "B32-Lq33", "B16-Lq8", "B32-Lq16", "B16", "B32",
                         "B4-Lq64", "B16-Lq64", "--variants", "length order", "order given",
                         "slots 8x16 by length", "held block",
                         "--rounds", "3", "--out",
                         "W/slots-length"],
    },
    "joined-tail": {
        "split-tests": [*PYTEST, *XDIST, "tests/kernels/test_maxsim_dense.py", "-k",
                        "split or tail or full_query_blocks"],
        "joined-tail": ["-m", "experiments.bench_dense_variants", "--cells", "B4-Lq48",
                        "B16-Lq48", "B32-Lq48", "--variants", "tail apart", "held block",
                        "--rounds", "3", "--out", "W/joined-tail"],
        "grid-B-Lq": ["-m", "experiments.bench_grid", "--cells", "full", "--groups", "grid_B_Lq",
                      "--budget", "200", "--no-plots", "--out", "W/grid-B-Lq"],
    },
    "stage4-table": {
        "table-tests": [*PYTEST, *XDIST, "tests/ops/test_residual.py",
                        "tests/plaid/test_stage4_tables.py",
                        "tests/experiments/test_bench_stage4_table.py"],
        "stage4-table": ["-m", "experiments.bench_stage4_table", "--centroids", "262144",
                         "524288", "1048576", "--query-lens", "32", "64",
                         "--candidates", "2000", "12000", "100000", "--out", "W/stage4-table"],
    },
    "dense-ncu": {
        "dense-ncu": ["-m", "experiments.profile_kernels", "ncu", "--ops", "dense,wide", "--only",
                      "=packed,=flash_maxsim_packed,=packed B1 Lq64,=packed B4 Lq32",
                      "--out", "W/dense-ncu"],
    },
    "residual-ncu": {
        "residual-ncu": ["-m", "experiments.profile_kernels", "ncu", "--ops", "residual", "--only",
                         "=residual,=residual nbits4,residual decode", "--out", "W/residual-ncu"],
    },
    "grid": {
        "sweep-sixth": ["-m", "experiments.sweep_configs", "--cells", "sixth", "--budget", "120",
                        "--out", "W/sweep-sixth"],
        "sweep-wide": ["-m", "experiments.sweep_configs", "--cells", "wide", "--budget", "120",
                       "--out", "W/sweep-wide"],
        "sweep-multi": ["-m", "experiments.sweep_configs", "--cells", "multi", "--budget", "120",
                        "--out", "W/sweep-multi"],
        "grid-full": ["-m", "experiments.bench_grid", "--cells", "full", "--budget", "535",
                      "--no-plots", "--out", "W/grid-full"],
    },
    "profile-batched": {
        "batched-time": ["-m", "experiments.profile_batched", "time", "--grid",
                         "results/grid/h100-f460491-full/grid.json", "--out", "W/profile-batched"],
        "batched-ncu": ["-m", "experiments.profile_batched", "ncu", "--grid",
                        "results/grid/h100-f460491-full/grid.json", "--out", "W/profile-batched"],
        "batched-summary": ["-m", "experiments.profile_batched", "summarize", "W/profile-batched/ncu.csv",
                            "--launches", "W/profile-batched/profile_launches.json", "--out",
                            "W/profile-batched"],
    },
    "profile-search": {
        "profile-search-8.8m": ["-m", "experiments.profile_search", "--passages", "8841823", "--out",
                                "W/profile-search-8.8m"],
        "profile-search-100k": ["-m", "experiments.profile_search", "--passages", "100000", "--centroids",
                                "32768", "--k", "10", "--out", "W/profile-search-100k"],
    },
    "engines-extra": {
        "engines-build-times": ["-m", "experiments.bench_engines", "--passages", "100000", "--build-only",
                                "--colbert-build-max", "100000", "--fast-plaid-create-max", "100000",
                                "--latency-queries", "100", "--exact-queries", "100", "--work",
                                "/tmp/engines", "--out", "W/engines-build-times"],
        "wiki-vital-encode": ["-m", "experiments.wiki_vital_bundle", "encode", ".wiki_bundle", "--out",
                              "/tmp/wiki-vital-emb", "--device", "cuda"],
        "bench-engines-wiki-vital": ["-m", "experiments.bench_engines", "--embeddings", "/tmp/wiki-vital-emb",
                                     "--fairness", "--stock-queries", "30", "--colbert-build-max", "100000",
                                     "--latency-queries", "100", "--exact-queries", "100", "--work",
                                     "/tmp/engines", "--out", "W/engines-wiki-vital"],
    },
    "distributed": {
        "bench-distributed": ["-m", "torch.distributed.run", "--nproc-per-node=gpu",
                              "-m", "experiments.bench_distributed", "--residual-size", "8GiB", "--out",
                              "W/distributed"],
    },
}
PARTS = str(gpu_suite.GRID_PARTS)
EXPECTED["targets"] = {
    "grid-full": ["-m", "experiments.bench_grid", "--cells", "full", "--budget", "535",
                  "--no-plots", "--out", f"{PARTS}/grid-full"],
    "residual-scale": ["-m", "experiments.bench_residual_scale", "--out", "W/residual-scale"],
    "rerank-c18": ["-m", "experiments.profile_rerank", "--sizes", "100000", "--num-docs",
                    "1000000", "--num-centroids", "262144"],
    "bench-validate": ["-m", "experiments.bench_validate", "--out", "W/validate"],
    "grid-rest": ["-m", "experiments.bench_grid", "--cells", "full", "--budget", "280",
                  "--no-plots", "--skip-done", f"{PARTS}/grid-full", "--out", f"{PARTS}/grid-rest"],
}
# The open predictions' one call: two suites above in order, without the residual and flat-walk
# tests.
EXPECTED["predictions"] = {name: argv for suite in ("residual-mma", "dense-flat")
                           for name, argv in EXPECTED[suite].items()
                           if name not in ("residual-tests", "flat-tests")}
HEADLINE = {
    "dense": ["-m", "experiments.bench", "--no-sweeps", "--providers", "tilemaxsim", "--out", None],
    "compressed": ["-m", "experiments.bench_compressed", "--out", None],
    "rerank": ["-m", "experiments.profile_rerank", "--sizes", "100000", "--num-docs", "1000000"],
}


@pytest.fixture
def fast_probe(monkeypatch):
    monkeypatch.setattr(gpu_suite, "PROBE", "print('{\"gpu\": \"toy\"}')")


def steps_of(name: str, opts=OPTS) -> list[Step]:
    return [s for s in gpu_suite.suite_steps(name, WORK, opts) if s.name != "wheels"]


def test_every_suite_is_expected():
    assert set(gpu_suite.SUITES) == set(EXPECTED) | {"before-after", "new-offsets"}


def test_new_offsets_runs_its_tests_then_the_packed_and_pq_ways_in_both_trees():
    opts = argparse.Namespace(before="/old", rounds=1, only=None)
    steps = steps_of("new-offsets", opts)
    assert [s.name for s in steps] == ["offsets-tests", "kernel-tests", "validate-before",
                                       "validate-after"]
    assert steps[0].argv[1:] == (*PYTEST, *XDIST, "tests/ops/test_validation.py",
                                 "tests/kernels/test_maxsim_residual_mma.py",
                                 "tests/kernels/test_maxsim_pq_mma.py")
    for step, tree in zip(steps[2:], ("before", "after")):
        assert step.cwd == (Path("/old") if tree == "before" else ROOT)
        assert list(step.argv[1:]) == ["-m", "experiments.bench_validate", "--ops", "packed",
                                       "pq", "--rounds", "3", "--out", str(WORK / tree)]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_suite_commands(name):
    steps = steps_of(name)
    assert {s.name: list(s.argv[1:]) for s in steps} == EXPECTED[name]
    assert all(s.argv[0] == PY and s.cwd == ROOT and 0 < s.timeout <= 600 for s in steps)


def test_before_after_alternates_trees_per_benchmark_and_round():
    opts = argparse.Namespace(before="/old", rounds=2, only=None)
    steps = steps_of("before-after", opts)
    assert [s.name for s in steps] == [f"{b}-{t}-{r}" for r in (1, 2) for b in ("dense", "compressed", "rerank")
                                       for t in ("before", "after")]
    for step in steps:
        bench, tree, r = step.name.split("-")
        assert step.cwd == (Path("/old") if tree == "before" else ROOT)
        out = str(WORK / tree / f"{bench}{r}")
        assert list(step.argv[1:]) == [out if a is None else a for a in HEADLINE[bench]]


def test_every_flag_is_one_its_script_defines():
    """The suites pass only flags the benchmark scripts' argparse defines (read from source)."""
    scripts = {"experiments.bench": "bench", "experiments.bench_compressed": "bench_compressed",
               "experiments.bench_plaid": "bench_plaid", "experiments.reproduce": "reproduce",
               "experiments.equivalence": "equivalence", "experiments.bench_distributed": "bench_distributed",
               "experiments.bench_engines": "bench_engines"}
    opts = argparse.Namespace(before="/old", rounds=1, only=None)
    steps = [s for name in gpu_suite.SUITES for s in steps_of(name, opts)]
    checked = set()
    for step in steps:
        script = next((scripts[a] for a in step.argv if a in scripts), None)
        if script is None:
            continue
        source = (ROOT / "experiments" / f"{script}.py").read_text()
        for flag in (a.split("=")[0] for a in step.argv if re.fullmatch(r"--[a-z][a-z0-9-]*", a)):
            if script == "bench_distributed" and flag == "--nproc-per-node":
                continue  # torchrun's own
            assert f'"{flag}"' in source, f"{step.name}: {script}.py defines no {flag}"
            checked.add((script, flag))
    assert len({script for script, _ in checked}) == len(scripts)


def test_dense_variants_steps_name_its_cells_and_variants():
    """Each bench_dense_variants step passes cells and variants that script offers (its
    argparse choices), so a step does not fail at its arguments on the GPU."""
    from experiments import bench_dense_variants

    offered = {"--cells": set(bench_dense_variants.CELLS),
               "--variants": set(bench_dense_variants.VARIANTS)}
    opts = argparse.Namespace(before="/old", rounds=1, only=None)
    steps = [s for name in gpu_suite.SUITES for s in steps_of(name, opts)
             if "experiments.bench_dense_variants" in s.argv]
    assert steps
    for step in steps:
        flag = None
        for arg in step.argv[step.argv.index("experiments.bench_dense_variants") + 1:]:
            if arg.startswith("--"):
                flag = arg
            elif flag in offered:
                assert arg in offered[flag], f"{step.name}: {flag} {arg!r} is not offered"


def test_list_and_dry_run(capsys):
    assert gpu_suite.main(["--list"]) == 0
    listing = capsys.readouterr().out
    for name in gpu_suite.SUITES:
        assert re.search(rf"^{re.escape(name)} ", listing, re.M), name
    assert "carry: runs/plaid_bench" in listing and "carry: .before/tilemaxsim_plaid" in listing
    assert gpu_suite.main(["--dry-run", "kernels"]) == 0
    printed = capsys.readouterr().out
    assert "-m experiments.bench --no-sweeps --out '$WORK/bench'" in printed
    assert "-m pytest -q -p no:cacheprovider -m 'not colbert' tests/kernels/test_maxsim_dense.py" in printed
    assert "NCCL_NVLS_ENABLE=0" in printed and f"TILEMAXSIM_COMMIT={gpu_suite.tree_commit(ROOT)}" in printed


def test_only_keeps_matching_steps():
    opts = argparse.Namespace(before=".before", rounds=1, only="rerank-*,dense-after-1")
    assert [s.name for s in steps_of("before-after", opts)] == ["dense-after-1", "rerank-before-1",
                                                              "rerank-after-1"]


def test_wheels_install_first_into_the_site(tmp_path):
    assert gpu_suite.wheel_step(tmp_path) == []
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "b-1-py3-none-any.whl").touch()
    (tmp_path / ".whl" / "a-1-py3-none-any.whl").touch()
    [step] = gpu_suite.wheel_step(tmp_path)
    assert step.argv[1:] == ("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                             "--no-cache-dir", "--upgrade", "--target", "/tmp/site",
                             str(tmp_path / ".whl/a-1-py3-none-any.whl"), str(tmp_path / ".whl/b-1-py3-none-any.whl"))
    env = gpu_suite.step_env(Step("x", (), 1, cwd=tmp_path), site=True)
    assert env["PYTHONPATH"] == f"/tmp/site:{tmp_path}"


def test_harness_commit_prefers_the_device_commit_to_git(tmp_path, monkeypatch):
    from experiments import harness

    monkeypatch.delenv("TILEMAXSIM_COMMIT", raising=False)
    assert harness._commit(tmp_path) in ("unknown", gpu_suite.tree_commit(ROOT))  # git: HEAD
    (tmp_path / ".device_commit").write_text("abc123\n")
    assert harness._commit(tmp_path) == "abc123"
    monkeypatch.setenv("TILEMAXSIM_COMMIT", "def456")
    assert harness._commit(tmp_path) == "def456"


def test_commit_from_device_commit_then_git(tmp_path):
    assert gpu_suite.tree_commit(tmp_path) == "unknown"  # no history of its own, even inside a checkout
    (tmp_path / ".device_commit").write_text("abc123\n")
    assert gpu_suite.tree_commit(tmp_path) == "abc123"


def test_missing_carried_paths_refuse_before_running(tmp_path, capsys):
    assert gpu_suite.main(["before-after", "--before", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert f"missing {tmp_path / 'none'}/tilemaxsim_plaid" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tar.gz"))


def test_steps_kept_in_this_tree_need_no_older_tree(tmp_path, monkeypatch, capsys):
    """new-offsets with --only its tests runs nothing in --before: a missing older tree is no
    refusal then; with its benchmarks kept it is."""
    ran = []
    monkeypatch.setattr(gpu_suite, "run_suite", lambda name, steps, *a, **kw: ran.append(
        [s.name for s in steps]) or 0)
    args = ["new-offsets", "--before", str(tmp_path / "none"), "--out", str(tmp_path)]
    assert gpu_suite.main([*args, "--only", "offsets-tests,kernel-tests"]) == 0
    assert ran and ran[0][-2:] == ["offsets-tests", "kernel-tests"]
    assert gpu_suite.main(args) == 2
    assert f"missing {tmp_path / 'none'}/tilemaxsim_plaid" in capsys.readouterr().err


def toy(name: str, code: str, timeout: float = 30) -> Step:
    return Step(name, (PY, "-c", code), timeout)


def run_toy(tmp_path, steps, **kwargs):
    work, bundle = tmp_path / "work", tmp_path / "out" / "gpu-toy.tar.gz"
    rc = gpu_suite.run_suite("toy", steps, work, bundle, **kwargs)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    return rc, work, names


def test_the_bundle_collects_folders_outside_the_tree_by_their_name(tmp_path, fast_probe):
    """An absolute collect path (the targets suite's grid parts, kept on the machine between
    calls) goes into the bundle under collected/ by its folder's name."""
    parts = tmp_path / "parts"
    (parts / "grid-full").mkdir(parents=True)
    (parts / "grid-full" / "grid.json").write_text("{}")
    _, _, names = run_toy(tmp_path, [toy("a", "pass")], collect=(str(parts),))
    assert "toy/collected/parts/grid-full/grid.json" in names
    assert gpu_suite.SUITES["targets"].collect == (str(gpu_suite.GRID_PARTS),)


def test_probe_reports_versions(capsys):
    exec(gpu_suite.PROBE, {})  # the runner runs it in a child; torch is imported here already
    assert {"torch", "triton", "cuda", "gpu", "gpu_count"} <= set(json.loads(capsys.readouterr().out))


def test_a_failing_probe_is_recorded_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_suite, "PROBE", "raise SystemExit('no torch here')")
    rc, work, _ = run_toy(tmp_path, [toy("a", "pass")])
    assert rc == 0
    assert "no torch here" in json.loads((work / "provenance.json").read_text())["probe_error"]


def test_runner_records_commands_provenance_and_failures(tmp_path, fast_probe, capsys):
    steps = [toy("hello", "print('hello from the step')"),
             toy("fails", "import sys; print('about to fail'); sys.exit(3)"),
             toy("after", "import os; print('commit', os.environ['TILEMAXSIM_COMMIT'])")]
    rc, work, names = run_toy(tmp_path, steps)
    assert rc == 1  # one step failed, and the ones after it still ran
    assert (work / "hello.log").read_text() == "hello from the step\n"
    assert "about to fail" in (work / "fails.log").read_text()
    assert (work / "after.log").read_text().startswith("commit ")
    status = (work / "steps.txt").read_text().splitlines()
    assert [line.split()[:3] for line in status] == [["hello", "ok", "rc=0"], ["fails", "failed", "rc=3"],
                                                     ["after", "ok", "rc=0"]]
    commands = (work / "commands.txt").read_text()
    for step in steps:
        assert f"# {step.name} (limit 30 s)" in commands
    assert "-c 'import sys; print('\"'\"'about to fail'\"'\"'); sys.exit(3)'" in commands
    prov = json.loads((work / "provenance.json").read_text())
    assert prov["suite"] == "toy" and prov["commit"] == gpu_suite.tree_commit(ROOT)
    assert prov["gpu"] == "toy" and "probe_error" not in prov
    assert {"toy/commands.txt", "toy/provenance.json", "toy/steps.txt", "toy/fails.log"} <= set(names)
    out = capsys.readouterr().out
    assert "[hello] hello from the step" in out and "bundle:" in out


def test_all_ok_exits_zero(tmp_path, fast_probe):
    assert run_toy(tmp_path, [toy("a", "pass")])[0] == 0


def test_step_timeout_kills_the_step(tmp_path, fast_probe):
    steps = [toy("slow", "import time; print('started', flush=True); time.sleep(60)", timeout=1),
             toy("next", "print('next ran')")]
    start = time.monotonic()
    rc, work, _ = run_toy(tmp_path, steps)
    assert time.monotonic() - start < 20
    assert rc == 1
    assert (work / "steps.txt").read_text().split()[:3] == ["slow", "timeout", f"rc={gpu_suite.TIMEOUT_RC}"]
    assert "killed at its 1 s limit" in (work / "slow.log").read_text()
    assert (work / "next.log").read_text() == "next ran\n"


def test_budget_caps_steps_and_skips_the_rest(tmp_path, fast_probe, monkeypatch, capsys):
    monkeypatch.setattr(gpu_suite, "MIN_STEP_S", 0.5)
    steps = [toy("first", "pass"), toy("long", "import time; time.sleep(60)", timeout=300),
             toy("never", "print('ran')")]
    start = time.monotonic()
    rc, work, _ = run_toy(tmp_path, steps, budget=2.5)
    assert time.monotonic() - start < 20
    assert rc == 1
    lines = [line.split()[:2] for line in (work / "steps.txt").read_text().splitlines()]
    assert lines == [["first", "ok"], ["long", "timeout"], ["never", "skipped"]]
    assert not (work / "never.log").exists()
    out = capsys.readouterr().out
    assert "never: skipped, the suite's 2 s budget is spent" in out
    assert out.startswith("the steps' limits add up to 360 s; the 2 s budget may cut")


def test_before_after_comparison_table(tmp_path):
    def write(tree, bench, filename, rows):
        folder = tmp_path / tree / f"{bench}1"
        folder.mkdir(parents=True)
        (folder / filename).write_text(json.dumps({"rows": rows}))

    dense = lambda ms: [{"suite": "dense", "shape": "1q N=100k", "provider": "tilemaxsim", "sweep": "main", "ms": ms},
                        {"suite": "dense", "shape": "1q N=100k", "provider": "read_per_document", "ms": 1.0}]
    write("before", "dense", "dense.json", dense(0.400))
    write("after", "dense", "dense.json", dense(0.500))
    pq = lambda ms: [{"suite": "compressed", "shape": "N=100k", "provider": "tilemaxsim_pq_M16", "ms": ms},
                     {"suite": "compressed", "shape": "N=100k", "provider": "torch_decompress_score", "ms": 9.0}]
    write("before", "compressed", "bench_compressed.json", pq(0.200))
    write("after", "compressed", "bench_compressed.json", pq(0.202))
    (tmp_path / "rerank-before-1.log").write_text(
        "== 100000 candidates, products fp16x2: 1.2000 ms from Python, 1.1 ms as a graph\n   12.0 us  kernel\n")
    table = gpu_suite.compare(tmp_path, argparse.Namespace(rounds=1)).splitlines()
    assert table[0].split() == ["bench", "row", "before", "ms", "after", "ms", "ratio"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert len(table) == 4  # only the headline providers
    assert rows["dense"][-6:] == ["0.4000", "0.5000", "1.250", ">", "3", "%"]
    assert rows["compressed"][-3:] == ["0.2000", "0.2020", "1.010"]
    assert rows["rerank"][-3:] == ["1.2000", "-", "-"]  # after's run wrote nothing


def test_cli_runs_a_suite_into_one_bundle(tmp_path, fast_probe, monkeypatch, capsys):
    toy_suite = gpu_suite.Suite("toy", lambda work, opts: [toy("ok", "print('ok')"), toy("bad", "raise SystemExit(2)")],
                                report=lambda work, opts: "the report")
    monkeypatch.setitem(gpu_suite.SUITES, "toy", toy_suite)
    monkeypatch.setattr(gpu_suite, "wheel_step", lambda root=ROOT: [])
    assert gpu_suite.main(["toy", "--out", str(tmp_path)]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["gpu-toy.tar.gz"]
    with tarfile.open(tmp_path / "gpu-toy.tar.gz") as tar:
        steps = tar.extractfile("toy/steps.txt").read().decode()
    assert steps.split()[:2] == ["ok", "ok"] and "bad" in steps and steps.rstrip().endswith("the report")
    assert capsys.readouterr().out.rstrip().endswith(f"bundle: {tmp_path / 'gpu-toy.tar.gz'}")


def test_parallel_workers_only_where_xdist_is_installed(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert gpu_suite.parallel_workers() == ()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert gpu_suite.parallel_workers() == ("-n", "8")
