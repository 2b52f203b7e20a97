"""Plots of the end-to-end PLAID benchmark, drawn only from the files it wrote.

    tilemaxsim plots-plaid RUN [RUN ...] [--out DIR]

Each RUN is a ``plaid.json`` or ``plaid.csv`` written by ``tilemaxsim bench-plaid``, or the folder
holding one; several runs of the same benchmark show how much the numbers move between runs.
Writes, into ``--out`` (default: beside the first run's file):

* ``search_latency.png``: whole ``Searcher.search(text)`` per index and k, stock colbert-ai
  against the plugin, one point per run, and the speedup against the 10x line;
* ``search_stages.png``: where the time goes in the first run: stock's stages, the plugin's same
  stages run eagerly, and the plugin as it runs (encoder graph, then the search graph), as means
  that add up to each row's mean encode + dense_search (runs that recorded them);
* ``rerank.png``: scoring time of a ``pids=`` rerank in the last run against the number of
  candidates for each way stage 4 multiplies, and stock colbert-ai's whole ``rank(pids=)`` where
  it was timed.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib

__all__ = ["load_run", "plot_search_latency", "search_stage_bars", "plot_search_stages",
           "rerank_line_style", "plot_rerank", "plot_all", "main"]

STOCK, PATCHED, PATCHED_EAGER = "colbert-ai", "tilemaxsim", "tilemaxsim-eager"
STAGES = ("encode", "candidates", "stages_2_3", "stage_4", "sort")
STAGE_LABELS = ("encode", "candidates (stage 1)", "stages 2-3", "stage 4", "sort")
STAGE_COLORS = ("#9467bd", "#1f77b4", "#ff7f0e", "#2ca02c", "#8c564b")
SYSTEM_COLORS = {STOCK: "#7f7f7f", PATCHED: "#d62728"}
PRODUCTS = ("tf32x3", "fp16x2", "fp16")
# Runs written before the "auto" default name no default_products: theirs was tf32x3.
DEFAULT_BEFORE_AUTO = "tf32x3"
TARGET_SPEEDUP = 10.0
# A line through fewer points shows no trend: fewer rerank sizes are drawn as points alone.
MIN_LINE_POINTS = 3


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def _save(plt, figure, path: pathlib.Path) -> pathlib.Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _csv_value(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return float(text)
    except ValueError:
        return text


def load_run(path) -> dict:
    """``{"name", "provenance", "rows"}`` of one benchmark run.

    Args:
        path: ``plaid.json``, ``plaid.csv`` (no provenance), or a folder holding either.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        found = [path / name for name in ("plaid.json", "plaid.csv") if (path / name).exists()]
        if not found:
            raise FileNotFoundError(f"{path}: no plaid.json or plaid.csv (written by tilemaxsim bench-plaid)")
        path = found[0]
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    name = path.parent.name if path.parent.name != "plaid" else path.parent.parent.name
    if path.suffix == ".json":
        doc = json.loads(path.read_text())
        if "rows" not in doc:
            raise ValueError(f"{path}: not a benchmark result (no 'rows')")
        return {"name": name, "path": path, "provenance": doc.get("provenance", {}), "rows": doc["rows"]}
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            rows = [{key: _csv_value(value) for key, value in row.items()} for row in csv.DictReader(f)]
        return {"name": name, "path": path, "provenance": {}, "rows": rows}
    raise ValueError(f"{path}: expected plaid.json or plaid.csv")


def _search_rows(run: dict) -> dict[str, dict[str, dict]]:
    """shape -> provider -> row, for the search suite, in the order the benchmark ran them."""
    shapes: dict[str, dict[str, dict]] = {}
    for row in run["rows"]:
        if row.get("suite") == "search":
            shapes.setdefault(row["shape"], {})[row["provider"]] = row
    return shapes


def _latency(row: dict) -> float | None:
    """Whole-search ms: ``Searcher.search(text)`` itself when timed, else encode + search."""
    return row.get("search_call") or row.get("ms")


def _title(runs: list[dict], what: str) -> str:
    provenance = next((run["provenance"] for run in runs if run["provenance"]), {})
    if not provenance:
        return what
    return (f"{what}\n{provenance.get('gpu')}, torch {provenance.get('torch')}, "
            f"triton {provenance.get('triton')}, colbert-ai {provenance.get('colbert_ai')}")


def plot_search_latency(runs: list[dict], path) -> pathlib.Path | None:
    """Stock and plugin whole-search latency per shape (log scale) and their ratio, per run."""
    per_run = [_search_rows(run) for run in runs]
    shapes = [shape for shape in dict.fromkeys(s for rows in per_run for s in rows)
              if any(STOCK in rows.get(shape, {}) and PATCHED in rows.get(shape, {}) for rows in per_run)]
    if not shapes:
        return None
    plt = _pyplot()
    figure, (latency_axis, speedup_axis) = plt.subplots(
        1, 2, figsize=(11, 0.38 * len(shapes) + 2.2), sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    markers = "osD^v<>"
    positions = {shape: number for number, shape in enumerate(shapes)}
    for run_number, (run, rows) in enumerate(zip(runs, per_run)):
        marker = markers[run_number % len(markers)]
        offset = (run_number - (len(runs) - 1) / 2) * 0.12
        for shape, providers in rows.items():
            if shape not in positions or STOCK not in providers or PATCHED not in providers:
                continue
            y = positions[shape] + offset
            stock, ours = _latency(providers[STOCK]), _latency(providers[PATCHED])
            for system, value in ((STOCK, stock), (PATCHED, ours)):
                latency_axis.scatter(value, y, color=SYSTEM_COLORS[system], marker=marker, s=28,
                                     label=f"{system}, {run['name']}")
            speedup_axis.scatter(stock / ours, y, color="black", marker=marker, s=28, label=run["name"])
    latency_axis.set_xscale("log")
    latency_axis.set_yticks(range(len(shapes)), shapes)
    latency_axis.invert_yaxis()
    latency_axis.set_xlabel("median Searcher.search latency, ms (log)")
    latency_axis.grid(axis="x", which="both", alpha=0.3)
    speedup_axis.axvline(TARGET_SPEEDUP, color="#d62728", linestyle="--", linewidth=1,
                         label=f"{TARGET_SPEEDUP:g}x")
    speedup_axis.set_xlabel("stock / plugin")
    speedup_axis.set_xlim(left=0)
    speedup_axis.grid(axis="x", alpha=0.3)
    # Between the two systems' points, and left of the 10x line, the axes are empty.
    for axis, where in ((latency_axis, "center"), (speedup_axis, "lower left")):
        handles, labels = axis.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        axis.legend(unique.values(), unique.keys(), fontsize="x-small", loc=where)
    figure.suptitle(_title(runs, "Whole Searcher.search, stock colbert-ai vs the plugin"), fontsize="medium")
    return _save(plt, figure, pathlib.Path(path))


def search_stage_bars(run: dict) -> tuple[list[str], list[list[float]], str]:
    """``(labels, bars, statistic)`` of the stage plot: per bar one ms per segment of ``STAGES``
    and a last one for the plugin's graph replay. ``statistic`` is ``"mean"`` when every row
    records its stage means (each bar then adds up to the row's mean encode + dense_search), else
    ``"median"`` (runs written before the means were: medians of each stage need not add up)."""
    rows = [row for providers in _search_rows(run).values() for row in providers.values()]
    statistic = "mean" if rows and all(row.get("mean_encode") is not None for row in rows) else "median"
    prefix = "mean_" if statistic == "mean" else ""
    bars, labels = [], []
    for shape, providers in _search_rows(run).items():
        for provider in (STOCK, PATCHED_EAGER):
            row = providers.get(provider)
            if row is not None and row.get(f"{prefix}stage_4") is not None:
                bars.append([row.get(f"{prefix}{stage}") or 0.0 for stage in STAGES] + [0.0])
                labels.append(f"{shape} | {'stock' if provider == STOCK else 'plugin, eager'}")
        row = providers.get(PATCHED)
        if (row is not None and row.get(f"{prefix}encode") is not None
                and row.get(f"{prefix}dense_search") is not None):
            # Under CUDA graphs the stages after encoding are one replay: one segment.
            bars.append([row[f"{prefix}encode"], 0.0, 0.0, 0.0, 0.0, row[f"{prefix}dense_search"]])
            labels.append(f"{shape} | plugin")
    return labels, bars, statistic


def plot_search_stages(run: dict, path) -> pathlib.Path | None:
    """Stacked per-stage ms of one run: stock, the plugin eagerly, and the plugin's graphs."""
    labels, bars, statistic = search_stage_bars(run)
    if not bars:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(11.5, 0.28 * len(bars) + 2.0))
    left = [0.0] * len(bars)
    segments = list(zip(STAGE_LABELS, STAGE_COLORS)) + [("after encoding\n(one graph replay)", "#d62728")]
    for number, (stage, color) in enumerate(segments):
        widths = [bar[number] for bar in bars]
        axis.barh(range(len(bars)), widths, left=left, color=color, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    axis.set_yticks(range(len(bars)), labels, fontsize="x-small")
    axis.invert_yaxis()
    axis.set_xlabel("mean ms per query; a bar adds up to the mean encode + dense_search"
                    if statistic == "mean" else
                    "median ms of each stage (medians need not add up to the median total)")
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(_title([run], f"Where a search spends its time ({run['name']})"), fontsize="medium")
    return _save(plt, figure, pathlib.Path(path))


def rerank_line_style(sizes) -> str:
    """Matplotlib's line style for the rerank sizes: joined from MIN_LINE_POINTS sizes on."""
    return "-" if len(set(sizes)) >= MIN_LINE_POINTS else "none"


def plot_rerank(run: dict, path) -> pathlib.Path | None:
    """Rerank scoring ms against candidates per products mode (log-log), with stock's rank();
    the points are joined by a line only from ``MIN_LINE_POINTS`` sizes on."""
    rows = sorted((r for r in run["rows"] if r.get("suite") == "rerank"), key=lambda r: r["size"])
    if not rows:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    colors = {"tf32x3": "#1f77b4", "fp16x2": "#d62728", "fp16": "#ff7f0e"}
    sizes = [r["size"] for r in rows]
    line = rerank_line_style(sizes)
    default_products = rows[0].get("default_products") or DEFAULT_BEFORE_AUTO
    for products in PRODUCTS:
        if products == default_products:
            times = [r["ours_scoring_ms"] for r in rows]
        else:
            times = [r.get(f"ours_{products}_scoring_ms") for r in rows]
        if any(t is None for t in times):
            continue
        default = " (default)" if products == default_products else ""
        axis.plot(sizes, times, linestyle=line, marker="s", color=colors[products],
                  label=f"plugin, {products}{default}")
    stock = [(r["size"], r["stock_rank_wall_ms"]) for r in rows if r.get("stock_rank_wall_ms")]
    if stock:
        axis.plot(*zip(*stock), "o", color=SYSTEM_COLORS[STOCK], label="stock colbert-ai, whole rank(pids=)")
    axis.axhline(1.0, color="black", linestyle=":", linewidth=0.8, label="1 ms")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("candidates (pids=)")
    axis.set_ylabel("ms (plugin: stage-4 scoring)")
    axis.grid(which="both", alpha=0.3)
    axis.legend(fontsize="small", loc="upper center")
    axis.set_title(_title([run], f"Rerank ({run['name']})"), fontsize="medium")
    return _save(plt, figure, pathlib.Path(path))


def plot_all(paths, out_dir=None) -> list[pathlib.Path]:
    """Every plot of the given runs; returns the PNGs written (a plot with no data is skipped)."""
    runs = [load_run(path) for path in paths]
    if not runs:
        raise ValueError("no benchmark runs given")
    out_dir = pathlib.Path(out_dir) if out_dir else runs[0]["path"].parent
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        plot_search_latency(runs, out_dir / "search_latency.png"),
        plot_search_stages(runs[0], out_dir / "search_stages.png"),
        plot_rerank(runs[-1], out_dir / "rerank.png"),
    ]
    return [path for path in written if path is not None]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="tilemaxsim plots-plaid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="plaid.json / plaid.csv of tilemaxsim bench-plaid, or their folders")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: beside the first run)")
    args = parser.parse_args(argv)
    for path in plot_all(args.runs, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
