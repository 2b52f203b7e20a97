"""The markdown report of a reproduction run, written only from the runner's result files.

Sections: provenance, retrieval quality (ranx, with the paired test), ranking identity of
patched vs stock, latency (the mean of each stage, which add up to the mean total, then the
total's median and p95 over warm queries, labelled with the timer and device), expected numbers
(OK/FAIL), plots. Tables are rendered by ``tabulate`` (a dependency of ranx, which the evaluate
step needs anyway).
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib

from . import plots

__all__ = ["write_report", "format_number"]


def format_number(value, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _format_p(p) -> str:
    # ranx's paired t-test is undefined (nan) when every per-query difference is zero.
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "no difference"
    return f"{p:.3g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub markdown table of already formatted cells (numbers are not re-parsed)."""
    from tabulate import tabulate

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    return tabulate([[cell(c) for c in row] for row in rows], headers=[cell(h) for h in header],
                    tablefmt="github", disable_numparse=True).splitlines()


def _load(folder: pathlib.Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def write_report(*, title: str, config_path, config_name: str, result_folders, out_dir,
                 data_manifests=()) -> pathlib.Path:
    """Write ``report.md`` and the plots into ``out_dir``.

    Args:
        title: the table's label from the config (it names the collection honestly).
        config_path, config_name: the config the results came from.
        result_folders: one folder per condition (``latency.json``, ``evaluation.json``).
        out_dir: where report.md and the PNGs go.
        data_manifests: prepared-data folders, whose manifest gives passage and query counts.

    Returns:
        The path of report.md.
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folders = [pathlib.Path(folder) for folder in result_folders]
    latencies = {folder: _load(folder, "latency.json") for folder in folders}
    evaluations = {folder: _load(folder, "evaluation.json") for folder in folders}
    lines = [f"# {title}", ""]
    lines.append(f"Config `{config_path}` (`{config_name}`); report written "
                 f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}.")
    first = next((value for value in latencies.values() if value), None)
    if first:
        provenance = first.get("provenance", {})
        lines.append("Provenance: " + ", ".join(f"{key} {value}" for key, value in provenance.items()))
    for manifest_dir in data_manifests:
        manifest = _load(pathlib.Path(manifest_dir), "manifest.json")
        if manifest:
            key = manifest["key"]
            lines.append(
                f"Data: ir_datasets `{key.get('ir_datasets')}`, {manifest['passages']:,} of "
                f"{manifest['source_passages']:,} passages, {manifest['queries']:,} of "
                f"{manifest['source_queries']:,} queries (seed {key.get('seed', 0)})."
            )
    lines.append("")

    quality_rows, identity_rows, check_rows = [], [], []
    for folder in folders:
        evaluation = evaluations[folder]
        if not evaluation:
            continue
        name = evaluation["condition"]
        comparison = evaluation["comparison"]
        metrics = comparison["metrics"]
        p_values = comparison["systems"]["patched"]["p_values"]["stock"]
        for system in ("stock", "patched"):
            scores = evaluation["quality"][system]
            row = [name, system] + [format_number(scores[m]) for m in metrics]
            row.append("" if system == "stock" else
                       ", ".join(f"{m}: {_format_p(p_values[m])}" for m in metrics))
            quality_rows.append(row)
        identity = evaluation["identity"]
        ks = sorted({int(key.split("top")[1]) for key in identity if key.startswith("identical_top")})
        identity_rows.append(
            [name, str(int(identity["queries"]))]
            + [format_number(identity[f"identical_top{k}"], 3) for k in ks]
            + [format_number(identity[f"same_set_top{k}"], 3) for k in ks]
            + [format_number(identity[f"kendall_tau@{k}"], 3) for k in ks]
            + [format_number(identity[f"rbo@{k}"], 3) for k in ks]
            + [format_number(identity["max_abs_score_diff"], 6)]
        )
        for check in evaluation["checks"]:
            check_rows.append([name, check["name"], format_number(check["expected"]),
                               format_number(check["measured"]), check["status"]])

    if quality_rows:
        metrics = next(e for e in evaluations.values() if e)["comparison"]["metrics"]
        test = next(e for e in evaluations.values() if e)["comparison"]["stat_test"]
        lines += ["## Retrieval quality (ranx)", ""]
        lines += _table(["condition", "system", *metrics, f"p ({test} paired test vs stock)"],
                        quality_rows)
        lines.append("")
        lines += ["## Ranking identity: patched vs stock", ""]
        lines.append("Fraction of queries whose top k is the same list (same set), mean Kendall "
                     "tau and rank-biased overlap of the two top-k lists, largest |score "
                     "difference| over documents both returned.")
        lines.append("")
        header = ["condition", "queries"]
        for kind in ("identical", "same set", "tau", "RBO"):
            header += [f"{kind} @{k}" for k in ks]
        lines += _table(header + ["max abs Δscore"], identity_rows)
        lines.append("")

    latency_rows = []
    timers = set()
    for folder in folders:
        latency = latencies[folder]
        if not latency:
            continue
        timers.add(f"{latency['timer']} on {latency['device']}")
        medians = {}
        for system, entry in latency["systems"].items():
            summary = entry["summary"]
            total = summary.get("total", {})
            medians[system] = total.get("median_ms", math.nan)
            means = plots.stage_means(entry)
            # A graph replay is timed whole: its stages are not zero, they are unknown.
            cells = [format_number(means[stage], 3) if stage in means else "—"
                     for stage in plots.STAGES]
            docs = entry["scored_docs"]
            speedup = ""
            if system != "stock" and medians.get(system) and "stock" in medians:
                speedup = f"{medians['stock'] / medians[system]:.2f}x"
            latency_rows.append([latency["condition"], system,
                                 str(sorted(docs)[len(docs) // 2]) if docs else "—", *cells,
                                 format_number(means.get("total"), 3),
                                 format_number(total.get("median_ms"), 3),
                                 format_number(total.get("p95_ms"), 3), speedup])
    if latency_rows:
        lines += ["## Latency per query over warm queries, ms", ""]
        lines.append("Timer: " + "; ".join(sorted(timers)) + ". CPU numbers are wall clock and "
                     "say nothing about GPU speed.")
        lines.append("")
        lines.append("Each stage column is the stage's mean over the warm queries; each query's "
                     "stages add up to its total, so a row's stages add up to its mean total, "
                     "as the bars of the latency-per-stage plot do. The median and p95 are of "
                     "the whole query; the speedup is of the median. '—': stages not timed "
                     "apart (one CUDA graph replay per query).")
        lines.append("")
        lines += _table(["condition", "system", "docs scored", *plots.STAGES, "total mean",
                         "total median", "total p95", "speedup (median)"], latency_rows)
        lines.append("")
        timing_notes = sorted({f"{system}: {entry['timing']}" for latency in latencies.values()
                               if latency for system, entry in latency["systems"].items()
                               if entry.get("timing")})
        if timing_notes:
            lines.append("How each system was timed: " + "; ".join(timing_notes) + ".")
            lines.append("")
        missing = sorted({hook for latency in latencies.values() if latency
                          for entry in latency["systems"].values()
                          for hook in entry.get("missing_hooks", [])})
        if missing:
            lines.append("Stages not observable in this run (hooks missing, counted in "
                         "'other'): " + ", ".join(missing) + ".")
            lines.append("")

    if check_rows:
        lines += ["## Expected numbers", ""]
        lines += _table(["condition", "number", "expected", "measured", "status"], check_rows)
        lines.append("")

    made = plots.plot_all(folders, out_dir)
    lines += ["## Plots", ""]
    for name, path in made.items():
        if isinstance(path, str):
            lines += [f"- {name}: not drawn: {path}.", ""]
        else:
            lines += [f"![{name}]({path.name})", ""]
    lines.append("")
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report
