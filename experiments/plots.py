"""Plots of a reproduction run, drawn only from the files the runner wrote.

Every function takes result folders (each holding ``latency.json`` and, after evaluation,
``evaluation.json``) and an output folder, and returns the path of the PNG it wrote, or None
when the results hold nothing to plot (e.g. no GPU ceilings for the roofline on a CPU run).
"""

from __future__ import annotations

import json
import pathlib
import statistics

__all__ = [
    "STAGES",
    "load_latency",
    "exact_stage_work",
    "plot_latency_per_stage",
    "plot_latency_vs_candidates",
    "plot_throughput_per_length",
    "plot_roofline",
    "plot_all",
]

# The report's stages, in pipeline order (see experiments.reproduce._derived_stages).
STAGES = ("candidates", "filter", "decompress", "exact", "other")
SYSTEM_STYLE = {"stock": {"color": "#7f7f7f", "marker": "o"},
                "patched": {"color": "#d62728", "marker": "s"}}
# Bytes of one compressed token in a PLAID index besides its residual: the int32 centroid code.
CODE_BYTES = 4


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def _save(plt, figure, out_dir, name: str) -> pathlib.Path:
    figure.tight_layout()
    path = pathlib.Path(out_dir) / name
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def load_latency(folders) -> list[dict]:
    """``latency.json`` of each folder that has one, in the given order."""
    loaded = []
    for folder in folders:
        path = pathlib.Path(folder) / "latency.json"
        if path.exists():
            loaded.append(json.loads(path.read_text()))
    return loaded


def _timer_label(results: list[dict]) -> str:
    labels = sorted({f"{r['timer']}, {r['device']}" for r in results})
    return "; ".join(labels)


def exact_stage_work(result: dict, system: str) -> dict[str, float]:
    """Median per-query work of the exact-scoring stage (stage 4) of ``system``.

    Returns:
        ``{"docs", "tokens", "ms", "bytes", "flops"}``: documents and tokens scored, the stage's
        median time, the fewest bytes it must read (the compressed tokens: code plus
        residual) and its multiply-adds x 2 (every query token against every document token).
    """
    entry = result["systems"][system]
    docs = statistics.median(entry["scored_docs"]) if entry["scored_docs"] else 0.0
    tokens = statistics.median(entry["scored_tokens"]) if entry["scored_tokens"] else 0.0
    stage_ms = entry["summary"].get("exact", {}).get("median_ms", float("nan"))
    stage_ms += entry["summary"].get("decompress", {}).get("median_ms", 0.0)
    bytes_per_token = CODE_BYTES + result["dim"] * result["nbits"] / 8
    return {
        "docs": float(docs),
        "tokens": float(tokens),
        "ms": float(stage_ms),
        "bytes": float(tokens * bytes_per_token),
        "flops": float(2 * tokens * result["query_tokens"] * result["dim"]),
    }


def plot_latency_per_stage(folders, out_dir) -> pathlib.Path | None:
    """Stacked bars: median ms of each stage, one bar per (condition, system)."""
    results = load_latency(folders)
    if not results:
        return None
    plt = _pyplot()
    labels, rows = [], []
    for result in results:
        for system, entry in result["systems"].items():
            labels.append(f"{result['condition']}\n{system}")
            rows.append([entry["summary"].get(stage, {}).get("median_ms", 0.0) for stage in STAGES])
    figure, axis = plt.subplots(figsize=(9, 0.5 * len(labels) + 1.5))
    left = [0.0] * len(labels)
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
    for number, stage in enumerate(STAGES):
        widths = [row[number] for row in rows]
        axis.barh(labels, widths, left=left, label=stage, color=colors[number])
        left = [a + b for a, b in zip(left, widths)]
    axis.invert_yaxis()
    axis.set_xlabel(f"median latency per query, ms ({_timer_label(results)})")
    axis.set_title("Latency per stage")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return _save(plt, figure, out_dir, "latency_per_stage.png")


def plot_latency_vs_candidates(folders, out_dir) -> pathlib.Path | None:
    """Median exact-scoring and total latency against the number of documents scored exactly."""
    results = [r for r in load_latency(folders) if any(r["systems"][s]["scored_docs"]
                                                        for s in r["systems"])]
    if len(results) < 2:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for system, style in SYSTEM_STYLE.items():
        points = sorted(
            (exact_stage_work(r, system)["docs"],
             r["systems"][system]["summary"]["total"]["median_ms"],
             exact_stage_work(r, system)["ms"])
            for r in results if system in r["systems"]
        )
        if not points:
            continue
        docs = [p[0] for p in points]
        axis.plot(docs, [p[1] for p in points], label=f"{system}: total", **style)
        axis.plot(docs, [p[2] for p in points], label=f"{system}: exact scoring",
                  linestyle="--", **style)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("documents scored exactly per query")
    axis.set_ylabel(f"median ms per query ({_timer_label(results)})")
    axis.set_title("Latency vs candidates")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return _save(plt, figure, out_dir, "latency_vs_candidates.png")


def plot_throughput_per_length(folders, out_dir) -> pathlib.Path | None:
    """Exact-scoring throughput (documents/s) against the mean tokens per scored document."""
    results = load_latency(folders)
    points = {system: [] for system in SYSTEM_STYLE}
    for result in results:
        for system in points:
            if system not in result["systems"]:
                continue
            work = exact_stage_work(result, system)
            if work["docs"] and work["ms"] > 0:
                points[system].append((work["tokens"] / work["docs"], work["docs"] / work["ms"] * 1e3))
    if not any(points.values()):
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for system, style in SYSTEM_STYLE.items():
        if points[system]:
            ordered = sorted(points[system])
            axis.plot([p[0] for p in ordered], [p[1] for p in ordered], label=system, **style)
    axis.set_yscale("log")
    axis.set_xlabel("mean tokens per scored document")
    axis.set_ylabel("documents/s in exact scoring")
    axis.set_title(f"Throughput per document length ({_timer_label(results)})")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return _save(plt, figure, out_dir, "throughput_per_length.png")


def plot_roofline(folders, out_dir) -> pathlib.Path | None:
    """Exact scoring on the GPU's roofline (ceilings measured in the same run)."""
    results = [r for r in load_latency(folders) if r.get("ceilings")]
    if not results:
        return None
    plt = _pyplot()
    ceilings = results[0]["ceilings"]
    bandwidth = ceilings["read_gbps"] * 1e9  # bytes/s
    peak = ceilings["bf16_tflops"] * 1e12  # flop/s
    figure, axis = plt.subplots(figsize=(7, 4.5))
    intensities = []
    for system, style in SYSTEM_STYLE.items():
        xs, ys = [], []
        for result in results:
            if system not in result["systems"]:
                continue
            work = exact_stage_work(result, system)
            if work["bytes"] and work["ms"] > 0:
                xs.append(work["flops"] / work["bytes"])
                ys.append(work["flops"] / (work["ms"] * 1e-3) / 1e12)
        if xs:
            intensities += xs
            axis.scatter(xs, ys, label=system, color=style["color"], marker=style["marker"])
    if not intensities:
        plt.close(figure)
        return None
    low, high = min(intensities) / 4, max(intensities) * 4
    grid = [low * (high / low) ** (i / 99) for i in range(100)]
    axis.plot(grid, [min(bandwidth * x, peak) / 1e12 for x in grid], color="black",
              label=f"roof: {ceilings['read_gbps']:.0f} GB/s read, {ceilings['bf16_tflops']:.0f} TFLOP/s bf16")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("arithmetic intensity, flop per compressed index byte")
    axis.set_ylabel("TFLOP/s in exact scoring")
    axis.set_title("Roofline of exact scoring")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return _save(plt, figure, out_dir, "roofline.png")


def plot_all(folders, out_dir) -> dict[str, pathlib.Path | None]:
    """Every plot; ``{name: path or None}``."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "latency per stage": plot_latency_per_stage(folders, out_dir),
        "latency vs candidates": plot_latency_vs_candidates(folders, out_dir),
        "throughput per length": plot_throughput_per_length(folders, out_dir),
        "roofline": plot_roofline(folders, out_dir),
    }
