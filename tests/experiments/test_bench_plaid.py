"""experiments/bench_plaid.py end to end on the tiny index, on CPU: the code path the GPU run
takes (stock vs patched searches, encoders of other sizes built on the spot, equivalence), so
that a broken benchmark shows here rather than in a device call."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.plaid.conftest import patch_state, tiny_searcher  # noqa: F401 (a fixture)

pytestmark = pytest.mark.colbert


@pytest.fixture(scope="module")
def bundle(tiny_plaid_index, tiny_searcher, tmp_path_factory):
    """The layout `bench_plaid prepare` writes, made from the session's tiny index."""
    from experiments import bench_plaid

    out = tmp_path_factory.mktemp("plaid_bench")
    shutil.copytree(tiny_plaid_index.index_path, out / "indexes" / bench_plaid.BUNDLE_INDEX_NAME)
    queries = tiny_plaid_index.queries[:4]
    with patch_state(("compat",)):
        Q = tiny_searcher.encode(queries)
    torch.save({"Q": Q.half(), "texts": queries, "relevant_pids": list(range(len(queries)))},
               out / bench_plaid.BUNDLE_QUERIES)
    bench_plaid._tiny_encoder(out, out / "work", dim=tiny_plaid_index.dim)
    return out


def test_run_writes_search_encoder_and_equivalence_rows(bundle, tmp_path, capsys):
    from experiments import bench_plaid

    out = tmp_path / "plaid"
    with patch_state(("compat", "scoring")):
        assert bench_plaid.main(["run", "--bundle", str(bundle), "--out", str(out), "--ks", "10",
                                 "--num-queries", "2", "--equivalence-queries", "3",
                                 "--synthetic-passages", "0", "--encoder-shapes", "tiny",
                                 "--encoder-rounds", "2"]) == 0
    document = json.loads((out / "plaid.json").read_text())
    assert document["provenance"]["colbert_ai"] == "0.2.22" and document["provenance"]["transformers"]
    rows = document["rows"]
    searches = [r for r in rows if r["suite"] == "search"]
    assert {r["provider"] for r in searches} == {bench_plaid.STOCK, bench_plaid.PATCHED,
                                                 bench_plaid.PATCHED_EAGER}
    assert all(r["ms"] > 0 for r in searches)
    assert all(r["search_call"] > 0 for r in searches), "Searcher.search itself is timed too"
    # The stage means a plot stacks add up to the row's mean encode + dense_search.
    for row in searches:
        if row["provider"] != bench_plaid.PATCHED:
            stages = ("candidates", "stages_2_3", "stage_4", "sort")
            assert sum(row[f"mean_{s}"] for s in stages) == pytest.approx(row["mean_dense_search"])
        assert row["mean_encode"] > 0 and row["mean_dense_search"] > 0
    encoder_rows = [r for r in searches if "encoder=tiny" in r["shape"]]
    assert len(encoder_rows) == 2
    assert all(r["queries"] == 2 * 2 for r in encoder_rows), "both rounds of 2 queries pooled"
    # Without a GPU nothing is captured, and the patched encoder is colbert-ai's own code.
    assert all(r["encoder_same_as_stock"] == 1.0 and r["encoder_graph"] is False for r in encoder_rows)
    # The host tokenizer needs no GPU: verified against upstream, then used by the patched side.
    assert {r["provider"]: r["encoder_host_tokens"] for r in encoder_rows} == {
        bench_plaid.STOCK: False, bench_plaid.PATCHED: True}
    (equivalence,) = [r for r in rows if r["suite"] == "equivalence"]
    assert equivalence["same_as_exact_rescore"] + equivalence["exact_rescore_ties"] == 1.0
    assert "equivalence" in capsys.readouterr().out
    # The results folder is what a device call returns: no model weights in it.
    assert not [p for p in out.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt")]


def test_profile_encode_times_both_systems(bundle, capsys):
    """experiments/profile_encode.py on the CPU: wall times and the cProfile table for both
    systems (the GPU kernel column needs a GPU)."""
    from experiments import profile_encode

    with patch_state(("compat", "scoring")):
        assert profile_encode.main(["--bundle", str(bundle), "--encoder-shapes", "bundle", "tiny",
                                    "--calls", "3", "--lines", "5"]) == 0
    out = capsys.readouterr().out
    summary = out[out.rindex("encoder "):].splitlines()[1:]
    assert [line.split()[:2] for line in summary] == [
        ["bundle", "colbert-ai"], ["bundle", "tilemaxsim"], ["tiny", "colbert-ai"], ["tiny", "tilemaxsim"]]
    assert all(float(line.split()[2]) > 0 for line in summary)
    assert out.count("Ordered by: internal time") == 4


def test_sync_site_names_the_caller_outside_torch():
    """A sync warned about inside torch is reported at the innermost frame outside torch that
    led to it, with the torch frame after it."""
    import os
    import traceback

    from experiments import bench_plaid

    def frame(path, line):
        return traceback.FrameSummary(path, line, "f")

    torch_dir = f"{os.sep}site{os.sep}torch{os.sep}cuda{os.sep}__init__.py"
    stack = [frame("/a/main.py", 1), frame("/a/tilemaxsim_plaid/plaid/scoring.py", 40),
             frame(f"/x{torch_dir}", 1270)]
    assert bench_plaid.sync_site(stack) == "plaid/scoring.py:40 (via cuda/__init__.py:1270)"
    assert bench_plaid.sync_site(stack[:2]) == "plaid/scoring.py:40"


def test_only_sync_warnings_count_as_syncs():
    from experiments import bench_plaid

    assert bench_plaid.is_sync_warning("called a synchronizing CUDA operation")
    # set_sync_debug_mode's own notice (torch 2.11 gives it once per process).
    assert not bench_plaid.is_sync_warning(
        "Synchronization debug mode is a prototype feature and does not detect all "
        "synchronizing operations")


def test_union_of_gpu_intervals_counts_overlaps_once():
    from experiments import profile_encode

    assert profile_encode._union_us([]) == 0.0
    assert profile_encode._union_us([(0.0, 10.0), (5.0, 12.0), (20.0, 21.0), (11.0, 11.5)]) == 13.0
