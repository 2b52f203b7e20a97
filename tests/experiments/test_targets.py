"""experiments.targets: issue 25's targets read off small result files in the benchmarks' formats."""

import json
import os

from experiments import targets

H200 = {"gpu": "NVIDIA H200", "commit": "abcdef0123", "date": "2026-12-07T10:00:00+00:00"}
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "commit": "1234567890", "date": "2026-12-06T10:00:00+00:00"}


def grid_row(shape, B, layout, pct_read, pct_roof, peer, big=True, provider="tilemaxsim"):
    return {"shape": shape, "provider": provider, "status": "ok", "B": B, "layout": layout,
            "at_least_10mb": big, "pct_read_bw": pct_read, "pct_roof": pct_roof,
            "ratio_to_best_peer": peer}


def grid_doc(prov=H200, low_read=92.0, cells="full"):
    return {"provenance": prov, "meta": {"cells": cells}, "rows": [
        grid_row("B=1 Lq=32 d=128 fp16 packed lognormal-70 N=100000", 1, "packed", 98.0, 98.0, 1.01),
        grid_row("B=1 Lq=64 d=144 fp16 packed lognormal-70 N=100000", 1, "packed", low_read,
                 low_read, 1.2),
        grid_row("B=1 Lq=32 d=128 fp16 padded fixed-128 N=65536", 1, "padded", 80.0, 80.0, 1.0),
        grid_row("B=1 Lq=1 d=64 fp16 packed lognormal-70 N=900", 1, "packed", 40.0, 40.0, None,
                 big=False),  # under 10 MB: no read target, no peer
        grid_row("B=4 Lq=32 d=128 fp16 packed lognormal-70 N=100000", 4, "packed", 60.0, 72.0, 1.5),
        grid_row("B=4 Lq=32 d=128 fp16 packed lognormal-70 N=100000", 4, "packed", 60.0, 72.0, None,
                 provider="flash_maxsim"),
    ]}


def residual_doc(prov=H200, slow=1.0):
    rows = []
    for C in (65536, 262144):
        for nbits, ms in ((1, 0.40), (2, 0.30), (4, 0.35)):
            shape = f"1q N=100k C={C} nbits={nbits} d=128"
            rows.append({"shape": shape, "provider": "maxsim_residual validate=False", "ms": ms})
            rows.append({"shape": shape, "provider": "maxsim_residual",
                         "ms": ms * (slow if C == 262144 else 1.0)})
            if C == 65536:
                rows.append({"shape": shape, "provider": targets.DENSE_DECODED, "ms": 0.43})
    return {"provenance": prov, "rows": rows}


def validate_doc(prov=H200, worst=1.03, num_docs=100_000):
    def row(op, provider, baseline, ratio, loop):
        return {"op": op, "input": "all", "provider": provider, "baseline": baseline,
                "ratio_to_baseline": ratio, "loop_ratio_to_baseline": loop, "num_docs": num_docs}
    return {"provenance": prov, "rows": [
        row("maxsim_packed", "validate=False", "validate=False", 1.0, 1.0),
        row("maxsim_packed", "validate=True", "validate=False", 1.01, 1.02),
        row("maxsim_packed", "flash_maxsim", "validate=False", 0.9, 0.9),
        row("maxsim_pq", "inference tensors validate=False", "validate=False", 1.2, 1.2),
        row("maxsim_pq", "new batch validate=True", "new batch validate=False", 1.0, worst),
    ]}


RERANK_LOG = """== index: 1000000 documents, C = 262144, nbits = 2, d = 128
== 100000 candidates, products fp16x2: 0.9400 ms from Python, 0.9300 ms as a graph
GPU NVIDIA H200 | torch 2.11.0+cu130 | triton 3.6.0 | commit abcdef0123 | ceilings {}
"""


def by_name(found):
    return {t.name: t for t in found}


def test_grid_targets_count_the_cells_each_target_covers():
    got = by_name(targets.grid_targets(grid_doc(), "grid.json"))
    read = got["packed one query, read"]
    assert (read.met, read.measured) == (True, "2/2 cells")
    assert got["several queries"].met and got["several queries"].measured == "1/1 cells"
    assert got["against the peers"].measured == "4/4 cells"  # ours with a peer, any size
    low = by_name(targets.grid_targets(grid_doc(low_read=88.6), "grid.json"))
    read = low["packed one query, read"]
    assert read.met is False and "1/2 cells" in read.measured and "d=144" in read.measured
    assert "88.6 %" in read.measured and read.gpu == "H200" and read.commit == "abcdef0"


def test_cells_a_grid_left_unrun_keep_a_target_from_being_met():
    """A grid stopped by its budget stands for a target only on the cells it ran: none low and
    some unrun is not met (a table says not on every cell); a low cell is a miss either way."""
    doc = grid_doc()
    for row in doc["rows"][1:2] + doc["rows"][4:5]:  # a packed one-query cell, a B = 4 one
        row.update(status="not_run", pct_read_bw=None, pct_roof=None, ratio_to_best_peer=None)
    got = by_name(targets.grid_targets(doc, "grid.json"))
    read = got["packed one query, read"]
    assert (read.met, read.unrun, read.measured) == (None, 1, "1/1 cells, 1 not run")
    assert got["several queries"].met is None
    assert got["against the peers"].measured == "2/2 cells, 2 not run"
    doc["rows"][0]["pct_read_bw"] = 80.0
    read = by_name(targets.grid_targets(doc, "grid.json"))["packed one query, read"]
    assert read.met is False and "0/1 cells, 1 not run (lowest:" in read.measured
    lines = targets.table([targets.Target("packed one query, read", "asked",
                                          "1/1 cells, 1 not run", None, "H200", "abcdef0",
                                          "g.json", unrun=1)])
    assert "| not on every cell |" in lines[2]
    assert lines[-1].endswith("every source one H200 run at one commit: yes")


def test_a_cell_below_the_read_target_shows_a_read_of_its_bytes():
    doc = grid_doc(low_read=88.6)
    low = doc["rows"][1]
    low.update(size_read_bytes=384_000_000, size_read_pct=90.4)
    read = by_name(targets.grid_targets(doc, "grid.json"))["packed one query, read"]
    assert read.met is False  # the target is the ceiling's, whatever a read of the size reaches
    assert "88.6 % (a read of its 384 MB: 90.4 %)" in read.measured


def test_residual_targets_compare_c_and_the_decoded_dense_call():
    got = by_name(targets.residual_targets(residual_doc(), "r.json"))
    assert got["residual, C = 2^18"].met
    assert got["residual nbits 2 against dense"].measured == "C = 2^16 1.43x, C = 2^18 1.43x"
    assert got["residual nbits 2 against dense"].met  # 0.43 / 0.30 >= 1.3
    assert got["residual nbits 4 against dense"].met  # 0.43 / 0.35 >= 1.1
    slow = by_name(targets.residual_targets(residual_doc(slow=1.2), "r.json"))
    assert slow["residual, C = 2^18"].met is False
    assert "nbits 2 1.200x" in slow["residual, C = 2^18"].measured
    assert slow["residual nbits 2 against dense"].met is False  # 0.43 / 0.36 < 1.3
    empty = by_name(targets.residual_targets({"rows": []}, "r.json"))
    assert empty["residual, C = 2^18"].met is None


def test_validate_targets_judge_every_checked_way_by_both_ratios():
    ways = targets.checked_ways(validate_doc())
    assert [r["provider"] for r in ways] == ["validate=True", "new batch validate=True"]
    (ok,) = targets.validate_targets(validate_doc(), "v.json")
    assert ok.met and ok.measured.startswith("2/2 ways")
    (over,) = targets.validate_targets(validate_doc(worst=1.08), "v.json")
    assert over.met is False and "new batch validate=True" in over.measured
    assert "loop 1.080x" in over.measured


def test_rerank_target_needs_c_2_18_and_the_fast_products():
    (got,) = targets.rerank_targets(RERANK_LOG, "rerank.log")
    assert (got.met, got.measured, got.gpu, got.commit) == (True, "fp16x2, 0.940 ms", "H200",
                                                            "abcdef0")
    (slow,) = targets.rerank_targets(RERANK_LOG.replace("fp16x2: 0.94", "tf32x3: 0.94"), "r")
    assert slow.met is False
    (other_c,) = targets.rerank_targets(RERANK_LOG.replace("C = 262144", "C = 65536"), "r")
    assert other_c.met is None and "65536" in other_c.measured
    (none,) = targets.rerank_targets("", "")
    assert none.met is None and none.measured == "not measured"


def test_a_grid_split_over_calls_is_read_as_one_run(tmp_path):
    """The newest grid that continues earlier parts of its run (bench_grid --skip-done) is
    merged with them: their cells count as run; a part of another commit, or one it does not
    name, is left out."""
    first = grid_doc()
    for row in first["rows"][1:2]:
        row.update(status="not_run", pct_read_bw=None, pct_roof=None, ratio_to_best_peer=None)
    rest = grid_doc(prov={**H200, "date": "2026-12-07T11:00:00+00:00"}, low_read=95.0)
    rest["rows"] = rest["rows"][1:2]
    rest["meta"]["continues"] = [H200["date"]]
    other = grid_doc(prov={**H200, "commit": "fedcba9876"}, low_read=50.0)
    for name, doc in (("grid-full", first), ("grid-rest", rest), ("elsewhere", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "grid.json").write_text(json.dumps(doc))
    got = by_name(targets.collect([tmp_path], "H200"))
    read = got["packed one query, read"]
    assert (read.met, read.measured) == (True, "2/2 cells")
    assert read.source == f"{tmp_path}/grid-full/grid.json + {tmp_path}/grid-rest/grid.json"
    rest["meta"]["continues"] = ["2026-12-01T00:00:00+00:00"]  # a part it does not name
    (tmp_path / "grid-rest" / "grid.json").write_text(json.dumps(rest))
    read = by_name(targets.collect([tmp_path], "H200"))["packed one query, read"]
    assert read.measured == "1/1 cells" and read.source.endswith("grid-rest/grid.json")


def test_only_files_that_cover_a_target_stand_for_it(tmp_path):
    """A quick grid (a subset of cells) or a validate run at 2,000 documents (a host profile)
    newer than the full ones does not replace them; a log without its index line says so."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "grid.json").write_text(json.dumps(grid_doc(low_read=50.0)))
    (tmp_path / "full" / "validate.json").write_text(json.dumps(validate_doc(worst=1.2)))
    newer = {**H200, "date": "2026-12-08T00:00:00+00:00"}
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "grid.json").write_text(json.dumps(grid_doc(prov=newer, cells="quick")))
    (tmp_path / "quick" / "validate.json").write_text(
        json.dumps(validate_doc(prov=newer, num_docs=2000)))
    (tmp_path / "old.log").write_text(RERANK_LOG.splitlines()[1] + "\n")
    got = by_name(targets.collect([tmp_path]))
    assert got["packed one query, read"].met is False  # the full grid's 50 %
    assert got["validate=True"].met is False  # the 100k run's 1.2x
    assert "does not say C" in got["plugin rerank, C = 2^18"].measured


def test_the_table_says_whether_every_source_is_one_h200_run(tmp_path):
    run = tmp_path / "run"
    (run / "grid").mkdir(parents=True)
    (run / "grid" / "grid.json").write_text(json.dumps(grid_doc()))
    (run / "residual_scale.json").write_text(json.dumps(residual_doc()))
    (run / "validate.json").write_text(json.dumps(validate_doc()))
    (run / "rerank-c18.log").write_text(RERANK_LOG)
    out = tmp_path / "targets.md"
    lines = targets.main([str(run), "--out", str(out)])
    assert lines[-1] == "8 of 8 met; every source one H200 run at one commit: yes"
    text = out.read_text().splitlines()
    assert text[-len(lines):] == lines and text[0].startswith("# The kernel targets")
    assert f"`python -m experiments.targets {run} --out {out}`" in text[2]
    # An older H100 grid elsewhere: the newest of each kind is read, here still the H200's.
    old = tmp_path / "old"
    old.mkdir()
    (old / "grid.json").write_text(json.dumps(grid_doc(prov=H100, low_read=50.0)))
    assert targets.main([str(run), str(old)])[-1].endswith("yes")
    # One table per GPU name: the H100's has only its grid (and the H200's is unchanged).
    lines = targets.main([str(run), str(old), "--gpu", "H200", "H100"])
    assert lines[0] == "## H200" and "## H100" in lines
    h100 = lines[lines.index("## H100"):]
    assert "| packed one query, read |" in h100[4] and "| no | H100 80GB HBM3 |" in h100[4]
    assert h100[-1] == "2 of 8 met; every source one H200 run at one commit: no"
    # A residual file from an H100: not one H200 run.
    (run / "residual_scale.json").write_text(json.dumps(residual_doc(prov=H100)))
    assert targets.main([str(run)])[-1].endswith("at one commit: no")
    # Nothing found: every line not measured.
    lines = targets.main([str(tmp_path / "nothing")])
    assert lines[-1] == "0 of 8 met; every source one H200 run at one commit: no"
    assert sum("| not measured |" in line for line in lines) == 8


def test_the_newest_rerank_log_is_the_newest_run(tmp_path):
    """Logs carry no date: the run's provenance.json in a folder above says which is newest,
    whatever the files' times (a fresh checkout gives them all one)."""
    for name, date, ms in (("new", "2026-12-09T00:00:00Z", "0.81"),
                           ("old", "2026-12-01T00:00:00Z", "0.94")):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "provenance.json").write_text(json.dumps({"date": date}))
        (tmp_path / name / "sub" / "rerank.log").write_text(
            RERANK_LOG.replace("fp16x2: 0.94", f"fp16x2: {ms}"))
    (tmp_path / "undated.log").write_text(RERANK_LOG)
    os.utime(tmp_path / "old" / "sub" / "rerank.log", (2e9, 2e9))  # the newest file time
    got = by_name(targets.collect([tmp_path]))["plugin rerank, C = 2^18"]
    assert got.source.endswith("new/sub/rerank.log") and "0.810 ms" in got.measured


def test_a_whole_run_on_another_gpu_is_named(tmp_path):
    """Every target measured in one H100 run at one commit: not the H200 run the targets ask
    for, and the line says which run it is."""
    (tmp_path / "grid.json").write_text(json.dumps(grid_doc(prov=H100)))
    (tmp_path / "residual_scale.json").write_text(json.dumps(residual_doc(prov=H100)))
    (tmp_path / "validate.json").write_text(json.dumps(validate_doc(prov=H100)))
    (tmp_path / "rerank.log").write_text(
        RERANK_LOG.replace("NVIDIA H200", "NVIDIA H100 80GB HBM3").replace("abcdef0123",
                                                                            "1234567890"))
    assert targets.main([str(tmp_path)])[-1] == (
        "8 of 8 met; every source one H200 run at one commit: no "
        "(every source one H100 80GB HBM3 run at 1234567)")
