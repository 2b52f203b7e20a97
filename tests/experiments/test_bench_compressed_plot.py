"""bench_compressed --plot-from: the roofline redrawn from a written results file, no GPU."""

import json

from experiments import bench_compressed


def _row(provider, ms, tflops, gbps, suite=bench_compressed.SUITE):
    return {"suite": suite, "provider": provider, "ms": ms, "tflops": tflops, "gbps": gbps}


def test_plot_from_json_writes_the_roofline_beside_it(tmp_path):
    results = tmp_path / "bench_compressed.json"
    rows = [_row("tilemaxsim_residual", 0.43, 133.7, 713.0),
            _row("tilemaxsim_dense_decoded", 0.457, 125.8, 3934.0),
            _row("floor_read", 0.113, 0.0, 2493.0),  # no products: not a roofline point
            _row("other suite", 1.0, 1.0, 1.0, suite="elsewhere")]
    results.write_text(json.dumps({"rows": rows, "ceilings": {"read_gbps": 4232.7,
                                                              "bf16_tflops": 679.1}}))
    bench_compressed.main(["--plot-from", str(results)])
    png = tmp_path / "roofline_compressed.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_from_json_without_ceilings_draws_nothing(tmp_path, capsys):
    results = tmp_path / "bench_compressed.json"
    results.write_text(json.dumps({"rows": [], "ceilings": {}}))
    bench_compressed.main(["--plot-from", str(results)])
    assert "nothing to plot" in capsys.readouterr().out
    assert not (tmp_path / "roofline_compressed.png").exists()
