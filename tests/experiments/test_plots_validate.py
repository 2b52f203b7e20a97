"""plots_validate: the host-bound points of a bench_validate result file and their plot."""

import json

import pytest

from experiments import plots_validate as pv


def rows(host_ms=True):
    """Two inputs of one op: a baseline and the ways timed against it."""
    def row(inp, way, base, ms, host, loop_ratio):
        r = {"op": "maxsim_pq", "input": inp, "provider": way, "baseline": base, "ms": ms,
             "loop_ratio_to_baseline": loop_ratio}
        if host_ms:
            r["host_ms"] = host
        return r
    return [row("all", "validate=False", "validate=False", 0.2, 0.08, 1.0),
            row("all", "validate=True", "validate=False", 0.2, 0.1, 1.002),
            row("all", "flash_maxsim", "validate=False", 0.19, 0.05, 0.99),
            row("pids", "new pids validate=False", "new pids validate=False", 0.25, 0.09, 1.0),
            row("pids", "new pids validate=True", "new pids validate=False", 0.26, 0.5, 1.9)]


def test_points_are_each_checked_way_against_its_baseline():
    points = pv.host_bound_points({"rows": rows()})
    assert [(p["input"], p["way"]) for p in points] == [("all", "validate=True"),
                                                        ("pids", "new pids validate=True")]
    assert points[0]["x"] == pytest.approx(0.1 / 0.2) and points[0]["ratio"] == 1.002
    assert points[1]["x"] == pytest.approx(0.5 / 0.25) and points[1]["ratio"] == 1.9
    assert pv.host_bound_points({"rows": rows(host_ms=False)}) == []


def test_plot_of_files_with_and_without_host_ms(tmp_path, capsys):
    new, old = tmp_path / "a" / "validate.json", tmp_path / "b" / "validate.json"
    for path, with_host in ((new, True), (old, False)):
        path.parent.mkdir()
        path.write_text(json.dumps({"provenance": {"gpu": "NVIDIA H100", "commit": "abc1234x"},
                                    "rows": rows(with_host)}))
    out = tmp_path / "plot.png"
    pv.main([str(new), str(old), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{old}: no host_ms" in capsys.readouterr().out
    assert pv.plot_host_bound([old], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
