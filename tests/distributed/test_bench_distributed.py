"""The multi-GPU benchmark runs end to end on two gloo CPU processes with a tiny corpus."""

from __future__ import annotations

import json
import os

import torch.distributed as dist

from tests.distributed.helpers import run_on_two_ranks


def scenario_bench(out_dir):
    from experiments.bench_distributed import main

    argv = ["--backend", "gloo", "--scorer", "reference", "--dense-size", "12KiB", "--residual-size", "3KiB",
            "--dim", "16", "--queries", "3", "--lq", "4", "--k", "5", "--num-centroids", "8",
            "--reps", "2", "--warmup", "0", "--chunk-tokens", "64", "--max-docs-per-call", "7",
            "--out", out_dir]
    assert main(argv) == 0
    if dist.get_rank() == 0:
        with open(os.path.join(out_dir, "distributed.json")) as f:
            doc = json.load(f)
        rows = doc["rows"]
        assert [(r["shape"].split()[0], r["world_size"]) for r in rows] == [
            ("dense", 1), ("dense", 2), ("residual", 1), ("residual", 2)]
        # Same corpus on 1 and 2 ranks: same top-k, bit for bit.
        assert all(r["topk_equal_to_first"] and r["max_score_diff"] == 0.0 for r in rows)
        assert rows[1]["speedup_vs_sharded-1gpu"] > 0 and rows[1]["ms_allgather"] >= 0
        assert doc["provenance"]["torch"] and doc["meta"]["env"]["NCCL_NVLS_ENABLE"] == "0"


def test_bench_distributed_runs_on_two_cpu_ranks(tmp_path):
    run_on_two_ranks(tmp_path, scenario_bench, str(tmp_path / "results"))
