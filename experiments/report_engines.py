"""The engines report: markdown tables and plots from one or more ``engines.json`` files.

``tilemaxsim report-engines RESULT_DIR [RESULT_DIR ...] --out DIR``

Writes ``DIR/REPORT.md`` and three plots: batch-1 latency against corpus size per engine
(k = 10, each engine's defaults), queries per second against batch size, and recall@10 against
latency over the settings sweep (the largest corpus measured). Speed-ups are ratios of p50
latencies in the same run; "at matched recall" compares, for each fast-plaid setting of the
sweep, the fastest plugin setting whose recall@10 is at most 0.005 below it.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

__all__ = ["load_rows", "build_report", "main", "MATCHED_RECALL_SLACK"]

MATCHED_RECALL_SLACK = 0.005
PLUGIN, STOCK, FAST_PLAID = "tilemaxsim", "colbert-ai", "fast-plaid"
ENGINE_ORDER = (STOCK, PLUGIN, FAST_PLAID)


def load_rows(paths) -> tuple[list[dict], list[dict]]:
    """Rows and provenances of every ``engines.json`` under ``paths`` (files or folders)."""
    rows, provenances = [], []
    for path in map(pathlib.Path, paths):
        files = [path] if path.is_file() else sorted(path.rglob("engines.json"))
        if not files:
            raise FileNotFoundError(f"no engines.json at {path}")
        for file in files:
            doc = json.loads(file.read_text())
            provenances.append({"file": str(file), **doc.get("provenance", {})})
            rows += doc["rows"]
    return rows, provenances


def _passages(row: dict) -> int:
    return int(row["shape"].split(" passages")[0].replace(",", ""))


def _fmt(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(headers: list[str], body: list[list]) -> str:
    from tabulate import tabulate

    return tabulate([[_fmt(cell) for cell in row] for row in body], headers=headers,
                    tablefmt="github", disable_numparse=True)


def _latency(rows, size, engine, k, setting="defaults"):
    for row in rows:
        if (row["suite"] == "latency" and _passages(row) == size and row["provider"] == engine
                and row["k"] == k and row["setting"] == setting):
            return row
    return None


def matched_recall(rows: list[dict], size: int) -> list[dict]:
    """For each fast-plaid sweep setting at ``size``: the fastest plugin sweep setting whose
    recall@10 is within MATCHED_RECALL_SLACK below it, and the latency ratio."""
    sweep = [r for r in rows if r["suite"] == "latency" and _passages(r) == size and r["k"] == 10
             and r["setting"].startswith("sweep") and "recall@10" in r]
    plugin = [r for r in sweep if r["provider"] == PLUGIN]
    out = []
    for theirs in (r for r in sweep if r["provider"] == FAST_PLAID):
        good = [r for r in plugin if r["recall@10"] >= theirs["recall@10"] - MATCHED_RECALL_SLACK]
        ours = min(good, key=lambda r: r["p50_ms"]) if good else None
        out.append({"fast_plaid": theirs, "plugin": ours,
                    "speedup": theirs["p50_ms"] / ours["p50_ms"] if ours else None})
    return out


def build_report(rows: list[dict], provenances: list[dict], out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    sizes = sorted({_passages(r) for r in rows if r["suite"] == "latency"})
    ks = sorted({r["k"] for r in rows if r["suite"] == "latency"})
    engines = [e for e in ENGINE_ORDER if any(r["provider"] == e for r in rows)]
    lines = ["# PLAID engines on one compressed index", "",
             "Synthetic structured corpus (experiments/engine_corpus.py), d = 128; every engine reads "
             "the same centroids, codes and residual bytes (experiments/engine_index.py). "
             "Synthetic-corpus numbers, not MS MARCO's.", ""]
    lines += [
        "What is compared: `colbert-ai` is stock colbert-ai 0.2.22 with only the plugin's `compat` "
        "group (torch stand-ins for its JIT-compiled C++ extensions, same results; it keeps the "
        "compressed index in host memory), `tilemaxsim` is colbert-ai with the plugin, "
        "`fast-plaid` is fast-plaid's `FastPlaid.search`. Times are the wall time of the call a "
        "user makes after encoding (`Searcher.dense_search`, `Searcher._search_all_Q`, "
        "`FastPlaid.search`), the GPU synchronised. What still differs between the engines: "
        "fast-plaid has no centroid-score threshold and no centroid-interaction pruning; its "
        "`n_ivf_probe` centroids per query token and `n_full_scores` exactly rescored documents "
        "stand against colbert-ai's `ncells` and `ndocs` (of which stage 4 rescores `ndocs / 4`). "
        "At k = 10 colbert-ai's defaults (ndocs 256) trade recall for time against fast-plaid's "
        "(4,096 rescored documents), so the defaults rows differ in recall; the matched-recall "
        "table compares equal recall.", ""]
    for prov in provenances:
        lines.append(f"- `{prov['file']}`: {prov.get('gpu', prov.get('device', '?'))}, torch "
                     f"{prov.get('torch', '?')}, triton {prov.get('triton', '?')}, commit "
                     f"{prov.get('commit', '?')}")
    lines.append("")

    lines += ["## Batch-1 latency after encoding (p50 / p99 ms), each engine's defaults", ""]
    body = []
    for size in sizes:
        for k in ks:
            cells = [f"{size:,}", k]
            for engine in engines:
                row = _latency(rows, size, engine, k)
                cells.append(f"{row['p50_ms']:.3f} / {row['p99_ms']:.3f}" if row else "-")
            plugin = _latency(rows, size, PLUGIN, k)
            for other in (STOCK, FAST_PLAID):
                row = _latency(rows, size, other, k)
                cells.append(row["p50_ms"] / plugin["p50_ms"] if row and plugin else None)
            body.append(cells)
    lines += [_table(["passages", "k", *engines, "stock / plugin", "fast-plaid / plugin"], body), ""]

    lines += ["## Quality (recall against exact MaxSim; success@10 against the target passage)", ""]
    body = []
    for row in rows:
        if row["suite"] == "latency" and not row["setting"].startswith("sweep"):
            body.append([f"{_passages(row):,}", row["k"], row["provider"], row["setting"],
                         row.get("recall@10"), row.get("recall@10_decompressed"), row.get("recall@100"),
                         row.get("recall@100_decompressed"), row.get("success@10"), row["p50_ms"]])
    for row in rows:
        if row["suite"] == "exact":
            body.append([f"{_passages(row):,}", "-", row["provider"], "-", 1.0, None, 1.0, None,
                         row["success@10"], None])
    lines += [_table(["passages", "k", "engine", "setting", "R@10", "R@10 vs decompressed", "R@100",
                      "R@100 vs decompressed", "success@10", "p50 ms"], body), ""]

    lines += ["## Throughput (queries per second through each engine's batch API)", ""]
    body = [[f"{_passages(r):,}", r["k"], r["provider"], r["queries"], r["qps"], r["seconds"]]
            for r in rows if r["suite"] == "throughput"]
    lines += [_table(["passages", "k", "engine", "queries", "QPS", "seconds"], body), ""]

    if sizes:
        lines += [f"## At matched recall@10 (sweep, k = 10, {sizes[-1]:,} passages)", ""]
        body = [[m["fast_plaid"]["setting"].removeprefix("sweep "), m["fast_plaid"]["recall@10"],
                 m["fast_plaid"]["p50_ms"],
                 m["plugin"]["setting"].removeprefix("sweep ") if m["plugin"] else "none",
                 m["plugin"]["recall@10"] if m["plugin"] else None,
                 m["plugin"]["p50_ms"] if m["plugin"] else None, m["speedup"]]
                for m in matched_recall(rows, sizes[-1])]
        lines += [_table(["fast-plaid setting", "R@10", "p50 ms", "plugin setting", "R@10", "p50 ms",
                          "fast-plaid / plugin"], body), ""]

    lines += ["## Loading and memory", ""]
    body = [[f"{_passages(r):,}", r["provider"], r["first_query_s"], r["gpu_bytes"] / 2**30,
             r["host_bytes"] / 2**30, r["gpu_bytes_per_token"]] for r in rows if r["suite"] == "load"]
    lines += [_table(["passages", "engine", "first query s", "GPU GiB", "host GiB", "GPU B/token"], body), ""]
    for r in rows:
        if r["suite"] == "load" and (r.get("breakdown") or {}).get("per_token"):
            parts = ", ".join(f"{key} {value / 2**20:,.1f} MiB" for key, value in r["breakdown"].items()
                              if key != "per_token" and value)
            lines.append(f"- plugin at {_passages(r):,} passages: {r['breakdown']['per_token']:.1f} "
                         f"GPU bytes per token embedding ({parts})")
    for r in rows:
        if r["suite"] == "build" and r["provider"] != "shared":
            lines.append(f"- {r['provider']} at {_passages(r):,} passages: {r['seconds']:.1f} s")
        elif r["suite"] == "build":
            lines.append(f"- index build at {_passages(r):,} passages: {r['seconds']:.1f} s "
                         f"({r['num_embeddings']:,} embeddings, C = {r['num_centroids']:,}, "
                         f"centroids from {r['centroids_from']})")
        if r["suite"] == "fairness":
            lines.append(f"- fairness at {_passages(r):,} passages: on fast-plaid's own create() of "
                         f"{r['passages']:,} passages, our compressor differs in {r['codes_differ']} codes and "
                         f"{r['residual_bytes_differ']} residual bytes; fast-plaid's decompression of the "
                         f"shared index differs from colbert-ai's GPU codec by at most "
                         f"{r['decompressed_max_abs_diff']:.2g}")
        if r["suite"] == "exactness":
            lines.append(f"- plugin exactness at {r['shape']}: top-10 scores within "
                         f"{r['max_abs_score_diff']:.2g} of exact fp32 MaxSim over the decompressed "
                         f"embeddings on {r['queries']} queries; {r['unsorted_lists']} lists out of order")
            if "rerank_not_exact_top10" in r:
                lines.append(f"  - a rerank of a known candidate set (its top 10 and {r['rerank_candidates']} "
                             f"random pids) returned the exact top 10 up to ties on all but "
                             f"{r['rerank_not_exact_top10']} of {r['queries']} queries")
    lines.append("")
    lines += [f"![latency vs corpus size]({_plot_latency(rows, sizes, engines, out).name})",
              f"![QPS vs batch]({_plot_qps(rows, engines, out).name})",
              f"![recall vs latency]({_plot_recall(rows, sizes, engines, out).name})", ""]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(6, 4))


def _save(plt, fig, ax, path: pathlib.Path) -> pathlib.Path:
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_latency(rows, sizes, engines, out) -> pathlib.Path:
    plt, fig, ax = _figure()
    for engine in engines:
        points = [(s, _latency(rows, s, engine, 10)) for s in sizes]
        points = [(s, r["p50_ms"]) for s, r in points if r]
        if points:
            ax.plot(*zip(*points), marker="o", label=engine)
    ax.set(xscale="log", yscale="log", xlabel="passages", ylabel="batch-1 p50 latency (ms), k=10",
           title="Latency against corpus size (each engine's defaults)")
    return _save(plt, fig, ax, out / "latency_vs_corpus.png")


def _plot_qps(rows, engines, out) -> pathlib.Path:
    plt, fig, ax = _figure()
    size = max((_passages(r) for r in rows if r["suite"] == "throughput"), default=None)
    for engine in engines:
        points = []
        single = _latency(rows, size, engine, 10) if size else None
        if single:
            points.append((1, 1e3 / single["mean_ms"]))
        points += sorted((r["queries"], r["qps"]) for r in rows if r["suite"] == "throughput"
                         and _passages(r) == size and r["provider"] == engine and r["k"] == 10)
        if points:
            ax.plot(*zip(*points), marker="o", label=engine)
    ax.set(xscale="log", yscale="log", xlabel="queries per call", ylabel="queries per second",
           title=f"Throughput, k=10, {size:,} passages" if size else "Throughput")
    return _save(plt, fig, ax, out / "qps_vs_batch.png")


def _plot_recall(rows, sizes, engines, out) -> pathlib.Path:
    plt, fig, ax = _figure()
    size = sizes[-1] if sizes else None
    for engine in engines:
        chosen = [r for r in rows if r["suite"] == "latency" and size and _passages(r) == size
                  and r["k"] == 10 and "recall@10" in r and r["setting"].startswith("sweep")
                  and r["provider"] == engine]
        points = sorted((r["p50_ms"], r["recall@10"]) for r in chosen)
        if points:
            # Recall is over each engine's timed queries; stock colbert-ai times fewer.
            ax.plot(*zip(*points), marker="o", linestyle="none",
                    label=f"{engine} ({min(r['queries'] for r in chosen)} queries)")
    ax.set(xscale="log", xlabel="batch-1 p50 latency (ms)", ylabel="recall@10 vs exact MaxSim",
           title=f"Recall against latency, settings sweep, {size:,} passages" if size else "Recall")
    return _save(plt, fig, ax, out / "recall_vs_latency.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tilemaxsim report-engines", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="engines.json files or folders holding them")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        rows, provenances = load_rows(args.results)
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as error:
        print(f"tilemaxsim report-engines: {error}", file=sys.stderr)
        return 2
    print(build_report(rows, provenances, pathlib.Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
