"""What ``validate=True`` costs, drawn from bench_validate's result files: the host's bound.

    tilemaxsim plots-validate results/validate/*/validate.json [--out DIR]

A checked call does host work the unchecked one does not (its checks' launch, event and read),
and reads its checks before it returns, so the host runs at most one call ahead of the GPU. A loop
of checked calls then takes max(kernel time, host work per call) a call: its ratio to the
unchecked loop is about max(1, checked host ms / unchecked ms). The plot puts every checked way of
every file (one colour a file: a machine) at x = its ``host_ms`` over its baseline's ``ms``, y = its
``loop_ratio_to_baseline``, beside that line and the 5 % target. Files without ``host_ms`` (older
runs) are skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from experiments.plots import _pyplot, _save

TARGET = 1.05  # the bound on validate=True against validate=False


def host_bound_points(doc: dict) -> list[dict]:
    """Every checked way of one result file: its op, input and way, ``x`` (its host ms a call over
    its baseline's ms) and ``ratio`` (its loop ratio to the baseline); empty without host_ms."""
    rows = doc["rows"]
    if not rows or "host_ms" not in rows[0]:
        return []
    by_way = {(r["op"], r["input"], r["provider"]): r for r in rows}
    points = []
    for r in rows:
        if r["provider"] == r["baseline"] or r["provider"] == "flash_maxsim":
            continue
        base = by_way[(r["op"], r["input"], r["baseline"])]
        points.append({"op": r["op"], "input": r["input"], "way": r["provider"],
                       "x": r["host_ms"] / base["ms"], "ratio": r["loop_ratio_to_baseline"]})
    return points


def _label(path: pathlib.Path, doc: dict) -> str:
    """The run's folder (with a before/after subfolder), its GPU and commit."""
    p = doc.get("provenance", {})
    gpu = (p.get("gpu") or "?").replace("NVIDIA ", "")
    folder = path.parent
    name = (f"{folder.parent.name}/{folder.name}" if folder.name in ("validate", "before", "after")
            else folder.name)
    return f"{name} ({gpu}, {p.get('commit', '?')[:7]})"


def plot_host_bound(result_files, out: pathlib.Path) -> pathlib.Path | None:
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(7.5, 5.5))
    top = 1.0
    drawn = 0
    for path in map(pathlib.Path, result_files):
        doc = json.loads(path.read_text())
        points = host_bound_points(doc)
        if not points:
            print(f"{path}: no host_ms (an older run): skipped")
            continue
        ax.scatter([p["x"] for p in points], [p["ratio"] for p in points], s=22,
                   label=_label(path, doc))
        top = max(top, *(p["x"] for p in points), *(p["ratio"] for p in points))
        drawn += 1
    if not drawn:
        plt.close(figure)
        return None
    xs = [0.0, 1.0, top * 1.05]
    ax.plot(xs, [max(1.0, x) for x in xs], color="black", linewidth=1,
            label="max(1, host / kernel)")
    ax.axhline(TARGET, color="gray", linestyle="--", linewidth=1, label="5 % target")
    ax.set_xlabel("checked call's host ms / unchecked call's ms (kernel-bound)")
    ax.set_ylabel("validate=True / validate=False, a loop of calls")
    ax.set_title("validate=True: host-bound where the check's host work passes the kernel")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(plt, figure, out.parent, out.name)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="tilemaxsim plots-validate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result_files", nargs="+", help="validate.json files of bench_validate")
    parser.add_argument("--out", default="results/validate/host_bound.png",
                        help="the PNG to write")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = plot_host_bound(args.result_files, out)
    print(f"wrote {path}" if path else "no file had host_ms: nothing drawn")


if __name__ == "__main__":
    main()
