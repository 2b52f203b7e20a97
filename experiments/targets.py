"""Issue 25's GPU targets read off result files: one line each, what was asked, what was measured,
met or not, and on which card.

    python -m experiments.targets FOLDER [FOLDER ...] [--gpu NAME ...] [--out FILE]

Each FOLDER (a gpu_suite bundle unpacked, or results folders) is searched for the newest
``grid.json`` (bench_grid), ``residual_scale.json`` (bench_residual_scale), ``validate.json``
(bench_validate) and ``profile_rerank`` log (a ``*.log`` with profile_rerank's lines), by the date
in their provenance (a log's by the file's time); with ``--gpu``, one table per name, of the
sources measured on a GPU whose name holds it. What is not found is listed as not measured.
A grid split over device calls (bench_grid --skip-done) is read with the parts it continues;
a grid target whose cells were not all run is "not on every cell", unless a cell misses it.
The targets are the issue's, asked of an H200 in one run; a line measured on another card says
which, and the last line says whether every source is one H200 run (same GPU and commit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys

from experiments import plots_grid

TARGET_GPU = "H200"
READ_PCT = 90.0  # packed, one query, cells of >= 10 MB: % of the read ceiling
ROOF_PCT = 70.0  # several queries: % of the binding roof (bf16 tensor ceiling or read)
PEER_RATIO = 1.0  # ours / best peer on every cell with a peer
C_SMALL, C_LARGE, C_SLOWDOWN = 1 << 16, 1 << 18, 1.10  # C = 2^18 within 10 % of C = 2^16
DENSE_SPEEDUP = {2: 1.3, 4: 1.1}  # residual docs/s over dense on the decoded documents
RERANK_MS, RERANK_PRODUCTS, RERANK_SIZE = 1.0, "fp16x2", 100_000  # the plugin's stage 4 at 2^18
VALIDATE_RATIO = 1.05  # validate=True against validate=False, every op and way
DENSE_DECODED = "maxsim_packed on decoded fp16"
RESIDUAL_DEFAULT = "maxsim_residual"


@dataclasses.dataclass
class Target:
    name: str
    asked: str
    measured: str
    met: bool | None  # None: not measured
    gpu: str = ""
    commit: str = ""
    source: str = ""
    unrun: int = 0  # cells of the target a run left unrun (its budget spent)


def _gpu(doc: dict) -> tuple[str, str]:
    p = doc.get("provenance", {})
    return (p.get("gpu") or "?").replace("NVIDIA ", ""), (p.get("commit") or "?")[:7]


def grid_targets(doc: dict, source: str) -> list[Target]:
    """Packed one-query cells of >= 10 MB at >= READ_PCT of the read ceiling; several-query cells
    at >= ROOF_PCT of their roof; every cell with a peer at >= PEER_RATIO of the best one. A
    target's cells that the grid's budget left unrun keep it from being met: it was not seen
    on every cell (``unrun``), unless a cell that ran already misses it."""
    gpu, commit = _gpu(doc)
    ours = [r for r in doc["rows"] if r["provider"] == "tilemaxsim"]

    def line(name, asked, rows, key, limit, fmt):
        unrun = sum(r["status"] == "not_run" for r in rows)
        rows = [r for r in rows if r["status"] == "ok" and r.get(key) is not None]
        low = sorted((r for r in rows if r[key] < limit), key=lambda r: r[key])
        worst = "; ".join(f"{r['shape'].split(' N=')[0]} {fmt(r)}" for r in low[:3])
        measured = (f"{len(rows) - len(low)}/{len(rows)} cells"
                    + (f", {unrun} not run" if unrun else "")
                    + (f" (lowest: {worst})" if low else ""))
        met = False if low else (None if unrun or not rows else True)
        return Target(name, asked, measured, met, gpu, commit, source, unrun)

    big = [r for r in ours if r.get("at_least_10mb")]
    return [
        line("packed one query, read", f">= {READ_PCT:g} % of the read ceiling, cells >= 10 MB",
             [r for r in big if r["layout"] == "packed" and r["B"] == 1], "pct_read_bw",
             READ_PCT, _read_pct),
        line("several queries", f"B >= 4: >= {ROOF_PCT:g} % of the roof (bf16 or read)",
             [r for r in big if r["B"] >= 4], "pct_roof", ROOF_PCT,
             lambda r: f"{r['pct_roof']:.1f} %"),
        line("against the peers", f">= {PEER_RATIO:g}x the best peer, every cell with one",
             ours, "ratio_to_best_peer", PEER_RATIO, lambda r: f"{r['ratio_to_best_peer']:.3f}x"),
    ]


def _read_pct(row: dict) -> str:
    """A cell's % of the read ceiling, and where bench_grid timed it, the % a read of the cell's
    bytes alone reaches (``size_read_pct``: the ceiling at that size)."""
    text = f"{row['pct_read_bw']:.1f} %"
    if row.get("size_read_pct") is not None:
        text += (f" (a read of its {row['size_read_bytes'] / 1e6:.0f} MB: "
                 f"{row['size_read_pct']:.1f} %)")
    return text


_SHAPE = re.compile(r"C=(\d+) nbits=(\d)")


def residual_targets(doc: dict, source: str) -> list[Target]:
    """The default call at C = 2^18 within C_SLOWDOWN of C = 2^16, nbits 1, 2 and 4; at nbits 2
    and 4, DENSE_SPEEDUP over dense scoring of the same documents decoded to fp16 (timed beside
    the residual call at each nbits; the decoded documents do not depend on C)."""
    gpu, commit = _gpu(doc)
    ms, dense = {}, {}
    for r in doc["rows"]:
        m = _SHAPE.search(r["shape"])
        if not m:
            continue
        C, nbits = int(m.group(1)), int(m.group(2))
        if r["provider"] == RESIDUAL_DEFAULT:
            ms[(C, nbits)] = r["ms"]
        elif r["provider"] == DENSE_DECODED:
            dense[nbits] = r["ms"]
    out = []
    ratios = {nbits: ms[(C_LARGE, nbits)] / ms[(C_SMALL, nbits)]
              for nbits in (1, 2, 4) if (C_LARGE, nbits) in ms and (C_SMALL, nbits) in ms}
    out.append(Target(
        "residual, C = 2^18", f"<= {C_SLOWDOWN:.2f}x the time at C = 2^16, nbits 1, 2, 4",
        ", ".join(f"nbits {n} {r:.3f}x" for n, r in ratios.items()) or "not measured",
        len(ratios) == 3 and all(r <= C_SLOWDOWN for r in ratios.values()) if ratios else None,
        gpu, commit, source))
    for nbits, want in DENSE_SPEEDUP.items():
        have = {C: dense[nbits] / ms[(C, nbits)] for C in (C_SMALL, C_LARGE)
                if (C, nbits) in ms and nbits in dense}
        out.append(Target(
            f"residual nbits {nbits} against dense", f">= {want:g}x dense on the decoded documents",
            ", ".join(f"C = 2^{C.bit_length() - 1} {s:.2f}x" for C, s in have.items())
            or "not measured",
            all(s >= want for s in have.values()) if have else None, gpu, commit, source))
    return out


def checked_ways(doc: dict) -> list[dict]:
    """bench_validate's rows of validate=True calls (every way but the unchecked ones and the
    peer), each against its way's validate=False."""
    return [r for r in doc["rows"] if r["provider"] != r["baseline"]
            and r["provider"] != "flash_maxsim" and "validate=False" not in r["provider"]]


def validate_targets(doc: dict, source: str) -> list[Target]:
    """Every checked way within VALIDATE_RATIO of its baseline, GPU time (do_bench) and a loop of
    calls (what a caller's loop sees, the host's work included)."""
    gpu, commit = _gpu(doc)
    rows = checked_ways(doc)
    worst = max(rows, key=lambda r: max(r["ratio_to_baseline"], r["loop_ratio_to_baseline"]),
                default=None)
    over = [r for r in rows if max(r["ratio_to_baseline"], r["loop_ratio_to_baseline"])
            > VALIDATE_RATIO]
    measured = (f"{len(rows) - len(over)}/{len(rows)} ways" + (
        f" (worst: {worst['op']} {worst['input']} {worst['provider']} "
        f"{worst['ratio_to_baseline']:.3f}x, loop {worst['loop_ratio_to_baseline']:.3f}x)"
        if worst else "")) if rows else "not measured"
    return [Target("validate=True", f"<= {VALIDATE_RATIO:g}x validate=False, every op and way",
                   measured, not over if rows else None, gpu, commit, source)]


_RERANK_INDEX = re.compile(r"== index: (\d+) documents, C = (\d+), nbits = (\d)")
_RERANK = re.compile(r"== (\d+) candidates, products (\S+): ([\d.]+) ms from Python")


_PROVENANCE = re.compile(r"GPU (?:NVIDIA )?([^|]+?) \|.*\| commit (\w+)")


def rerank_targets(text: str, source: str) -> list[Target]:
    """The plugin's stage 4 over RERANK_SIZE candidates at C = 2^18 (profile_rerank's log): its
    fast products path and at most RERANK_MS from Python."""
    prov = _PROVENANCE.search(text)
    gpu, commit = (prov.group(1), prov.group(2)[:7]) if prov else ("?", "?")
    index = _RERANK_INDEX.search(text)
    runs = [(int(n), products, float(ms)) for n, products, ms in _RERANK.findall(text)]
    hit = [(p, ms) for n, p, ms in runs if n == RERANK_SIZE]
    C = int(index.group(2)) if index else None
    if not hit or C != C_LARGE:
        measured = ("not measured" if not hit else f"measured at C = {C}, not 2^18" if C
                    else "the log does not say C (profile_rerank before its index line)")
        return [Target("plugin rerank, C = 2^18", f"{RERANK_PRODUCTS}, <= {RERANK_MS:g} ms",
                       measured, None, gpu, commit, source)]
    products, ms = hit[0]
    return [Target("plugin rerank, C = 2^18",
                   f"{RERANK_SIZE // 1000}k candidates: {RERANK_PRODUCTS}, <= {RERANK_MS:g} ms",
                   f"{products}, {ms:.3f} ms", products == RERANK_PRODUCTS and ms <= RERANK_MS,
                   gpu, commit, source)]


# What a result file must cover to stand for its targets: the full grid; the 100k
# documents.
COVERS = {
    "grid.json": lambda doc: doc.get("meta", {}).get("cells") == "full",
    "residual_scale.json": lambda doc: any("N=100k " in r["shape"] for r in doc["rows"]),
    "validate.json": lambda doc: bool(doc["rows"]) and all(
        r.get("num_docs", 0) >= 100_000 for r in doc["rows"]),
}


def _newest_json(folders, name: str, gpu: str = ""):
    """The newest result file called ``name`` in ``folders`` that covers its targets (measured
    on a GPU whose name holds ``gpu``), as (path, document); a grid that continues earlier
    parts of its run (bench_grid --skip-done: ``meta.continues``) comes merged with them."""
    found = []
    for folder in folders:
        for path in sorted(pathlib.Path(folder).rglob(name)):
            doc = json.loads(path.read_text())
            prov = doc.get("provenance", {})
            if gpu in (prov.get("gpu") or ""):
                found.append((prov.get("date", ""), str(path), doc))
    covering = [f for f in found if COVERS[name](f[2])]
    if not covering:
        return None, None
    _, path, doc = max(covering, key=lambda f: (f[0], f[1]))
    continues = set(doc.get("meta", {}).get("continues") or ())
    if continues:
        parts = {f[0]: f[1] for f in found if f[0] in continues and _gpu(f[2]) == _gpu(doc)}
        if parts:
            doc = plots_grid.merge_results([*(parts[d] for d in sorted(parts)), path])
            path = " + ".join([*(parts[d] for d in sorted(parts)), path])
    return path, doc


def _run_date(path: pathlib.Path, root: pathlib.Path) -> str:
    """The date of the run that wrote ``path``: the ``date`` of the nearest provenance.json in
    its folder or one above it, up to ``root`` (a log carries none of its own); "" if none."""
    for folder in (path.parent, *path.parent.parents):
        prov = folder / "provenance.json"
        if prov.is_file():
            try:
                return str(json.loads(prov.read_text()).get("date") or "")
            except (ValueError, AttributeError):
                return ""
        if folder == root:
            break
    return ""


def _newest_rerank_log(folders, gpu: str = ""):
    """The newest profile_rerank log by its run's date (then its file's time and path: a fresh
    checkout gives every file one time)."""
    logs = []
    for folder in folders:
        root = pathlib.Path(folder)
        for path in root.rglob("*.log"):
            text = path.read_text(errors="replace")
            prov = _PROVENANCE.search(text)
            if _RERANK.search(text) and (not gpu or (prov and gpu in prov.group(1))):
                logs.append((_run_date(path, root), path.stat().st_mtime, str(path), path))
    return max(logs)[-1] if logs else None


def collect(folders, gpu: str = "") -> list[Target]:
    """The targets from the newest source of each kind in ``folders`` (measured on a GPU whose
    name holds ``gpu``)."""
    targets = []
    for name, read in (("grid.json", grid_targets), ("residual_scale.json", residual_targets),
                       ("validate.json", validate_targets)):
        path, doc = _newest_json(folders, name, gpu)
        if doc is None:  # the same lines, none measured
            targets += [dataclasses.replace(t, measured="not measured", met=None, gpu="",
                                            commit="") for t in read({"rows": []}, "")]
        else:
            targets += read(doc, path)
    log = _newest_rerank_log(folders, gpu)
    targets += rerank_targets(log.read_text(errors="replace") if log else "", str(log or ""))
    return targets


def table(targets: list[Target]) -> list[str]:
    lines = ["| target | asked | measured | met | GPU | commit | source |",
             "|---|---|---|---|---|---|---|"]
    for t in targets:
        met = ("yes" if t.met else "no") if t.met is not None else (
            "not on every cell" if t.unrun else "not measured")
        lines.append(f"| {t.name} | {t.asked} | {t.measured} | {met} | {t.gpu} | {t.commit} | "
                     f"{t.source} |")
    measured = [t for t in targets if t.met is not None or t.unrun]
    gpus, commits = {t.gpu for t in measured}, {t.commit for t in measured if t.commit}
    one_run = bool(measured) and len(gpus) == 1 and len(commits) <= 1
    on_target = one_run and TARGET_GPU in next(iter(gpus))
    last = (f"{sum(bool(t.met) for t in targets)} of {len(targets)} met; every source one "
            f"{TARGET_GPU} run at one commit: {'yes' if on_target else 'no'}")
    if one_run and not on_target and len(measured) == len(targets):
        last += f" (every source one {next(iter(gpus))} run at {next(iter(commits), '?')})"
    return [*lines, "", last]


def tables(folders, gpus=("",)) -> list[str]:
    """:func:`table` of the targets in ``folders``, one under a heading per GPU name where
    several are given."""
    lines = []
    for gpu in gpus:
        if len(gpus) > 1:
            lines += [*([""] if lines else []), f"## {gpu}", ""]
        lines += table(collect(folders, gpu))
    return lines


def write(path, lines: list[str], command: str) -> None:
    pathlib.Path(path).write_text(
        f"# The kernel targets, from the newest result file of each kind\n\n"
        f"Written by `{command}`.\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m experiments.targets",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--gpu", nargs="+", default=[""],
                        help="one table per name: sources measured on a GPU whose name holds it")
    parser.add_argument("--out", help="also write the table(s) to this file")
    args = parser.parse_args(argv)
    lines = tables(args.folders, args.gpu)
    print("\n".join(lines))
    if args.out:
        write(args.out, lines, " ".join(["python -m experiments.targets",
                                         *(argv if argv is not None else sys.argv[1:])]))
    return lines


if __name__ == "__main__":
    main()
