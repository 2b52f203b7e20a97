"""bench_validate on the CPU interpreter: every way of calling an op is checked against
validate=False and the float64 reference before it is timed, and each row carries its ratio
to validate=False (the timings themselves need a GPU)."""

import json

import pytest
import torch

from experiments import bench_validate as bv
from tilemaxsim_plaid.ops import checks


def test_rows_for_every_way_with_ratios(tmp_path, monkeypatch):
    monkeypatch.setattr(bv, "LOOP_CALLS", 1)
    # One interpreted call per timing: the interpreter's times are not what this test checks.
    monkeypatch.setattr(bv, "_timer", lambda device: lambda fn: (bv.loop_ms(fn, device, 1),) * 3)
    bv.main(["--ops", "packed", "--num-docs", "6", "--rounds", "1", "--device", "cpu",
             "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "validate.json").read_text())["rows"]
    ways = {(r["input"], r["provider"]) for r in rows}
    assert ways == {("all", "validate=False"), ("all", "validate=True"),
                    ("all", "inference tensors"), ("all", "inference tensors validate=False"),
                    ("all", "new documents validate=True"), ("all", "new documents validate=False"),
                    ("all", "new batch validate=True"), ("all", "new batch validate=False"),
                    ("pids", "validate=False"),
                    ("pids", "validate=True"), ("pids", "new pids validate=False"),
                    ("pids", "new pids validate=True")}
    for row in rows:
        assert row["ms"] > 0 and row["loop_ms"] > 0 and len(row["round_ms"]) == 1
        assert row["host_ms"] > 0 and row["round_host_ms"] == [row["host_ms"]]
        base = next(r for r in rows if r["input"] == row["input"] and r["provider"] == row["baseline"])
        new = next((w for w in ("new pids", "new documents", "new batch")
                    if row["provider"].startswith(w)), None)
        assert row["baseline"] == (f"{new} validate=False" if new else
                                   "inference tensors validate=False"
                                   if row["provider"] == "inference tensors" else "validate=False")
        assert row["ratio_to_baseline"] == pytest.approx(row["ms"] / base["ms"])
        assert row["loop_ratio_to_baseline"] == pytest.approx(row["loop_ms"] / base["loop_ms"])


def test_a_run_stopped_early_keeps_the_rounds_it_finished(tmp_path, monkeypatch):
    """The results are written after every round: a run killed in its second round (a device
    call's time limit) leaves the first round's rows."""
    monkeypatch.setattr(bv, "LOOP_CALLS", 1)
    calls = []

    class Stopped(Exception):
        pass

    def timer(device):
        def time(fn):
            calls.append(fn)
            if len(calls) > 12:  # packed has 12 ways: the second round's first call
                raise Stopped
            return (bv.loop_ms(fn, device, 1),) * 3
        return time

    monkeypatch.setattr(bv, "_timer", timer)
    with pytest.raises(Stopped):
        bv.main(["--ops", "packed", "--num-docs", "6", "--rounds", "3", "--device", "cpu",
                 "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "validate.json").read_text())
    assert doc["meta"]["rounds_done"] == 1 and doc["meta"]["rounds"] == 3
    assert len(doc["rows"]) == 12 and all(len(r["round_ms"]) == 1 for r in doc["rows"])
    with pytest.raises(SystemExit):
        bv.main(["--rounds", "0", "--device", "cpu", "--out", str(tmp_path)])


def test_a_way_that_scores_differently_is_refused():
    entry = bv.packed_inputs(5, torch.device("cpu"), torch.Generator().manual_seed(0))[1]
    good = entry["ways"]["new pids validate=True"]
    entry["ways"]["new pids validate=True"] = lambda: good() + 1e-3
    with pytest.raises(AssertionError, match="new pids"):
        bv.check(entry)


def test_new_pids_are_new_tensors_each_call():
    take = bv._pool(torch.arange(4))
    seen = {id(take()) for _ in range(bv.POOL)}
    assert len(seen) == bv.POOL > checks.MAX_CACHED_TENSORS


def test_profile_names_the_operators():
    ids = torch.arange(4)
    table = bv.profile(lambda: ids.clamp(0, 2), torch.device("cpu"), calls=2)
    assert "aten::clamp" in table


def test_host_profile_names_the_python_functions():
    def call_me():
        return sum(range(10))

    table = bv.host_profile(call_me, torch.device("cpu"), calls=3)
    assert "call_me" in table and "function calls" in table


def test_host_ms_times_each_call_alone_from_an_idle_device(monkeypatch):
    """host_ms synchronises before every call and times the call alone: the device's queue is
    drained before each call (outside the timed span), and one untimed call comes first."""
    events = []
    monkeypatch.setattr(bv.torch.cuda, "synchronize", lambda: events.append("sync"))
    ticks = iter(range(100))
    monkeypatch.setattr(bv.time, "perf_counter", lambda: float(next(ticks)))
    ms = bv.host_ms(lambda: events.append("call"), torch.device("cuda"), calls=3)
    assert events == ["call", "sync", "call", "sync", "call", "sync", "call", "sync"]
    assert ms == pytest.approx(1e3)  # one tick (second) a call
