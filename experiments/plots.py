"""Plots of a reproduction run, drawn only from the files the runner wrote.

Every function takes result folders (each holding ``latency.json`` and, after evaluation,
``evaluation.json``) and an output folder, and returns the path of the PNG it wrote, or a
sentence saying why it drew nothing (no GPU ceilings for the roofline on a CPU run, no sweep of
at least ``MIN_LINE_POINTS`` conditions that differ in the plotted key alone).

Stage bars are means over the warm queries: each query's stages add up to its total, so the
means add up to the mean total, the column the report's table shows beside the median.
"""

from __future__ import annotations

import json
import pathlib
import statistics

__all__ = [
    "STAGES",
    "MIN_LINE_POINTS",
    "LENGTH_KEYS",
    "load_latency",
    "exact_stage_work",
    "stage_means",
    "stage_bars",
    "sweeps",
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
# A line through fewer points shows no trend: a plot with fewer draws nothing and says so.
MIN_LINE_POINTS = 3
# The settings that set passage length: a throughput-per-length plot varies one of these alone.
LENGTH_KEYS = ("synthetic.doclen_median",)
# The segment of a bar whose stages were not timed apart (one CUDA graph replay per query).
WHOLE = "whole query (one graph replay)"
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


def _stages_timed(entry: dict) -> bool:
    # Results written before "stages_timed" was recorded say so in their timing note.
    return entry.get("stages_timed", "graph" not in entry.get("timing", ""))


def _staged(result: dict, system: str) -> str | None:
    """The system whose stage times stand for ``system``: itself when its stages were timed,
    its eager timing pass when it ran as graph replays, None when neither is there."""
    entry = result["systems"].get(system)
    if entry is None:
        return None
    if _stages_timed(entry):
        return system
    eager = f"{system}-eager"
    return eager if eager in result["systems"] else None


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


def stage_means(entry: dict) -> dict[str, float]:
    """Mean ms per stage of one system's warm queries, and ``"total"``: the stages add up to it.

    A system timed as one graph replay per query has a single stage, ``WHOLE``.
    """
    per_query = entry["per_query_ms"]
    totals = per_query.get("total", [])
    if not totals:
        return {}
    mean = {"total": statistics.fmean(totals)}
    if not _stages_timed(entry):
        mean[WHOLE] = mean["total"]
        return mean
    for stage in STAGES:
        mean[stage] = statistics.fmean(per_query[stage]) if per_query.get(stage) else 0.0
    return mean


def stage_bars(results: list[dict]) -> list[tuple[str, dict[str, float], float]]:
    """``(label, {stage: mean ms}, mean total ms)`` per (condition, system): what the bars draw."""
    bars = []
    for result in results:
        for system, entry in result["systems"].items():
            mean = stage_means(entry)
            if mean:
                total = mean.pop("total")
                bars.append((f"{result['condition']}\n{system}", mean, total))
    return bars


def plot_latency_per_stage(folders, out_dir) -> pathlib.Path | str:
    """Stacked bars: mean ms of each stage over the warm queries, one bar per (condition, system);
    each bar ends at that row's mean total."""
    results = load_latency(folders)
    bars = stage_bars(results)
    if not bars:
        return "no latency.json with timed queries"
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 0.5 * len(bars) + 1.8))
    labels = [label for label, _, _ in bars]
    left = [0.0] * len(bars)
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#7f7f7f")
    for stage, color in zip((*STAGES, WHOLE), colors):
        widths = [segments.get(stage, 0.0) for _, segments, _ in bars]
        if any(widths):
            axis.barh(labels, widths, left=left, label=stage, color=color)
            left = [a + b for a, b in zip(left, widths)]
    axis.invert_yaxis()
    axis.set_xlabel(f"mean latency per query over warm queries, ms ({_timer_label(results)})")
    axis.set_title("Latency per stage: means, adding up to the table's mean total")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return _save(plt, figure, out_dir, "latency_per_stage.png")


def sweeps(results: list[dict], key: str) -> list[list[dict]]:
    """Groups of results whose settings differ in ``key`` alone, each sorted by ``key``.

    A group needs ``MIN_LINE_POINTS`` different values of ``key``; results without recorded
    settings (written before they were) join no group.
    """
    groups: dict[str, list[dict]] = {}
    for result in results:
        settings = result.get("settings")
        if not settings or settings.get(key) is None:
            continue
        fixed = json.dumps({k: v for k, v in settings.items() if k != key}, sort_keys=True)
        groups.setdefault(fixed, []).append(result)
    return [sorted(group, key=lambda r: r["settings"][key]) for group in groups.values()
            if len({r["settings"][key] for r in group}) >= MIN_LINE_POINTS]


def _fixed_label(group: list[dict], keys=("plaid.k", "queries")) -> str:
    settings = group[0]["settings"]
    return ", ".join(f"{key.split('.')[-1]} {settings[key]}" for key in keys
                     if settings.get(key) is not None)


def plot_latency_vs_candidates(folders, out_dir) -> pathlib.Path | str:
    """Median total and exact-scoring latency against the candidates each query reranks, one line
    per sweep (conditions that differ in ``candidates`` alone)."""
    results = load_latency(folders)
    groups = sweeps(results, "candidates")
    if not groups:
        return (f"no sweep of {MIN_LINE_POINTS} or more conditions that differ in candidates "
                "alone (a config's candidates_sweep)")
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    dashes = ("-", "-.", ":")
    for number, group in enumerate(groups):
        name = group[0].get("sweep") or group[0]["condition"]
        for system, style in SYSTEM_STYLE.items():
            if any(system not in r["systems"] for r in group):
                continue
            docs = [min(r["settings"]["candidates"], r["num_docs"]) for r in group]
            totals = [r["systems"][system]["summary"]["total"]["median_ms"] for r in group]
            axis.plot(docs, totals, linestyle=dashes[number % len(dashes)],
                      label=f"{name} ({_fixed_label(group)}), {system}: total", **style)
            staged = [_staged(r, system) for r in group]
            if None not in staged:
                exact = [exact_stage_work(r, s)["ms"] for r, s in zip(group, staged)]
                axis.plot(docs, exact, linestyle="--", fillstyle="none",
                          label=f"{name}, {staged[0]}: exact scoring", **style)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("candidates reranked per query (sampled pids, the same for both systems)")
    axis.set_ylabel(f"median ms per query ({_timer_label(results)})")
    axis.set_title("Latency vs candidates (every other setting fixed)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="x-small")
    return _save(plt, figure, out_dir, "latency_vs_candidates.png")


def plot_throughput_per_length(folders, out_dir) -> pathlib.Path | str:
    """Exact-scoring throughput (documents/s) against the mean tokens per scored document, one
    line per group of conditions that differ in a passage-length setting alone."""
    results = load_latency(folders)
    groups = [(key, group) for key in LENGTH_KEYS for group in sweeps(results, key)]
    if not groups:
        return (f"no {MIN_LINE_POINTS} or more conditions that differ in passage length alone "
                f"({', '.join(LENGTH_KEYS)})")
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for key, group in groups:
        for system, style in SYSTEM_STYLE.items():
            staged = [_staged(r, system) for r in group]
            if None in staged:
                continue
            work = [exact_stage_work(r, s) for r, s in zip(group, staged)]
            points = [(w["tokens"] / w["docs"], w["docs"] / w["ms"] * 1e3) for w in work
                      if w["docs"] and w["ms"] > 0]
            if len(points) >= MIN_LINE_POINTS:
                axis.plot(*zip(*points), label=f"{staged[0]} ({key.split('.')[-1]} "
                          f"{', '.join(str(r['settings'][key]) for r in group)})", **style)
    if not axis.lines:
        plt.close(figure)
        return "no exact-scoring stage timed in the length sweep"
    axis.set_yscale("log")
    axis.set_xlabel("mean tokens per scored document")
    axis.set_ylabel("documents/s in exact scoring")
    axis.set_title(f"Throughput per document length, every other setting fixed\n"
                   f"({_timer_label(results)})", fontsize="medium")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return _save(plt, figure, out_dir, "throughput_per_length.png")


def plot_roofline(folders, out_dir) -> pathlib.Path | str:
    """Exact scoring on the GPU's roofline (ceilings measured in the same run)."""
    results = [r for r in load_latency(folders) if r.get("ceilings")]
    if not results:
        return "no GPU ceilings in these results (a CPU run)"
    plt = _pyplot()
    ceilings = results[0]["ceilings"]
    bandwidth = ceilings["read_gbps"] * 1e9  # bytes/s
    peak = ceilings["bf16_tflops"] * 1e12  # flop/s
    figure, axis = plt.subplots(figsize=(7, 4.5))
    intensities = []
    for system, style in SYSTEM_STYLE.items():
        xs, ys = [], []
        for result in results:
            staged = _staged(result, system)
            if staged is None:
                continue
            work = exact_stage_work(result, staged)
            if work["bytes"] and work["ms"] > 0:
                xs.append(work["flops"] / work["bytes"])
                ys.append(work["flops"] / (work["ms"] * 1e-3) / 1e12)
        if xs:
            intensities += xs
            axis.scatter(xs, ys, label=system, color=style["color"], marker=style["marker"])
    if not intensities:
        plt.close(figure)
        return "no exact-scoring stage timed in these results"
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


def plot_all(folders, out_dir) -> dict[str, pathlib.Path | str]:
    """Every plot; ``{name: path of the PNG, or why it was not drawn}``."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "latency per stage": plot_latency_per_stage(folders, out_dir),
        "latency vs candidates": plot_latency_vs_candidates(folders, out_dir),
        "throughput per length": plot_throughput_per_length(folders, out_dir),
        "roofline": plot_roofline(folders, out_dir),
    }
