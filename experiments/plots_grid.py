"""Heatmaps of the shape-grid benchmark, drawn only from the result file it wrote.

    python -m experiments.plots_grid results/grid/grid.json [MORE.json ...] [--out DIR]

Per 2-D grid of the run (its axes are in the file's ``meta.grids``), two heatmaps of our rows:
% of the roof (the read ceiling, or the bf16 tensor ceiling in cells marked T where the products
take longer than the bytes) and ours / best peer (> 1: ours faster). A cell that was not run, or
that no peer ran, is left blank. Several result files (one run split over device calls) are
merged first: per cell and provider, the last row that ran.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

OURS = "tilemaxsim"
PANELS = (
    ("pct_roof", "% of roof (read ceiling; T: bf16 tensor)", "viridis", (0.0, 100.0)),
    ("ratio_to_best_peer", "ours / best peer (>1: ours faster)", "RdYlGn", (0.5, 1.5)),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def merge_results(paths) -> dict:
    """One document from several result files: the first file's provenance and ceilings, every
    file's grids, and per (cell, provider) the last row that ran (else the last row)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if not docs:
        raise ValueError("merge_results needs at least one result file")
    merged = {"provenance": docs[0]["provenance"], "ceilings": docs[0].get("ceilings", {}),
              "meta": {**docs[0].get("meta", {}), "grids": {},
                       "merged_from": [str(p) for p in paths]},
              "rows": []}
    best: dict[tuple, dict] = {}
    for doc in docs:
        merged["meta"]["grids"].update(doc.get("meta", {}).get("grids", {}))
        for row in doc["rows"]:
            key = (row["shape"], row["provider"])
            ran = row.get("status") != "not_run"
            if key not in best or ran or best[key].get("status") == "not_run":
                best[key] = row
    merged["rows"] = list(best.values())
    return merged


def grid_values(doc: dict, grid: str, key: str):
    """(y values, x values, matrix of ``key`` for our row in each cell or NaN, matrix of bounds)."""
    spec = doc["meta"]["grids"][grid]
    xs, ys = list(spec["x_values"]), list(spec["y_values"])
    values = [[math.nan] * len(xs) for _ in ys]
    bounds = [[None] * len(xs) for _ in ys]
    for row in doc["rows"]:
        if row["provider"] != OURS or row.get("status") != "ok":
            continue
        if grid not in (row.get("groups") or "").split(";") or row.get(key) is None:
            continue
        try:
            i, j = ys.index(row[spec["y"]]), xs.index(row[spec["x"]])
        except ValueError:
            continue
        values[i][j] = float(row[key])
        bounds[i][j] = row.get("bound")
    return ys, xs, values, bounds


def _title(doc: dict, grid: str, label: str) -> str:
    p = doc["provenance"]
    spec = doc["meta"]["grids"][grid]
    fixed = " ".join(f"{k}={v}" for k, v in spec["fixed"].items() if v is not None)
    return (f"{grid}: {label}\n{fixed}\n{p.get('gpu')} | torch {p['torch']} | "
            f"triton {p['triton']} | {str(p['commit'])[:8]}")


def plot_grid(doc: dict, grid: str, key: str, label: str, cmap: str, limits, out: Path):
    ys, xs, values, bounds = grid_values(doc, grid, key)
    if all(math.isnan(v) for line in values for v in line):
        return None
    plt = _pyplot()
    spec = doc["meta"]["grids"][grid]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.0 + 0.75 * len(xs)), 2.0 + 0.45 * len(ys)))
    image = ax.imshow(values, cmap=cmap, vmin=limits[0], vmax=limits[1], aspect="auto",
                      origin="lower")
    for i, line in enumerate(values):
        for j, v in enumerate(line):
            if math.isnan(v):
                continue
            mark = "T" if key == "pct_roof" and bounds[i][j] == "bf16_tensor" else ""
            ax.text(j, i, f"{v:.0f}{mark}" if key == "pct_roof" else f"{v:.2f}",
                    ha="center", va="center", fontsize=7, color="black")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel(spec["x"])
    ax.set_ylabel(spec["y"])
    ax.set_title(_title(doc, grid, label), fontsize=8)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    path = out / f"{grid}_{key}.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_all(results, out=None) -> list[Path]:
    """Every heatmap of one result file or several (merged); returns the paths written (next to
    the first file by default)."""
    paths = [Path(results)] if isinstance(results, (str, Path)) else [Path(p) for p in results]
    doc = merge_results(paths)
    out = Path(out) if out else paths[0].parent
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for grid in doc.get("meta", {}).get("grids", {}):
        for key, label, cmap, limits in PANELS:
            path = plot_grid(doc, grid, key, label, cmap, limits, out)
            if path:
                paths.append(path)
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.plots_grid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+",
                        help="grid.json files written by experiments.bench_grid")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: the result's)")
    args = parser.parse_args(argv)
    for path in plot_all(args.results, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
