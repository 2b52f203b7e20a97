"""``tilemaxsim explain`` on this machine: the path each op and PLAID stage takes and why, a bad
variable as exit status 2 with one line, ``--json`` for machines, ``--index`` read from disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.plaid.conftest import tiny_searcher  # noqa: F401 (the Searcher fixture of tests/plaid)
from tilemaxsim_plaid import cli, explain
from tilemaxsim_plaid.plaid import environment
from tilemaxsim_plaid.plaid.scoring import PROFILER_RANGES

ON_GPU = torch.cuda.is_available()
VARIABLES = (environment.DISABLE_ENV_VAR, environment.BACKEND_ENV_VAR,
             environment.PRODUCTS_ENV_VAR, environment.GRAPHS_ENV_VAR)


@pytest.fixture
def clean_env(monkeypatch):
    """No TILEMAXSIM_PLAID_* variable set; the interpreter as the test session has it."""
    for name in list(os.environ):
        if name.startswith(explain.ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def _run(argv, capsys) -> tuple[int, str, str]:
    status = cli.main(["explain", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.skipif(ON_GPU, reason="the CPU machine's answers")
def test_cpu_machine_names_the_torch_path_and_why(clean_env, capsys):
    clean_env.delenv("TRITON_INTERPRET", raising=False)
    status, out, err = _run([], capsys)
    assert status == 0 and err == ""
    assert "PLAID stages (backend torch: default for an index on cpu)" in out
    assert "reference.centroid_interaction in fp32 torch" in out
    assert "fp32 (decompressed, then scored)" in out
    assert "CUDA graphs need a GPU" in out
    # Without a GPU or the interpreter no op can launch, and the report says so.
    report = explain.explain()
    assert {op["path"] for op in report["ops"].values()} == {"unavailable"}
    assert all("TRITON_INTERPRET is not 1" in op["why"] for op in report["ops"].values())
    assert report["plaid"]["backend"] == "torch"
    assert report["machine"]["cuda_available"] is False


@pytest.mark.skipif(ON_GPU, reason="the CPU machine's answers")
def test_interpreter_runs_the_ops_on_the_cpu(clean_env):
    clean_env.setenv("TRITON_INTERPRET", "1")
    clean_env.setenv(environment.BACKEND_ENV_VAR, "triton")
    report = explain.explain(query_tokens=32)
    for name in ("maxsim_packed", "maxsim_padded", "maxsim_residual", "maxsim_pq"):
        assert report["ops"][name]["path"].startswith("Triton"), report["ops"][name]
        assert "CPU interpreter" in report["ops"][name]["why"]
    assert report["ops"]["maxsim_pq"]["mma"] == "needs device cpu (a CUDA GPU)"
    assert "device cpu (a CUDA GPU)" in report["ops"]["maxsim_pq"]["lut_shared"]
    plaid = report["plaid"]
    assert plaid["backend"] == "triton"
    assert plaid["backend_why"] == f"{environment.BACKEND_ENV_VAR}=triton"
    stage_4 = plaid["stages"]["tilemaxsim.exact_scores"]
    assert stage_4["path"].startswith("ops.residual.maxsim_residual")
    assert "pass --index" in stage_4["products"]


def test_without_triton_every_op_says_so(clean_env):
    from tilemaxsim_plaid import triton_support

    clean_env.setitem(sys.modules, "triton", None)  # what `import triton` meets when it is absent
    clean_env.setattr(triton_support, "triton_version", lambda: None)  # read once, then cached
    report = explain.explain(device="cpu")
    for op in report["ops"].values():
        assert op["path"] == "unavailable" and "triton is not installed" in op["why"], op
    assert report["machine"]["device"] == "cpu"
    assert report["plaid"]["backend"] == "torch"

def test_an_older_triton_is_named(clean_env):
    from tilemaxsim_plaid import triton_support

    clean_env.setattr(triton_support, "triton_version", lambda: (3, 2))
    report = explain.explain(device="cpu")
    for op in report["ops"].values():
        assert op["path"] == "unavailable" and "triton 3.2 is installed" in op["why"], op
    assert report["plaid"]["backend"] == "torch"



def test_default_configs_come_from_the_ops(clean_env):
    """The configs shown are the ops' own choices (for the shapes named), not a copy of them."""
    pytest.importorskip("triton")
    from tilemaxsim_plaid.ops import dense, residual

    clean_env.setenv("TRITON_INTERPRET", "1")
    ops = explain.explain(query_tokens=32, device="cpu")["ops"]
    many = dense.default_config(1, 32, None, 128, variable_lengths=True, num_docs=explain.MANY_DOCS,
                                element_size=2)
    assert ops["maxsim_packed"]["default_config"][
        f"fp16, >= {dense.MANY_DOCS:,} docs of 70 tokens on average"] == explain._non_defaults(many)
    few = residual.default_residual_config(1, 32, False, explain.FEW_DOCS, 2, half_table=True)
    shown = ops["maxsim_residual"]["default_config"]["fp16, 1,024 docs"]
    assert shown == explain._non_defaults(few)


def test_packed_default_is_shown_for_the_card_and_the_index_mean_length(clean_env, monkeypatch):
    """One query's packed default over many documents depends on the card's bandwidth and the
    documents' mean length: the report asks the op's rule with both (the index's mean where
    given, else MEAN_DOC_TOKENS)."""
    pytest.importorskip("triton")
    from tilemaxsim_plaid.ops import dense, launch

    clean_env.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(launch, "memory_bandwidth", lambda device: 3.35e12)  # an H100's
    many = f"fp16, >= {dense.MANY_DOCS:,} docs of"

    def shown(facts):
        rows = explain._ops(torch.device("cpu"), 32, facts, [])["maxsim_packed"]["default_config"]
        return next(config for name, config in rows.items() if name.startswith(many))

    assert shown(None) == explain._non_defaults(dense.MaxSimConfig(block_t=32, num_warps=2,
                                                                   num_stages=2))
    short = explain.IndexFacts(path="index", num_centroids=1 << 16, nbits=2, dim=128,
                               num_documents=10, max_doclen=60, bucket_weights=(0.0, 1.0),
                               mean_doclen=30.0)
    assert "hold_query=True" in shown(short)


def test_residual_mma_default_is_shown_where_it_applies(clean_env):
    """Where the mma kernel applies (a GPU stood in for here), maxsim_residual's many-document
    row names mma_default at each C: the L2 prefetch at C = 2^16, not beside the L2 policies a
    C = 2^18 table takes; at nbits 1 the reason is named instead."""
    pytest.importorskip("triton")
    from tilemaxsim_plaid.ops import mma_fragments, nvrtc, residual

    clean_env.setenv("TRITON_INTERPRET", "1")
    clean_env.setattr(mma_fragments, "device_reasons", lambda device: [])
    clean_env.setattr(nvrtc, "available", lambda: True)
    entry = explain.explain(query_tokens=32, device="cpu")["ops"]["maxsim_residual"]
    assert entry["mma"] == "applies" and "mma from" in entry["path"]
    rows = entry["default_config"]
    many = f">= {residual.MANY_DOCS:,} docs"
    assert rows[f"fp16 nbits 2, C = 65,536, {many}"] == (
        f"mma (CUDA C++ by NVRTC, {explain._non_defaults(residual.mma_default(False))})")
    assert rows[f"fp16 nbits 2, C = 262,144, {many}"] == (
        f"mma (CUDA C++ by NVRTC, {explain._non_defaults(residual.mma_default(True))})")
    assert "prefetch=True" in rows[f"fp16 nbits 2, C = 65,536, {many}"]
    assert "prefetch" not in rows[f"fp16 nbits 2, C = 262,144, {many}"]
    facts = explain.IndexFacts(path="index", num_centroids=1 << 18, nbits=1, dim=128,
                               num_documents=10, max_doclen=8, bucket_weights=(0.0, 1.0))
    entry = explain._ops(torch.device("cpu"), 32, facts, [])["maxsim_residual"]
    assert entry["mma"].startswith("needs nbits = 1 (2 or 4)")
    assert not any(name.startswith("fp16 nbits") for name in entry["default_config"])


@pytest.mark.parametrize("name, value, expected", [
    pytest.param(environment.BACKEND_ENV_VAR, "cuda", "must be one of ('triton', 'torch')",
                 id="backend"),
    pytest.param(environment.PRODUCTS_ENV_VAR, "fp8", "must be one of ('auto',", id="products"),
    pytest.param(environment.GRAPHS_ENV_VAR, "maybe", "must be one of ('1',", id="graphs"),
    pytest.param(environment.DISABLE_ENV_VAR, "2", "must be one of ('1',", id="disable"),
])
def test_bad_value_is_status_2_and_one_line(clean_env, capsys, name, value, expected):
    clean_env.setenv(name, value)
    status, out, err = _run([], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"tilemaxsim explain: {name} "), err
    assert expected in err and repr(value) in err


@pytest.mark.skipif(ON_GPU, reason="the CPU machine's answers")
def test_triton_backend_without_gpu_or_interpreter_is_status_2(clean_env, capsys):
    clean_env.delenv("TRITON_INTERPRET", raising=False)
    clean_env.setenv(environment.BACKEND_ENV_VAR, "triton")
    status, _, err = _run([], capsys)
    assert status == 2 and err.count("\n") == 1 and "needs the index on a CUDA device" in err


def test_bad_arguments_are_status_2_and_one_line(clean_env, capsys, tmp_path):
    for argv, expected in ((["--index", str(tmp_path)], f"--index {tmp_path}: no metadata.json"),
                           (["--device", "nowhere"], "--device must be cpu or cuda"),
                           (["--query-tokens", "0"], "--query-tokens must be >= 1")):
        status, out, err = _run(argv, capsys)
        assert status == 2 and out == "", argv
        assert err.count("\n") == 1 and expected in err, err


def test_json_parses_and_names_every_stage(clean_env, capsys):
    clean_env.setenv("TILEMAXSIM_PLAID_PRODUCT", "fp16")  # misspelt: listed, not read
    status, out, err = _run(["--json", "--query-tokens", "16"], capsys)
    assert status == 0 and err == ""
    report = json.loads(out)
    assert set(report) >= {"machine", "environment", "plugin", "ops", "plaid", "restated"}
    assert report["query_tokens"] == 16
    assert set(PROFILER_RANGES) <= set(report["plaid"]["stages"])
    assert all({"path", "why"} <= set(stage) for stage in report["plaid"]["stages"].values())
    variables = report["environment"]["variables"]
    assert set(variables) == set(VARIABLES)
    assert variables[environment.PRODUCTS_ENV_VAR] == {"set": None, "value": "auto"}
    assert report["environment"]["unknown"] == ["TILEMAXSIM_PLAID_PRODUCT"]


def test_command_table_imports_lazily():
    """``tilemaxsim --help`` stays fast: the CLI imports neither torch nor a command's module."""
    code = ("import sys, tilemaxsim_plaid.cli as cli; cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'colbert', 'tilemaxsim_plaid.explain') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
    assert "explain" in cli.COMMANDS


@pytest.mark.colbert
@pytest.mark.parametrize("products, query_tokens", [
    pytest.param("auto", 32, id="auto"),
    pytest.param("fp16x2", 32, id="fp16x2"),
    pytest.param("fp16x2", 200, id="fp16x2-no-table"),
])
def test_index_decisions_match_the_device_index(clean_env, tiny_plaid_index, tiny_searcher,
                                                products, query_tokens):
    """With --index, stage 4's products are what the plugin resolves for the real device copy
    of the same index (the Triton backend, interpreted on the CPU)."""
    pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")
    from tilemaxsim_plaid.plaid import backends
    from tilemaxsim_plaid.plaid.device_index import device_index

    if not ON_GPU:
        clean_env.setenv("TRITON_INTERPRET", "1")
    clean_env.setenv(environment.BACKEND_ENV_VAR, "triton")
    clean_env.setenv(environment.PRODUCTS_ENV_VAR, products)
    ranker = tiny_searcher.ranker
    report = explain.explain(index=tiny_plaid_index.index_path, query_tokens=query_tokens,
                             device=str(ranker.codec.centroids.device))
    facts = report["index"]
    assert facts["num_centroids"] == ranker.codec.centroids.shape[0]
    assert (facts["nbits"], facts["dim"]) == (tiny_plaid_index.nbits, tiny_plaid_index.dim)
    assert facts["num_documents"] == ranker.doclens.numel()
    assert facts["max_doclen"] == int(ranker.doclens.max())
    stage_4 = report["plaid"]["stages"]["tilemaxsim.exact_scores"]
    expected, fell_back = backends.resolved_products(device_index(ranker), query_tokens)
    assert stage_4["products"] == expected
    assert ("falls back to tf32x3" in stage_4["products_why"]) == fell_back
    assert fell_back == (query_tokens == 200)
