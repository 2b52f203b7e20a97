"""experiments/profile_batched.py on the CPU: the cells it takes from a grid result, its roofline
arithmetic, the reference check of a tiny cell (interpreter), which launches are which cell, the
ncu command and the summary of an ncu CSV export."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from experiments import bench, bench_grid, harness
from experiments import profile_batched as pb
from tilemaxsim_plaid.ops import dense as dense_ops

CEILINGS = {"read_gbps": 1000.0, "bf16_tflops": 100.0}  # ridge: 100 FLOP per byte


def _grid_row(B, Lq, pct_roof, *, provider=bench.OURS, layout="packed", status="ok", big=True,
              N=100_000, ms=1.0):
    dist = "lognormal-70" if layout == "packed" else "fixed-128"
    cell = bench_grid.Cell(B, Lq, 128, "fp16", layout, dist, N)
    return {"suite": bench_grid.SUITE, "shape": cell.name, "provider": provider, "status": status,
            "ms": ms, "B": B, "Lq": Lq, "d": 128, "dtype": "fp16", "layout": layout, "dist": dist,
            "N": N, "at_least_10mb": big, "pct_roof": pct_roof if status == "ok" else None}


GRID_ROWS = [
    _grid_row(4, 1, 94.5),
    _grid_row(16, 16, 37.3),
    _grid_row(4, 33, 33.5, ms=1.263),
    _grid_row(4, 33, 38.0, layout="padded", N=65_536),  # not the packed op
    _grid_row(1, 32, 20.0),  # one query
    _grid_row(16, 8, 5.0, provider="flash_maxsim"),  # a peer
    _grid_row(32, 64, None, status="not_run"),
    _grid_row(32, 1, 10.0, big=False, N=100),  # below the target's document bytes
    _grid_row(32, 8, 37.0),
]


@pytest.fixture
def grid_files(tmp_path):
    """The same rows as the grid writes them: JSON (with ceilings) and the long-format CSV."""
    path = harness.write_results(GRID_ROWS, tmp_path, "grid", ceilings=CEILINGS)
    return path, path.with_suffix(".csv")


def _args(**kw):
    base = dict(grid=None, count=pb.DEFAULT_COUNT, cell=[], max_docs=bench_grid.MAX_DOCS,
                max_doc_bytes=bench_grid.MAX_DOC_BYTES)
    return argparse.Namespace(**{**base, **kw})


# ---- cells ----

@pytest.mark.parametrize("kind", ["json", "csv"])
def test_lowest_packed_multi_query_cells_first(grid_files, kind):
    path = grid_files[0] if kind == "json" else grid_files[1]
    rows, ceilings = pb.read_grid(path)
    assert ceilings == (CEILINGS if kind == "json" else {})
    cells = pb.lowest_cells(rows, count=3)
    assert [(c.B, c.Lq) for c, _ in cells] == [(4, 33), (32, 8), (16, 16)]
    assert all(c.layout == "packed" and c.dist == "lognormal-70" and c.N == 100_000 and c.d == 128
               for c, _ in cells)
    assert [row["pct_roof"] for _, row in cells] == [33.5, 37.0, 37.3]
    assert cells[0][0].name == cells[0][1]["shape"]  # the grid's own cell
    everything = pb.lowest_cells(rows, count=100)
    assert [(c.B, c.Lq) for c, _ in everything] == [(4, 33), (32, 8), (16, 16), (4, 1)]


def test_select_cells_from_the_grid_or_the_command_line(grid_files):
    json_path, _ = grid_files
    cells = pb.select_cells(_args(grid=str(json_path), count=2, max_docs=7))
    assert [(c.B, c.Lq, c.N) for c, _ in cells] == [(4, 33, 7), (32, 8, 7)]
    given = pb.select_cells(_args(grid=str(json_path), cell=["16,31,96,bf16,heavy-512"]))
    assert [(c.key, row) for c, row in given] == [((16, 31, 96, "bf16", "packed", "heavy-512"), None)]
    with pytest.raises(ValueError, match="--grid"):
        pb.select_cells(_args())


def test_parse_cell_sizes_as_the_grid_does():
    cell = pb.parse_cell("4,33,128,fp16,lognormal-70")
    assert cell.key == (4, 33, 128, "fp16", "packed", "lognormal-70")
    assert cell.N == bench_grid.num_docs("lognormal-70", 128, "fp16", bench_grid.Sizing()) == 100_000
    small = pb.parse_cell("8,16,768,bf16,heavy-512", bench_grid.Sizing(max_docs=5))
    assert small.N == 5
    for bad, match in (("4,33,128,fp16", "B,Lq,d,dtype,lengths"), ("4,x,128,fp16,lognormal-70", "integers"),
                       ("4,33,128,fp8,lognormal-70", "dtype"), ("4,33,128,fp16,zipf", "dist"),
                       ("0,33,128,fp16,lognormal-70", ">= 1")):
        with pytest.raises(ValueError, match=match):
            pb.parse_cell(bad)


# ---- arithmetic ----

def test_arithmetic_matches_a_hand_computation():
    # 4 queries of 8 tokens, d = 16, two documents of 3 and 7 tokens (T = 10), fp16.
    cell = bench_grid.Cell(4, 8, 16, "fp16", "packed", "lognormal-30", 2)
    x = bench.Inputs(Q=torch.zeros(4, 8, 16, dtype=torch.float16),
                     D_packed=torch.zeros(10, 16, dtype=torch.float16),
                     offsets=torch.tensor([0, 3, 10]), lengths=torch.tensor([3, 7]))
    work = pb.arithmetic(cell, x, CEILINGS, launches=2)
    flops = 2 * 4 * 8 * 10 * 16  # 10,240
    doc_bytes, q_bytes = 10 * 16 * 2, 4 * 8 * 16 * 2  # 320 + 1,024
    assert work["flops"] == flops and work["tokens"] == 10
    assert work["bytes"] == doc_bytes + q_bytes == 1344 and work["doc_bytes"] == doc_bytes
    assert work["intensity"] == pytest.approx(10240 / 1344)
    assert work["ridge"] == pytest.approx(100e12 / 1000e9)
    assert work["read_floor_ms"] == pytest.approx(1344 / 1e12 * 1e3)
    assert work["tensor_floor_ms"] == pytest.approx(10240 / 100e12 * 1e3)
    assert work["read_floor_all_launches_ms"] == pytest.approx((2 * 320 + 1024) / 1e12 * 1e3)
    assert work["roofline"] == "read" and work["launches"] == 2
    bare = pb.arithmetic(cell, x, {})
    assert bare["ridge"] is bare["read_floor_ms"] is bare["tensor_floor_ms"] is bare["roofline"] is None


TINY = bench_grid.Cell(4, 33, 32, "fp16", "packed", "lognormal-30", 3)


def test_a_timed_row_is_the_arithmetic_over_the_time(monkeypatch):
    calls = []

    def fake_time(fn):
        calls.append(fn)
        return (2.0, 1.9, 2.1)

    row = pb.time_cell(TINY, device="cpu", ceilings=CEILINGS, time_fn=fake_time,
                       grid_row={"pct_roof": 33.5, "ms": 1.263})
    assert row["status"] == "ok" and len(calls) == 1
    assert row["ms"] == 2.0 and row["max_rel_err"] <= 1e-3 and row["checked_docs"] == 3
    assert row["flops"] == 2 * 4 * 33 * row["tokens"] * 32
    assert row["tflops"] == pytest.approx(row["flops"] / 2.0 / 1e9)
    assert row["tbps"] == pytest.approx(row["bytes"] / 2.0 / 1e9)
    assert row["pct_bf16_peak"] == pytest.approx(100 * row["tflops"] / 100.0)
    assert row["pct_read_bw"] == pytest.approx(100 * row["gbps"] / 1000.0)
    floor = max(row["read_floor_ms"], row["tensor_floor_ms"])
    assert row["pct_roof"] == pytest.approx(100 * floor / 2.0)
    assert row["bound"] == {"read": "read", "tensor": "bf16_tensor"}[row["roofline"]]
    assert row["grid_pct_roof"] == 33.5 and row["launches"] == pb.predicted_launches(TINY)


# ---- the reference check on the CPU ----

def test_time_mode_checks_a_tiny_cell_untimed_on_the_cpu(tmp_path, capsys):
    rc = pb.main(["time", "--cell", "4,33,32,fp16,lognormal-30", "--cell", "16,8,16,bf16,uniform-1-300",
                  "--max-docs", "3", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "profile_batched.json").read_text())
    assert [r["status"] for r in doc["rows"]] == ["checked", "checked"]
    assert all(r["max_rel_err"] <= 1e-3 and r["checked_docs"] == 3 and r["ms"] is None
               for r in doc["rows"])
    assert doc["provenance"]["commit"] and doc["meta"]["device"] == "cpu"
    table = (tmp_path / "profile_batched.txt").read_text()
    assert "B=4 Lq=33 d=32 fp16 lognormal-30 N=3" in table and "checked" in table
    assert "B=4 Lq=33" in capsys.readouterr().out


def test_a_wrong_output_is_recorded_not_timed(monkeypatch):
    ours = bench_grid.provider_ours

    def wrong(cell, x):
        right = ours(cell, x)
        return lambda: right() + 1.0

    monkeypatch.setattr(pb.bench_grid, "provider_ours", wrong)
    row = pb.time_cell(TINY, device="cpu", ceilings=CEILINGS,
                       time_fn=lambda fn: pytest.fail("a wrong cell was timed"))
    assert row["status"] == "wrong" and row["ms"] is None and "float64 reference" in row["reason"]
    assert row["suite"] == pb.SUITE
    assert row["suite"] == pb.SUITE
    assert row["flops"] > 0  # its arithmetic is still there


# ---- launches ----

def test_kernel_filter_matches_exactly_the_scoring_kernels():
    names = pb.scoring_kernel_names()
    assert "_maxsim_dense_kernel" in names
    pattern = pb.kernel_filter()
    assert pattern.startswith("regex:")
    regex = re.compile(pattern[len("regex:"):])
    assert all(regex.search(n) for n in names)
    assert not any(regex.search(n) for n in ("_stats_kernel",
                                             "_maxsim_residual_kernel", "x_maxsim_dense_kernel"))


@pytest.mark.parametrize("B, Lq", [(4, 33), (4, 32), (16, 8), (1, 33)])
def test_predicted_launches_are_the_ops_launches(monkeypatch, B, Lq):
    """Counted by wrapping the scoring kernels the host function launches (the interpreter calls
    no launch hook)."""
    launched = []

    class Counting:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            launched.append(self.name)
            return self.kernel[grid]

    wrapped = 0
    for name in pb.scoring_kernel_names():
        if hasattr(dense_ops, name):
            monkeypatch.setattr(dense_ops, name, Counting(getattr(dense_ops, name), name))
            wrapped += 1
    assert wrapped
    cell = bench_grid.Cell(B, Lq, 16, "fp16", "packed", "lognormal-30", 2)
    x = bench_grid.make_inputs(cell, "cpu")
    bench_grid.provider_ours(cell, x)()
    assert len(launched) == pb.predicted_launches(cell) >= 1


def test_launches_counted_by_the_hook_else_predicted():
    import triton

    chain = getattr(getattr(triton, "knobs", None), "runtime", None)
    if not hasattr(getattr(chain, "launch_enter_hook", None), "add"):
        pytest.skip("this Triton has no launch hook chain")

    class Meta:
        def __init__(self, name):
            self.data = {"name": name}

    def launches():
        for name in ("_maxsim_dense_kernel", "_stats_kernel", "_maxsim_dense_kernel"):
            triton.knobs.runtime.launch_enter_hook(Meta(name))

    assert pb.counted_launches(launches, pb.scoring_kernel_names()) == 2
    assert pb.counted_launches(lambda: None, pb.scoring_kernel_names()) is None
    assert pb.scoring_launches(TINY, lambda: None) == (pb.predicted_launches(TINY), "predicted")
    assert not triton.knobs.runtime.launch_enter_hook.calls  # the hook was taken off


def test_launch_map_labels_results_in_order():
    launch_map = [{"cell": "A", "launches": 2}, {"cell": "W", "launches": 0}, {"cell": "B", "launches": 1}]
    labels, note = pb.label_launches([0, 1, 2], launch_map)
    assert labels == {0: ("A", 1, 2), 1: ("A", 2, 2), 2: ("B", 1, 1)} and note == ""
    labels, note = pb.label_launches([0, 1, 2, 3], launch_map)
    assert labels[3] == ("?", 1, 1) and "4 launches" in note
    assert pb.label_launches([5], None) == ({5: ("", 1, 1)}, "")


# ---- ncu ----

def test_ncu_command_profiles_the_profile_mode_of_the_same_cells(grid_files):
    json_path, _ = grid_files
    args = _args(grid=str(json_path), count=2)
    forwarded = [*pb.selection_args(args), "--out", "W"]
    command = pb.ncu_command("/opt/ncu", Path("W/ncu"), forwarded)
    assert command[0] == "/opt/ncu"
    text = " ".join(command)
    for flag in ("--clock-control none", "--profile-from-start off", "--replay-mode kernel",
                 f"-k {pb.kernel_filter()}", "-o W/ncu"):
        assert flag in text
    assert all(f"--section {s}" in text for s in pb.NCU_SECTIONS)
    tail = command[command.index(sys.executable):]
    assert tail[:4] == [sys.executable, "-m", "experiments.profile_batched", "profile"]
    assert tail[4:] == ["--grid", str(json_path), "--count", "2", "--out", "W"]
    assert pb.export_command("/opt/ncu", Path("W/ncu")) == [
        "/opt/ncu", "--import", "W/ncu.ncu-rep", "--csv", "--page", "details"]
    # The profile run ncu starts picks the same cells.
    profile_args = pb.build_parser().parse_args(tail[3:])
    assert profile_args.mode == "profile" and profile_args.out == "W"
    assert [c for c, _ in pb.select_cells(profile_args)] == [c for c, _ in pb.select_cells(args)]


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _line(rid, kernel, section, name, unit, value):
    return (f'"{rid}","677","python3.12","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(12500, 1, 1)",'
            f'"0","9.0","{section}","{name}","{unit}","{value}"')


SOL, CWA, MWA = "GPU Speed Of Light Throughput", "Compute Workload Analysis", "Memory Workload Analysis"
OCC, LAUNCH, WARP, CMD = "Occupancy", "Launch Statistics", "Warp State Statistics", "Command line profiler metrics"
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
PCT = ".avg.pct_of_peak_sustained_active"


def _launch(rid, kernel, *, duration, unit, sm, dram, l1, l2, tensor, l1_pipe, stalls):
    return [
        _line(rid, kernel, SOL, "Duration", unit, duration),
        _line(rid, kernel, SOL, "Elapsed Cycles", "cycle", "1,500,304"),
        _line(rid, kernel, SOL, "Memory Throughput", "%", max(dram, l1, l2)),
        _line(rid, kernel, SOL, "DRAM Throughput", "%", dram),
        _line(rid, kernel, SOL, "L1/TEX Cache Throughput", "%", l1),
        _line(rid, kernel, SOL, "L2 Cache Throughput", "%", l2),
        _line(rid, kernel, SOL, "Compute (SM) Throughput", "%", sm),
        _line(rid, kernel, CWA, "Issue Slots Busy", "%", "44.60"),
        _line(rid, kernel, MWA, "Memory Throughput", "Tbyte/s", "2.14"),
        _line(rid, kernel, MWA, "Local Memory Spilling Request Overhead", "%", "no data"),
        _line(rid, kernel, LAUNCH, "Registers Per Thread", "register/thread", "120"),
        _line(rid, kernel, LAUNCH, "Cluster Scheduling Policy", "", "PolicySpread"),
        _line(rid, kernel, LAUNCH, "Dynamic Shared Memory Per Block", "Kbyte/block", "57.34"),
        _line(rid, kernel, OCC, "Achieved Occupancy", "%", "24.61"),
        _line(rid, kernel, WARP, "Warp Cycles Per Issued Instruction", "cycle", "8.73"),
        _line(rid, kernel, WARP, "A Metric From A Later Nsight Compute", "widget", "3.5"),
        _line(rid, kernel, CMD, "sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active"
              + PCT, "%", tensor),
        _line(rid, kernel, CMD, "sm__pipe_alu_cycles_active" + PCT, "%", "50.64"),
        _line(rid, kernel, CMD, "l1tex__data_pipe_lsu_wavefronts" + PCT, "%", l1_pipe),
        _line(rid, kernel, CMD, "smsp__issue_active" + PCT, "%", "44.58"),
        *(_line(rid, kernel, CMD, STALL.format(reason), "inst", value) for reason, value in stalls),
    ]


STALLS_A = [("long_scoreboard", "3.10"), ("selected", "1"), ("barrier", "2.05"), ("wait", "0.90"),
            ("mio_throttle", "1.20"), ("gmma", "n/a")]
NCU_CSV = "\n".join([
    "==PROF== Connected to process 677 (/usr/bin/python3.12)",
    "cell 0: B=4 Lq=33 ...: ncu launches 0..1 (2 counted)",
    "==PROF== Profiling \"_maxsim_dense_kernel\" - 0: 0%....50%....100% - 38 passes",
    HEADER,
    *_launch(0, "_maxsim_dense_kernel", duration="840", unit="us", sm=50.64, dram=44.56, l1=78.19,
             l2=56.85, tensor=61.2, l1_pipe=90.6, stalls=STALLS_A),
    *_launch(1, "_maxsim_dense_kernel", duration="95.5", unit="usecond", sm=20.0, dram=70.0, l1=30.0,
             l2=40.0, tensor=5.0, l1_pipe=25.0, stalls=[("long_scoreboard", "9.5"), ("wait", "1.0")]),
    *_launch(2, "_maxsim_packed_slots_kernel", duration="6.38", unit="ms", sm=81.0, dram=10.0,
             l1=60.0, l2=30.0, tensor=72.5, l1_pipe=40.0, stalls=[("math_pipe_throttle", "4.0")]),
    "==PROF== Disconnected from process 677",
]) + "\n"
LAUNCH_MAP = [{"cell": "B=4 Lq=33 d=128 fp16 packed lognormal-70 N=100000", "launches": 2},
              {"cell": "B=32 Lq=8 d=128 fp16 packed lognormal-70 N=100000", "launches": 1}]


def test_ncu_csv_is_read_past_the_tools_output():
    results = pb.read_ncu_csv(NCU_CSV)
    assert list(results) == [0, 1, 2]
    assert results[2]["kernel"] == "_maxsim_packed_slots_kernel"
    assert results[0]["metrics"]["Memory Throughput"] == [(SOL, "%", "78.19"), (MWA, "Tbyte/s", "2.14")]
    assert results[0]["metrics"]["Elapsed Cycles"] == [(SOL, "cycle", "1,500,304")]
    assert pb.read_ncu_csv("==PROF== nothing was profiled\n") == {}


def test_summary_names_the_saturated_unit_and_skips_unknown_metrics():
    rows, note = pb.summarize_rows(pb.read_ncu_csv(NCU_CSV), LAUNCH_MAP)
    assert note == ""
    first, second, third = rows
    assert (first["shape"], first["launch"]) == (LAUNCH_MAP[0]["cell"], "1/2")
    assert (second["shape"], second["launch"], third["shape"]) == (LAUNCH_MAP[0]["cell"], "2/2",
                                                                   LAUNCH_MAP[1]["cell"])
    assert first["duration_us"] == 840 and second["duration_us"] == 95.5 and third["duration_us"] == 6380
    assert (first["sm_pct"], first["memory_pct"], first["dram_pct"]) == (50.64, 78.19, 44.56)
    assert (first["l1tex_pct"], first["l2_pct"], first["issue_busy_pct"]) == (78.19, 56.85, 44.60)
    assert first["registers"] == 120 and first["achieved_occupancy_pct"] == 24.61
    assert first["shared_kb_per_block"] == 57.34 and first["cycles_per_issue"] == 8.73
    assert first["tensor_pct"] == 61.2 and third["tensor_pct"] == 72.5
    # Issue slots' own metric is not a unit; "selected" is not a stall; "n/a" is no value.
    assert first["top_units"].startswith("l1tex__data_pipe_lsu_wavefronts 90.6")
    assert first["top_stalls"] == "long_scoreboard 3.10; barrier 2.05; mio_throttle 1.20"
    assert first["busiest"] == "l1tex__data_pipe_lsu_wavefronts 90.6 %"
    assert second["busiest"] == "DRAM 70.0 %" and third["busiest"] == "SM 81.0 %"
    assert "A Metric From A Later Nsight Compute" not in first and first["ipc"] is None
    table = pb.ncu_table(rows)
    assert table.count("\n") == len(rows) + 1 and "long_scoreboard 3.10" in table


def test_summarize_mode_writes_json_and_table(tmp_path, capsys):
    csv_path = tmp_path / "ncu.csv"
    csv_path.write_text(NCU_CSV)
    launches = harness.write_results(LAUNCH_MAP[:1], tmp_path, pb.LAUNCH_RESULT)
    assert pb.main(["summarize", str(csv_path), "--launches", str(launches), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "ncu_summary.json").read_text())
    assert [r["launch"] for r in doc["rows"]] == ["1/2", "2/2", "1/1"]
    assert doc["rows"][2]["shape"] == "?" and "3 launches" in doc["meta"]["note"]
    text = (tmp_path / "ncu_summary.txt").read_text()
    assert "note: the CSV has 3 launches, the launch map 2" in text
    assert "DRAM 70.0 %" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no ncu CSV"):
        pb.main(["summarize", str(tmp_path / "missing.csv"), "--out", str(tmp_path)])


def test_ncu_rows_without_rule_columns_are_read():
    """ncu ends a metric row that has no rule after "Metric Value" (a trailing comma), as in
    results/profile/h200-8ad62da-batched/ncu.csv.gz; rows with more fields than the header are
    skipped."""
    header = ('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value",'
              '"Rule Name","Rule Type","Rule Description"')
    text = "\n".join([
        header,
        '"0","_maxsim_dense_kernel","Command line profiler metrics",'
        '"l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_active","%","80.26",',
        '"0","_maxsim_dense_kernel","GPU Speed Of Light Throughput","Duration","us","802.3",'
        '"SOLBottleneck","OPT","a rule"',
        '"1","_maxsim_dense_kernel","S","Duration","us","1","r","t","d","extra"',
    ]) + "\n"
    results = pb.read_ncu_csv(text)
    assert list(results) == [0]
    metrics = results[0]["metrics"]
    assert metrics["l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_active"] == [
        ("Command line profiler metrics", "%", "80.26")]
    assert metrics["Duration"] == [("GPU Speed Of Light Throughput", "us", "802.3")]
