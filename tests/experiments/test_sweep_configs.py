"""The launch-config sweep (experiments/sweep_configs.py): its cells and candidate lists, and runs
on CPU under the interpreter: the smoke cells end to end, a failing config recorded as failed, a
wrong one as wrong (never timed), the budget and cell cap recorded as not_run, and the compile
workers."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from experiments import bench_grid as bg
from experiments import sweep_configs as sc
from tilemaxsim_plaid.ops import dense
from tilemaxsim_plaid.ops.dense import MaxSimConfig

TINY = bg.Sizing(max_docs=3, max_doc_bytes=1 << 20)
STATUSES = {"ok", "wrong", "failed", "not_run"}


# ---- cells and candidates ----

def test_weak_cells_are_grid_cells_in_priority_order():
    cells = sc.select_cells("weak")
    full = {c.key: c for c in bg.build_cells("full")}
    assert all(full[c.key] == c for c in cells), "named and sized as the grid does"
    assert len({c.key for c in cells}) == len(cells)
    assert cells[0].d == 144  # the weakest cell of the last grid first
    one_query = [c for c in cells if c.packed and c.B == 1]
    assert {c.Lq for c in one_query} >= {1, 8, 16, 17, 31, 33, 64}
    assert {c.d for c in one_query} >= {64, 96, 144, 384, 768}
    assert {c.dist for c in one_query} == set(bg.DISTRIBUTIONS)
    assert {c.B for c in cells if c.packed and c.B > 1} == {4, 32}
    assert {c.B for c in cells if not c.packed} == {1, 4}  # the padded controls, last
    assert all(not c.packed for c in cells[-2:])
    assert len(sc.select_cells("smoke")) == 2
    with pytest.raises(ValueError, match="cells"):
        sc.select_cells("all")


@pytest.mark.parametrize("cell", sc.select_cells("weak"), ids=lambda c: c.name)
def test_candidates_are_valid_configs_and_designed_not_a_product(cell):
    found = sc.candidates(cell)
    lo, hi = (5, 10) if not cell.packed else (16, 34)
    assert lo <= len(found) <= hi, len(found)
    assert len(set(found)) == len(found)
    for config in found:
        dense._check_config(config)  # every field within its rule
        chunks = -(-cell.d // (config.block_d or dense._block_d(cell.d)))
        if config.single_tile:
            assert chunks == 1, config
        if config.hold_query:
            assert chunks <= dense.MAX_HELD_CHUNKS, config
        if config.block_d is not None:  # never more masked columns than the default chunks
            default = dense._block_d(cell.d)
            assert chunks * config.block_d <= -(-cell.d // default) * default, config
    labels = [sc.label(c) for c in found]
    assert len(set(labels)) == len(labels), "a label names one config"


def test_candidates_cover_the_axes_the_issue_names():
    one = sc.candidates(sc.select_cells("weak")[-3])  # the headline: B = 1 packed, d = 128
    assert {c.block_t for c in one} >= {16, 32, 64}
    assert {c.num_warps for c in one} >= {1, 2, 4}
    assert {c.num_stages for c in one} >= {2, 3, 4}
    assert {c.docs_per_program for c in one} >= {1, 4, 16, 32}
    assert {c.hold_query for c in one} == {True, False}
    several = sc.candidates(next(c for c in sc.select_cells("weak") if c.packed and c.B == 32))
    assert {c.block_t for c in several} >= {32, 64, 128}
    assert {c.num_warps for c in several} == {4, 8} and {c.num_stages for c in several} == {2, 3}
    assert {c.slots for c in several} == {True, False}
    assert len({c.queries_per_block for c in several}) >= 3
    assert len({c.q_blocks_per_program for c in several}) >= 2
    for d, widths in ((96, {32}), (144, {16}), (384, {64, 32}), (768, {64})):
        cell = next(c for c in sc.select_cells("weak") if c.d == d)
        assert {c.block_d for c in sc.candidates(cell)} - {None} >= widths, d
        if cell.packed and cell.B == 1:  # the query held one tile per chunk, in every width
            assert {c.block_d for c in sc.candidates(cell) if c.hold_query} >= widths, d


def test_wide_cells_are_grid_cells_of_one_query_past_32_tokens():
    full = {c.key: c for c in bg.build_cells("full")}
    cells = sc.select_cells("wide")
    assert cells and all(full[c.key] == c for c in cells)
    assert all(c.packed and c.B == 1 and c.Lq > 32 for c in cells)
    for cell in cells:  # a 64-row block held over 4 warps among the candidates, every d
        assert any(c.hold_query and c.num_warps == 4 for c in sc.candidates(cell)), cell.name


def test_running_max_candidates_are_the_short_padded_cells_held_ones():
    """The running max is timed where it can gain, one-warp programs over short padded
    documents (whole tiles), labelled " rm"; not on packed cells (run 116: slower there)."""
    cells = sc.select_cells("wide") + sc.select_cells("multi") + sc.select_cells("fifth")
    assert {c.packed for c in cells} == {True, False}
    for cell in cells:
        twins = [c for c in sc.candidates(cell) if c.running_max]
        assert all(sc.label(c).endswith(" rm") and c.hold_query for c in twins), cell.name
        short_padded = not cell.packed and cell.B == 1 and bg.padded_length(cell.dist) <= 64
        assert bool(twins) == short_padded, cell.name


def test_fifth_cells_are_grid_cells_and_short_padded_ones_hold_the_query():
    full = {c.key: c for c in bg.build_cells("full")}
    cells = sc.select_cells("fifth")
    assert cells and all(full[c.key] == c for c in cells)
    short = [c for c in cells if not c.packed and bg.padded_length(c.dist) <= 64]
    assert short
    for cell in short:
        held = [c for c in sc.candidates(cell) if c.hold_query]
        assert max(c.docs_per_program for c in held) >= 16, cell.name


def test_default_rows_name_what_default_config_chose():
    cell = bg.Cell(1, 8, 64, "fp16", "packed", "lognormal-30", 5)
    x = bg.make_inputs(cell, "cpu")
    with_lengths = sc.chosen_default(cell, x, validate=True)
    assert with_lengths == dense.default_config(1, 8, int(x.lengths.max()), 64,
                                                variable_lengths=True, num_docs=5)
    several = bg.Cell(4, 32, 64, "fp16", "packed", "lognormal-30", 5)
    y = bg.make_inputs(several, "cpu")
    # Without validation the packed op does not know the longest document: no single tile.
    assert not sc.chosen_default(several, y, validate=False).single_tile


# ---- runs ----

def _rows(path):
    return json.loads(path.read_text())["rows"]


def test_smoke_end_to_end(tmp_path, capsys):
    """main() on the smoke cells, two candidates each: the default (validate True and False)
    and every candidate checked against the reference, then timed; rows and summary written."""
    out = tmp_path / "sweep"
    path = sc.main(["--device", "cpu", "--cells", "smoke", "--max-docs", "3", "--max-configs",
                    "2", "--budget", "600", "--out", str(out)])
    doc = json.loads(path.read_text())
    assert {"provenance", "ceilings", "meta", "rows"} <= set(doc)
    rows = doc["rows"]
    assert len(rows) == 2 * 4 and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        assert set(bg.ROW_KEYS) <= set(row)
        assert row["suite"] == sc.SUITE and row["max_rel_err"] <= 1e-3 and row["ms"] > 0
        assert {"B", "Lq", "d", "layout", "dist", "N", "validate", "config", "explicit",
                "cfg_block_t", "cfg_block_d", "speedup_vs_default", "first_call_s"} <= set(row)
    defaults = [r for r in rows if not r["explicit"]]
    assert [r["validate"] for r in defaults] == [True, False, True, False]
    assert all(r["speedup_vs_default"] > 0 for r in rows)
    assert sc.exit_status(path) == 0
    with open(out / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    printed = capsys.readouterr().out.rstrip().splitlines()
    summary = sc.summary(doc)
    assert summary[0].startswith("cells: 2 of 2 run")
    assert printed[-len(summary):] == summary  # the summary comes last
    table = summary[-2:]
    assert all(line.startswith(("B=1 Lq=8", "B=4 Lq=32")) for line in table)
    # The candidates are ranked within the classes default_config's rules separate.
    assert any(line.startswith("packed B=1: candidates") for line in summary)
    assert any(line.startswith("padded B>=4: candidates") for line in summary)


def _one_cell_plan(extra):
    def plan_fn(cell, max_configs=None):
        return sc.plan(cell, 1) + [(f"{bg.OURS} {sc.label(c)}", c, False) for c in extra]
    return plan_fn


def test_failing_and_wrong_configs_are_recorded_not_timed(tmp_path, capsys):
    """A config the op refuses at launch (a d chunk narrower than d with single_tile) is
    recorded as failed with its error; a call whose scores are wrong as wrong, loudly, and makes
    the exit status 1; neither is timed and the run goes on."""
    cell = sc.select_cells("smoke", TINY)[0]
    refused = MaxSimConfig(block_t=16, single_tile=True, block_d=16)
    wrong = MaxSimConfig(block_t=32, num_warps=2)

    def call_factory(cell, x, config, validate):
        fn = sc.make_call(cell, x, config, validate)
        return (lambda: fn() + 1.0) if config == wrong else fn

    timed = []
    path = sc.run([cell], tmp_path, ceilings={}, budget_s=1e9, device="cpu",
                  time_fn=lambda fn: timed.append(fn) or (1.0, 1.0, 1.0),
                  plan_fn=_one_cell_plan([refused, wrong]), call_factory=call_factory)
    rows = {r["config"]: r for r in _rows(path) if r["explicit"]}
    failed = rows[sc.label(refused)]
    assert failed["status"] == "failed" and failed["ms"] is None
    assert "ValueError" in failed["reason"] and "config.block_d" in failed["reason"]
    assert rows[sc.label(wrong)]["status"] == "wrong" and rows[sc.label(wrong)]["ms"] is None
    # The two defaults and the one good candidate, then the rematch of the validate=False
    # default and that candidate.
    assert len(timed) == 3 + 2 * sc.REMATCH_ROUNDS
    assert sc.exit_status(path) == 1
    text = "\n".join(sc.summary(json.loads(path.read_text())))
    assert f"WRONG {bg.OURS} {sc.label(wrong)}" in text and "[1 wrong]" in text
    assert f"failed {bg.OURS} {sc.label(refused)}" in text


def test_speedups_come_from_the_rematch_rounds(tmp_path):
    """A candidate that looked twice as fast in the single pass (timed later, on a cooler
    card, say) and is slower in the alternated rounds is ranked by the rounds."""
    cell = sc.select_cells("smoke", TINY)[0]
    extra = [MaxSimConfig(block_t=32, num_warps=2), MaxSimConfig(block_t=16, num_warps=1)]
    calls = []

    def call_factory(cell, x, config, validate):
        fn = sc.make_call(cell, x, config, validate)
        fn.config = config
        return fn

    def time_fn(fn):
        calls.append(fn.config)
        single_pass = len(calls) <= 5  # the two defaults, the cell's first candidate, extra
        ms = 1.0 if fn.config is None else (0.5 if single_pass else 2.0)
        return ms, ms, ms

    path = sc.run([cell], tmp_path, ceilings={}, budget_s=1e9, device="cpu", time_fn=time_fn,
                  plan_fn=_one_cell_plan(extra), call_factory=call_factory)
    rows = {(r["config"], r["explicit"], r["validate"]): r for r in _rows(path)}
    default = next(r for (_, explicit, validate), r in rows.items() if not explicit and not validate)
    assert default["rematch_ms"] == [1.0] * sc.REMATCH_ROUNDS and default["ms_rematch"] == 1.0
    for config in extra:
        row = rows[(sc.label(config), True, False)]
        assert row["ms"] == 0.5 and row["ms_rematch"] == 2.0
        assert row["speedup_vs_default"] == 0.5
    assert len(calls) == 5 + (1 + sc.REMATCH_TOP) * sc.REMATCH_ROUNDS
    # The validate=True default is not rematched.
    assert not any("ms_rematch" in r for (_, e, v), r in rows.items() if not e and v)


class ManualClock:
    """Time moves only when a call is timed (ten seconds each): cuts that do not depend on the
    machine's speed."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def time_fn(self, fn):
        self.now += 10.0
        return 1.0, 1.0, 1.0


def test_budget_and_cell_cap_are_recorded(tmp_path):
    cells = sc.select_cells("smoke", TINY)
    # Cap: three timed calls per cell, then the cell's other calls are cut; the next cell runs.
    clock = ManualClock()
    path = sc.run(cells, tmp_path / "cap", ceilings={}, budget_s=1e9, cell_cap_s=25.0,
                  device="cpu", time_fn=clock.time_fn, clock=clock, max_configs=4)
    rows = _rows(path)
    assert len(rows) == 2 * 6, "every planned call has a row"
    for cell in cells:
        states = [r["status"] for r in rows if r["shape"] == cell.name]
        assert states == ["ok"] * 3 + ["not_run"] * 3
    assert {r["reason"] for r in rows if r["status"] == "not_run"} == {"cell cap spent"}
    # Budget: three timed calls, then the rest of the first cell and all of the second are cut.
    clock = ManualClock()
    path = sc.run(cells, tmp_path / "budget", ceilings={}, budget_s=25.0, device="cpu",
                  time_fn=clock.time_fn, clock=clock, max_configs=4)
    doc = json.loads(path.read_text())
    assert [r["status"] for r in doc["rows"]] == ["ok"] * 3 + ["not_run"] * 9
    assert {r["reason"] for r in doc["rows"][3:]} == {"time budget spent"}
    assert doc["meta"]["not_run"] == [cells[1].name] and doc["meta"]["cells_run"] == 1


def test_compile_workers_failures_are_recorded_from_there(tmp_path):
    """One spawned compile worker calls every planned call first; the one it saw fail is
    recorded with the worker's error and not launched again by the main process."""
    cell = sc.select_cells("smoke", TINY)[1]  # the padded one
    refused = MaxSimConfig(block_t=16, docs_per_program=2, slots=True)  # slots: packed only
    launched = []

    def call_factory(cell, x, config, validate):
        launched.append(config)
        return sc.make_call(cell, x, config, validate)

    path = sc.run([cell], tmp_path, ceilings={}, budget_s=600, compile_workers=1, device="cpu",
                  time_fn=lambda fn: (1.0, 1.0, 1.0), plan_fn=_one_cell_plan([refused]),
                  call_factory=call_factory)
    rows = {r["config"]: r for r in _rows(path) if r["explicit"]}
    failed = rows[sc.label(refused)]
    assert failed["status"] == "failed" and failed["reason"].startswith("in the compile worker")
    assert "config.slots" in failed["reason"]
    assert refused not in launched and len(launched) == 3
    assert all(r["status"] == "ok" for r in _rows(path) if r["config"] != sc.label(refused))


def test_dry_run_lists_cells_and_calls(capsys):
    assert sc.main(["--cells", "weak", "--dry-run"]) is None
    out = capsys.readouterr().out
    assert out.count("tilemaxsim default validate=False") == len(sc.select_cells("weak"))
    assert "bd16" in out and "slots" in out and "hold" in out


def test_cuda_needed_unless_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA"):
        sc.main(["--cells", "smoke", "--budget", "1"])


def test_stalled_compile_workers_are_stopped(monkeypatch):
    """A worker that finishes nothing in COMPILE_STALL_S is stopped and its jobs left to the
    main process (a pool never finishes the job of a worker that died)."""
    monkeypatch.setattr(sc, "COMPILE_STALL_S", 0.0)
    cell = sc.select_cells("smoke", TINY)[1]
    plans = {cell.name: sc.plan(cell, 1)}
    assert sc.precompile([cell], plans, workers=1, deadline=float("inf"), device="cpu") == {}
