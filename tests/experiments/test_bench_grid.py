"""The shape-grid benchmark (experiments/bench_grid.py): its cells, sizing, budget cut, result
schema and plots, and one end-to-end run on CPU (our kernels under the interpreter; the peers
are GPU-only and absent here)."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from experiments import bench_grid as bg
from experiments import harness, plots_grid

TINY = bg.Sizing(max_docs=3, max_doc_bytes=1 << 20)
STATUSES = {"ok", "absent", "unsupported", "wrong", "failed", "not_run"}


def _values(cells, attr):
    return {getattr(c, attr) for c in cells}


# ---- cells ----

def test_full_cells_cover_the_issue_axes():
    cells = bg.build_cells("full")
    keys = ("B", "Lq", "d", "dtype", "layout", "dist")
    assert cells[0].key == tuple(bg.HEADLINE[k] for k in keys)
    assert cells[0].N == 100_000 and "headline" in cells[0].groups
    assert len({c.key for c in cells}) == len(cells), "a cell listed twice"
    lqs = _values(cells, "Lq")
    assert {1, 2, 3, 16, 17, 31, 32, 33, 63, 64} <= lqs and lqs <= set(range(1, 65))
    assert _values(cells, "B") == {1, 4, 16, 32}
    dims = _values(cells, "d")
    assert {64, 768} <= dims and len(dims) >= 9
    assert all(d % 16 == 0 and 64 <= d <= 768 for d in dims)
    assert {96, 144, 384} <= dims  # not multiples of 128
    assert _values(cells, "dtype") == {"fp16", "bf16"}
    assert _values(cells, "layout") == {"packed", "padded"}
    packed = [c for c in cells if c.packed]
    assert _values(packed, "dist") == set(bg.DISTRIBUTIONS)
    assert all(c.dist.startswith("fixed-") for c in cells if not c.packed)
    # Sweeps and grids, not the cartesian product of the axes.
    product = 4 * len(lqs) * len(dims) * 2 * (len(bg.DISTRIBUTIONS) + 1)
    assert len(cells) < product / 20


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_every_grid_is_complete(mode):
    cells = bg.build_cells(mode)
    for name, spec in bg.grid_specs(mode).items():
        members = [c for c in cells if name in c.groups]
        assert len(members) == len(spec["x_values"]) * len(spec["y_values"]), name
        coords = {(getattr(c, spec["y"]), getattr(c, spec["x"])) for c in members}
        assert coords == {(y, x) for y in spec["y_values"] for x in spec["x_values"]}
        for c in members:
            for key, value in spec["fixed"].items():
                if value is not None:
                    assert getattr(c, key) == value, (name, c.name, key)


def test_quick_is_a_smaller_subset_of_full():
    quick, full = bg.build_cells("quick"), bg.build_cells("full")
    assert {c.key for c in quick} < {c.key for c in full}
    assert len(quick) < len(full) / 2
    assert quick[0].key == full[0].key
    with pytest.raises(ValueError, match="cells"):
        bg.build_cells("huge")


def test_groups_select_cells_for_a_split_run():
    full = bg.build_cells("full")
    part = bg.build_cells("full", groups=["grid_Lq_d", "sweep_B"])
    assert part and all({"grid_Lq_d", "sweep_B"} & set(c.groups) for c in part)
    assert [c for c in full if {"grid_Lq_d", "sweep_B"} & set(c.groups)] == part
    with pytest.raises(ValueError, match="grid_nope"):
        bg.build_cells("full", groups=["grid_nope"])


def test_sizing_rule():
    """100k documents, fewer where they would pass 2 GiB; every cell >= 10 MB of documents."""
    for cell in bg.build_cells("full"):
        size = cell.estimated_doc_bytes()
        assert bg.TARGET_DOC_BYTES <= size <= bg.MAX_DOC_BYTES * 1.001, cell.name
        assert cell.N <= bg.MAX_DOCS
        if cell.N < bg.MAX_DOCS:
            assert size > bg.MAX_DOC_BYTES * 0.99, cell.name  # cut only by the byte cap
    big = [c for c in bg.build_cells("full") if c.d == 768 and c.dist == "lognormal-150"]
    assert big and all(c.N < bg.MAX_DOCS for c in big)


def test_ten_megabyte_flag_follows_the_documents():
    tiny = bg.build_cells("quick", TINY)[0]
    assert tiny.N == 3
    row = bg.status_row(tiny, bg.OURS, "not_run")
    assert row["at_least_10mb"] is False
    headline = bg.build_cells("quick")[0]
    assert bg.status_row(headline, bg.OURS, "not_run")["at_least_10mb"] is True


def test_length_distributions():
    for name, mean in (("lognormal-30", 30), ("lognormal-70", 70), ("lognormal-150", 150)):
        assert abs(bg.mean_length(name) - mean) < 0.05 * mean, name
    uniform = bg.sample_lengths("uniform-1-300", 20_000)
    assert int(uniform.min()) == 1 and int(uniform.max()) == 300
    heavy = bg.sample_lengths("heavy-512", 20_000)
    assert int(heavy.min()) >= 1 and int(heavy.max()) == 512 and (heavy == 512).sum() > 20
    assert bool((bg.sample_lengths("fixed-180", 5) == 180).all())
    with pytest.raises(ValueError, match="dist"):
        bg.sample_lengths("zipf", 5)


def test_check_subset_includes_the_longest_document():
    cell = bg.Cell(1, 4, 64, "fp16", "packed", "heavy-512", 2000)
    x = bg.make_inputs(cell, "cpu")
    ids = bg.check_subset(cell, x)
    assert int(x.lengths[ids].max()) == int(x.lengths.max())
    assert len(set(ids.tolist())) == len(ids) <= bg.CHECK_DOCS


# ---- budget ----

class FakeClock:
    """Each call advances one second: the budget test does not depend on the machine's speed."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def _scores(cell, x):
    from tilemaxsim_plaid import reference

    Q = x.Q[0] if cell.B == 1 else x.Q
    if cell.packed:
        return reference.maxsim_packed(Q, x.D_packed, x.offsets).float()
    return reference.maxsim_padded(Q, x.D).float()


def _exact(cell, x):
    return lambda: _scores(cell, x)


def test_budget_cut_is_recorded(tmp_path):
    cells = bg.build_cells("quick", TINY)
    providers = {"exact": _exact}
    path = bg.run(cells, providers, tmp_path, ceilings={}, budget_s=8.0, device="cpu",
                  time_fn=lambda fn: (1.0, 1.0, 1.0), clock=FakeClock())
    doc = json.loads(path.read_text())
    run = [r for r in doc["rows"] if r["status"] == "ok"]
    cut = [r for r in doc["rows"] if r["status"] == "not_run"]
    assert run and cut
    assert len({r["shape"] for r in doc["rows"]}) == len(cells), "a cell was silently lost"
    assert doc["meta"]["not_run"] == [c.name for c in cells[len({r['shape'] for r in run}):]]
    assert doc["meta"]["cells_run"] + len(doc["meta"]["not_run"]) == len(cells)
    assert all(r["reason"] == "time budget spent" for r in cut)


def test_a_killed_run_names_the_cells_it_did_not_run(tmp_path):
    """The file written after each cell lists the cells still to run, in its meta and as
    not_run rows, so a run killed at the device's wall-clock limit does not lose them silently
    (the targets read off it count them as not run)."""
    cells = bg.build_cells("quick", TINY)[:4]
    calls = []

    def time_fn(fn):
        calls.append(fn)
        if len(calls) == bg.ROUNDS + 1:
            raise KeyboardInterrupt  # what a kill looks like from inside: not an Exception
        return 1.0, 1.0, 1.0

    with pytest.raises(KeyboardInterrupt):
        bg.run(cells, {"exact": _exact}, tmp_path, ceilings={}, budget_s=1e9, device="cpu",
               time_fn=time_fn)
    doc = json.loads((tmp_path / "grid.json").read_text())
    assert doc["meta"]["cells_run"] == 1
    assert doc["meta"]["not_run"] == [c.name for c in cells[1:]]
    assert [(r["shape"], r["status"]) for r in doc["rows"]] == [
        (cells[0].name, "ok"), *((c.name, "not_run") for c in cells[1:])]


def test_wrong_and_failing_providers_are_recorded_not_timed(tmp_path):
    def wrong(cell, x):
        return lambda: _scores(cell, x) + 1.0

    def broken(cell, x):
        def fn():
            raise RuntimeError("no kernel for this shape")
        return fn

    timed = []
    cell = bg.build_cells("quick", TINY)[0]
    path = bg.run([cell], {"exact": _exact, "wrong": wrong, "broken": broken}, tmp_path,
                  ceilings={}, budget_s=1e9, device="cpu",
                  time_fn=lambda fn: timed.append(fn) or (1.0, 1.0, 1.0))
    rows = {r["provider"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["exact"]["status"] == "ok"
    assert rows["wrong"]["status"] == "wrong" and rows["wrong"]["ms"] is None
    assert rows["broken"]["status"] == "failed" and "no kernel" in rows["broken"]["reason"]
    assert len(timed) == bg.ROUNDS


def test_providers_are_timed_in_rotated_rounds(tmp_path):
    """Each round starts one provider further on, and a row's ms is the median of its rounds:
    a provider slowed only where it comes first is not reported at that round's time."""
    order = []

    def named(tag):
        def make(cell, x):
            fn = lambda: _scores(cell, x)  # noqa: E731
            fn.tag = tag
            return fn
        return make

    def time_fn(fn):
        first = not order or len(order) % 3 == 0
        order.append(fn.tag)
        ms = 5.0 if first and fn.tag == "a" else {"a": 1.0, "b": 2.0, "c": 3.0}[fn.tag]
        return ms, ms * 0.9, ms * 1.1

    cell = bg.build_cells("quick", TINY)[0]
    path = bg.run([cell], {"a": named("a"), "b": named("b"), "c": named("c")}, tmp_path,
                  ceilings={}, budget_s=1e9, device="cpu", time_fn=time_fn)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"][:3 * bg.ROUNDS]
    rows = {r["provider"]: r for r in json.loads(path.read_text())["rows"]}
    assert [r["provider"] for r in json.loads(path.read_text())["rows"]] == ["a", "b", "c"]
    assert rows["a"]["round_ms"] == [5.0, 1.0, 1.0]
    assert rows["a"]["ms"] == 1.0 and rows["a"]["ms_p20"] == pytest.approx(0.9)
    assert rows["b"]["ms"] == 2.0 and rows["c"]["ms_p80"] == pytest.approx(3.3)


def test_a_provider_failing_in_a_later_round_is_recorded_failed(tmp_path):
    calls = []

    def time_fn(fn):
        calls.append(fn)
        if getattr(fn, "flaky", False) and sum(getattr(c, "flaky", False) for c in calls) == 2:
            raise RuntimeError("launch failed in round 2")
        return 1.0, 1.0, 1.0

    def flaky(cell, x):
        fn = lambda: _scores(cell, x)  # noqa: E731
        fn.flaky = True
        return fn

    cell = bg.build_cells("quick", TINY)[0]
    path = bg.run([cell], {"exact": _exact, "flaky": flaky}, tmp_path, ceilings={},
                  budget_s=1e9, device="cpu", time_fn=time_fn)
    rows = json.loads(path.read_text())["rows"]
    assert [(r["provider"], r["status"]) for r in rows] == [("exact", "ok"), ("flaky", "failed")]
    assert "round 2" in rows[1]["reason"] and rows[1]["ms"] is None
    assert len(rows[0]["round_ms"]) == bg.ROUNDS


def test_one_query_cells_time_a_read_of_their_bytes(tmp_path, monkeypatch):
    """The first one-query cell of a document size times a read of the cell's bytes in the same
    rotated rounds as the providers; the rows of every one-query cell of that size carry its
    median and the % of the read ceiling it reaches, and no row is written for it. Cells of
    several queries carry none; a read that fails leaves the cells without it."""
    monkeypatch.setattr(bg, "times_size_read", lambda cell, x: cell.B == 1)
    made = []
    real = bg.same_size_read

    def same_size_read(nbytes, device):
        made.append(nbytes)
        fn = real(nbytes, device)
        fn.tag = "read"
        return fn

    monkeypatch.setattr(bg, "same_size_read", same_size_read)
    order = []

    def time_fn(fn):
        tag = getattr(fn, "tag", "provider")
        order.append(tag)
        ms = {"read": [4.0, 2.0, 3.0][order.count("read") - 1], "provider": 5.0}[tag]
        return ms, ms, ms

    cells = bg.build_cells("quick", TINY)
    one = cells[0]
    same_docs = next(c for c in cells[1:] if c.B == 1 and (c.d, c.dist, c.layout, c.dtype)
                     == (one.d, one.dist, one.layout, one.dtype))
    several = next(c for c in cells if c.B >= 4)
    assert one.B == 1 and same_docs.Lq != one.Lq
    ceilings = {"read_gbps": 1.0, "bf16_tflops": 1.0}
    path = bg.run([one, same_docs, several], {"exact": _exact}, tmp_path, ceilings=ceilings,
                  budget_s=1e9, device="cpu", time_fn=time_fn)
    rows = json.loads(path.read_text())["rows"]
    assert [(r["provider"], r["B"]) for r in rows] == [("exact", 1), ("exact", 1),
                                                       ("exact", several.B)]
    assert order.count("read") == bg.ROUNDS and order[:2 * bg.ROUNDS].count("read") == bg.ROUNDS
    assert order[:4] == ["read", "provider", "provider", "read"]  # rotated rounds
    assert made == [rows[0]["bytes"]] and rows[0]["doc_bytes"] == rows[1]["doc_bytes"]
    for row in rows[:2]:
        assert row["size_read_ms"] == 3.0  # the median of its rounds
        assert row["size_read_bytes"] == rows[0]["bytes"]
        assert row["size_read_pct"] == pytest.approx(100.0 * rows[0]["bytes"] / 3.0 / 1e6)
    assert "size_read_ms" not in rows[2]

    def failing(fn):
        if getattr(fn, "tag", "") == "read":
            raise RuntimeError("out of memory")
        return 1.0, 1.0, 1.0

    path = bg.run([one], {"exact": _exact}, tmp_path / "failed", ceilings=ceilings,
                  budget_s=1e9, device="cpu", time_fn=failing)
    rows = json.loads(path.read_text())["rows"]
    assert [(r["provider"], r["status"]) for r in rows] == [("exact", "ok")]
    assert "size_read_ms" not in rows[0]


def test_same_size_read_reads_the_bytes(monkeypatch):
    made = []
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(empty(*a, **k)) or made[-1])
    fn = bg.same_size_read(1000, "cpu")
    assert len(made) == 1 and made[0].numel() * made[0].element_size() == 1000
    assert fn().dtype == torch.float32


# ---- derived columns ----

def test_annotate_bound_roof_and_peer_ratio():
    ceilings = {"read_gbps": 1000.0, "bf16_tflops": 100.0}
    cell = bg.build_cells("quick")[0]
    fields = dict(status="ok")
    read_bound = [
        harness.make_row(bg.SUITE, cell.name, bg.OURS, (1.0, 1.0, 1.0), num_docs=1, nbytes=int(5e8),
                         flops=1e9, ceilings=ceilings, **fields),
        harness.make_row(bg.SUITE, cell.name, "flash_maxsim", (2.0, 2.0, 2.0), num_docs=1,
                         nbytes=int(5e8), flops=1e9, ceilings=ceilings, **fields),
        harness.make_row(bg.SUITE, cell.name, "late_interaction_kernels", (4.0, 4.0, 4.0),
                         num_docs=1, nbytes=int(5e8), flops=1e9, ceilings=ceilings, **fields),
    ]
    bg.annotate(read_bound, ceilings)
    ours = read_bound[0]
    assert ours["bound"] == "read" and ours["pct_roof"] == pytest.approx(50.0)
    assert ours["best_peer"] == "flash_maxsim" and ours["ratio_to_best_peer"] == pytest.approx(2.0)
    tensor_bound = [harness.make_row(bg.SUITE, "x", bg.OURS, (2.0, 2.0, 2.0), num_docs=1,
                                     nbytes=int(1e6), flops=1e11, ceilings=ceilings, **fields)]
    bg.annotate(tensor_bound, ceilings)
    assert tensor_bound[0]["bound"] == "bf16_tensor"
    assert tensor_bound[0]["pct_roof"] == pytest.approx(50.0)
    assert tensor_bound[0]["ratio_to_best_peer"] is None


# ---- end to end, schema, plots ----

def _tiny_cells():
    cells = bg.build_cells("quick", TINY)
    picks = [cells[0],  # the headline shape, packed fp16
             next(c for c in cells if c.packed and c.Lq == 33 and c.dtype == "bf16"),
             next(c for c in cells if not c.packed and c.B == 4)]
    return picks


def test_end_to_end(tmp_path, monkeypatch, capsys, device):
    """main() on three tiny cells: our public ops (validate=True, config=None; on CPU under the
    interpreter), torch einsum on the padded cell, the peers (absent on CPU); every provider's
    output checked against the reference before it is timed."""
    tiny = _tiny_cells()
    monkeypatch.setattr(bg, "build_cells", lambda mode, sizing, groups: tiny)
    checked = []
    check = bg.bench.check_output
    monkeypatch.setattr(bg.bench, "check_output",
                        lambda name, *a: checked.append(name) or check(name, *a))
    out = tmp_path / "grid"
    path = bg.main(["--device", device.type, "--out", str(out), "--budget", "600", "--max-docs", "3",
                    "--providers", "tilemaxsim,torch_einsum,flash_maxsim,late_interaction_kernels"])
    doc = json.loads(path.read_text())
    assert {"provenance", "ceilings", "meta", "rows"} <= set(doc)
    assert set(doc["meta"]["grids"]) == set(bg.grid_specs("quick"))
    rows = doc["rows"]
    assert len(rows) == 3 * 4
    for row in rows:
        assert set(bg.ROW_KEYS) <= set(row)
        assert {"B", "Lq", "d", "dtype", "layout", "dist", "N", "groups", "doc_bytes",
                "at_least_10mb", "tokens", "Ld"} <= set(row)
        assert row["status"] in STATUSES
        assert row["at_least_10mb"] is False
    ours = [r for r in rows if r["provider"] == bg.OURS]
    assert [r["status"] for r in ours] == ["ok"] * 3
    assert all(r["max_rel_err"] <= 1e-3 and r["ms"] > 0 and r["checked_docs"] == 3 for r in ours)
    assert all(r["first_call_s"] > 0 for r in ours)
    einsum = {r["layout"]: r["status"] for r in rows if r["provider"] == "torch_einsum"}
    assert einsum == {"packed": "unsupported", "padded": "ok"}
    peers = {r["status"] for r in rows if r["provider"] in bg.PEERS}
    assert peers <= ({"absent", "failed"} if device.type == "cpu" else STATUSES)
    assert checked.count(bg.OURS) == 3 and checked.count("torch_einsum") == 1
    with open(out / "grid.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    printed = capsys.readouterr().out.rstrip().splitlines()
    summary = bg.summary(doc)
    assert summary[0] == "cells: 3 of 3 run; 0 not run (budget)"
    assert printed[-len(summary):] == summary  # the summary comes last


def test_main_with_no_budget_records_every_cell(tmp_path, capsys):
    path = bg.main(["--device", "cpu", "--cells", "quick", "--out", str(tmp_path), "--budget", "0",
                    "--providers", "tilemaxsim"])
    doc = json.loads(path.read_text())
    assert len(doc["meta"]["not_run"]) == len(bg.build_cells("quick")) == len(doc["rows"])
    assert {r["status"] for r in doc["rows"]} == {"not_run"}
    assert f"cells: 0 of {len(doc['rows'])} run" in capsys.readouterr().out


def test_unknown_provider_is_refused():
    with pytest.raises(SystemExit, match="unknown providers"):
        bg.main(["--device", "cpu", "--providers", "tilemaxsim,nope", "--dry-run"])


def _recorded_result(tmp_path):
    """A tiny result file as bench_grid writes it: the quick grids, ours and one peer, some cells
    not run."""
    ceilings = {"read_gbps": 4000.0, "bf16_tflops": 800.0}
    rows = []
    for i, cell in enumerate(bg.build_cells("quick")):
        if i % 5 == 4:
            rows += [bg.status_row(cell, p, "not_run", reason="time budget spent")
                     for p in (bg.OURS, "flash_maxsim")]
            continue
        nbytes = int(cell.estimated_doc_bytes())
        flops = 2.0 * cell.B * cell.Lq * nbytes / 2
        fields = bg.cell_fields(cell, None)
        group = [harness.make_row(bg.SUITE, cell.name, p, (ms, ms, ms), num_docs=cell.N,
                                  nbytes=nbytes, flops=flops, ceilings=ceilings, status="ok",
                                  **fields)
                 for p, ms in ((bg.OURS, 0.5 + 0.01 * i), ("flash_maxsim", 0.6))]
        bg.annotate(group, ceilings)
        rows += group
    meta = {"grids": bg.grid_specs("quick")}
    return harness.write_results(rows, tmp_path, "grid", ceilings=ceilings, meta=meta)


def test_plots_from_a_recorded_result(tmp_path):
    path = _recorded_result(tmp_path)
    out = tmp_path / "plots"
    plots_grid.main([str(path), "--out", str(out)])
    names = {p.name for p in out.iterdir()}
    for grid in bg.grid_specs("quick"):
        assert f"{grid}_pct_roof.png" in names and f"{grid}_ratio_to_best_peer.png" in names
    doc = json.loads(path.read_text())
    ys, xs, values, _ = plots_grid.grid_values(doc, "grid_Lq_d", "pct_roof")
    flat = [v for line in values for v in line]
    assert any(math.isnan(v) for v in flat) and not all(math.isnan(v) for v in flat)
    assert (len(ys), len(xs)) == (len(bg.AXES["quick"]["grid_Lq"]), len(bg.AXES["quick"]["grid_d"]))


def test_summary_counts_the_targets(tmp_path):
    doc = json.loads(_recorded_result(tmp_path).read_text())
    lines = bg.summary(doc)
    text = "\n".join(lines)
    assert "packed B=1 cells >= 10 MB at >= 90 % of the read ceiling:" in text
    assert ">= 1.0x the best peer" in text and "worst cells by % of roof" in text
    ours = [r for r in doc["rows"] if r["provider"] == bg.OURS and r["status"] == "ok"]
    line = next(x for x in lines if x.startswith("cells >= 10 MB at >= 1.0x"))
    assert line.endswith(f"{sum(r['ratio_to_best_peer'] >= 1 for r in ours)}/{len(ours)}")


def test_summary_sets_a_cell_below_the_read_target_beside_a_read_of_its_bytes():
    row = dict.fromkeys(bg.ROW_KEYS)
    row.update(shape="B=1 Lq=32 d=64 fp16 packed lognormal-30 N=100000", provider=bg.OURS,
               status="ok", B=1, layout="packed", at_least_10mb=True, pct_read_bw=88.9, ms=0.1413,
               size_read_bytes=384_000_000, size_read_pct=91.2)
    lines = bg.summary({"rows": [row]})
    assert ("   88.9 % B=1 Lq=32 d=64 fp16 packed lognormal-30 N=100000: a same-size read of "
            "its 384 MB 91.2 %") in lines


def test_inputs_match_the_cell():
    cell = bg.Cell(2, 5, 80, "bf16", "packed", "uniform-1-300", 7)
    x = bg.make_inputs(cell, "cpu")
    assert x.Q.shape == (2, 5, 80) and x.Q.dtype == torch.bfloat16
    assert x.D_packed.shape == (int(x.lengths.sum()), 80)
    assert int(x.offsets[-1]) == x.D_packed.shape[0]
    padded = bg.make_inputs(bg.Cell(1, 3, 64, "fp16", "padded", "fixed-9", 4), "cpu")
    assert padded.D.shape == (4, 9, 64) and padded.D.dtype == torch.float16


def test_split_run_skips_done_cells_and_merges(tmp_path, capsys):
    """A second call with --skip-done runs only what the first did not; --summary and the plots
    read both files as one."""
    first = _recorded_result(tmp_path / "a")
    doc = json.loads(first.read_text())
    done = {r["shape"] for r in doc["rows"] if r["status"] != "not_run"}
    second = bg.main(["--device", "cpu", "--cells", "quick", "--out", str(tmp_path / "b"),
                      "--budget", "0", "--providers", "tilemaxsim", "--skip-done", str(first)])
    left = {r["shape"] for r in json.loads(second.read_text())["rows"]}
    assert left == {c.name for c in bg.build_cells("quick")} - done
    merged = plots_grid.merge_results([first, second])
    assert {r["shape"] for r in merged["rows"]} == done | left
    ours = [r for r in merged["rows"] if r["provider"] == bg.OURS and r["shape"] in done]
    assert ours and all(r["status"] == "ok" for r in ours)  # a later not_run does not win
    capsys.readouterr()
    bg.main(["--summary", str(first), str(second)])
    assert capsys.readouterr().out.splitlines() == bg.summary(merged)


def test_skip_done_takes_folders_of_one_commit_and_names_what_it_continues(tmp_path,
                                                                            monkeypatch):
    """--skip-done takes a folder of parts (a device call's output, kept on the machine for the
    next); the later part records the dates of the parts it continues. A part measured at
    another commit, or a folder without one, is refused naming it, before anything runs."""
    first = _recorded_result(tmp_path / "parts" / "grid-full")
    date = json.loads(first.read_text())["provenance"]["date"]
    second = bg.main(["--device", "cpu", "--cells", "quick", "--out", str(tmp_path / "b"),
                      "--budget", "0", "--providers", "tilemaxsim", "--skip-done",
                      str(tmp_path / "parts"), "--no-plots"])
    meta = json.loads(second.read_text())["meta"]
    assert meta["continues"] == [date] and meta["skip_done"] == [str(tmp_path / "parts")]
    with pytest.raises(SystemExit, match="no grid result file"):
        bg.main(["--device", "cpu", "--cells", "quick", "--skip-done", str(tmp_path / "none"),
                 "--dry-run"])
    monkeypatch.setenv("TILEMAXSIM_COMMIT", "another")
    with pytest.raises(SystemExit, match="at commit .* this run is at another"):
        bg.main(["--device", "cpu", "--cells", "quick", "--skip-done", str(first), "--dry-run"])


def test_rounds_are_a_setting(tmp_path):
    """``--rounds`` sets the timing rounds a cell gets (recorded in meta); fewer than one is
    refused before anything runs."""
    timed = []
    cell = bg.build_cells("quick", TINY)[0]
    path = bg.run([cell], {"exact": _exact}, tmp_path, ceilings={}, budget_s=1e9, device="cpu",
                  time_fn=lambda fn: timed.append(fn) or (1.0, 1.0, 1.0), rounds=5)
    doc = json.loads(path.read_text())
    assert len(timed) == 5 and doc["meta"]["rounds"] == 5
    assert len(doc["rows"][0]["round_ms"]) == 5
    with pytest.raises(SystemExit):
        bg.main(["--rounds", "0", "--dry-run"])
