"""One table of where things stand: ``results/TABLE.md`` and ``results/headline_over_commits.png``,
and beside the table ``TARGETS.md``, the kernel targets from the newest H200 and H100 results
(``experiments.targets``).

    tilemaxsim results [--results results] [--out results/TABLE.md] [--plot PATH | --no-plot]
                       [--readme README.md]

Reads every committed result file under ``--results`` (``.gz`` read transparently) and keeps, for
each workload, the LATEST measurement. Latest is decided from each file's provenance: the position
of its ``commit`` in ``git log`` (topological order), then its ``date``, then its path; a commit
that git does not know sorts first, with a warning. Folder names play no part.

Schemas read (all written by ``experiments/harness.write_results`` unless stated):
- ``{provenance, ceilings, meta, rows}``: ``dense.json`` and ``dense_config_sweep.json``
  (``bench.py``), ``bench_compressed.json``, ``plaid.json`` (``bench_plaid.py``),
  ``distributed.json``, ``pq_agreement.json`` (rows keyed by ``M``) and ``equivalence.json``
  (rows keyed by ``k``; ``meta`` names the config, condition and device, or ``pooled_from``).
  A row is ``suite, shape, provider, ms, docs_per_s, pct_read_bw, ...``.
- ``reproduce.py``'s per-condition folder: ``latency.json`` (``condition``, ``systems.<name>.summary``,
  ``provenance``) with ``evaluation.json`` beside it (``quality``, ``identity``).
- a benchmark's ``.csv`` with no ``.json`` beside it: the same rows, with the provenance its
  run's log printed (``<name>.log`` beside it, a ``provenance: {...}`` line), else that of the
  git commit that added the file (no GPU or versions recorded).

The command of a measurement is ``meta.argv`` where the writer records it, else a command in a
code span of the nearest ``README.md`` at or above the file: the one on a line naming the file (by
name or by its path from the README's folder) or a folder on the way down to it, else the
README's first (each results folder's README is the command that made it).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import fnmatch
import gzip
import io
import json
import logging
import math
import os
import shlex
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from . import targets

# The GPUs TARGETS.md (beside the table) reads the kernel targets for, newest result of each.
TARGET_GPUS = ("H200", "H100")

__all__ = ["Measurement", "Headline", "HEADLINES", "load_measurements", "latest", "headline_rows",
           "render_table", "render_readme_headline", "update_readme", "plot_headlines", "main"]

log = logging.getLogger(__name__)

# Code spans in a README that are commands (what made the folder), not file names or settings.
COMMAND_PREFIXES = ("tilemaxsim ", "python ", "python3 ", "bash ", "torchrun ", "/usr/bin/time ",
                    "TILEMAXSIM_", "CUDA_VISIBLE_DEVICES=", "TRITON_")
# Files that are parts of another record (read through it) or inputs, not measurements (ncu.csv:
# Nsight Compute's raw export, read through its summary).
NOT_MEASUREMENTS = {"evaluation.json", "manifest.json", "metadata-summary.json", "ncu.csv"}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One row of one result file, with the provenance of that file."""

    kind: str        # the writer's file name: dense, bench_compressed, plaid, reproduce, ...
    suite: str
    shape: str
    provider: str
    values: dict
    provenance: dict
    command: str
    source: str      # path relative to the results folder's parent
    order: tuple     # (commit rank in git log, date, source): larger is later

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.suite, self.shape, self.provider)


# ----------------------------------------------------------------------------------------------
# reading


def _read_text(path: Path) -> str:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def _plain_name(path: Path) -> str:
    return path.name[:-3] if path.name.endswith(".gz") else path.name


def _sibling(path: Path, name: str) -> Path | None:
    for candidate in (path.parent / name, path.parent / f"{name}.gz"):
        if candidate.exists():
            return candidate
    return None


def _log_provenance(path: Path) -> dict | None:
    """The ``provenance: {...}`` line a benchmark printed into ``<name>.log`` beside ``path``."""
    log_path = _sibling(path, _plain_name(path).rsplit(".", 1)[0] + ".log")
    if log_path is None:
        return None
    for line in _read_text(log_path).splitlines():
        if line.startswith("provenance: {"):
            try:
                return json.loads(line.split(": ", 1)[1])
            except json.JSONDecodeError:
                return None
    return None


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


class _History:
    """Commit order from ``git log`` of the repository that holds the results."""

    def __init__(self, repo: Path):
        self.repo = repo
        out = _git(repo, "log", "--topo-order", "--format=%H", "HEAD")
        if out is None:
            log.warning("git log failed in %s: latest is decided by provenance dates alone", repo)
        shas = (out or "").split()
        # git log lists the newest first; rank 0 is the oldest commit.
        self.rank = {sha: len(shas) - 1 - i for i, sha in enumerate(shas)}
        self._unknown: set[str] = set()

    def commit_rank(self, commit: str) -> int:
        """Position of ``commit`` (full or abbreviated) in git log; -1 when git does not know it."""
        if not commit:
            log.warning("a result file records no commit: it sorts before every known commit")
            return -1
        if commit in self.rank:
            return self.rank[commit]
        if len(commit) >= 7:
            for sha, rank in self.rank.items():
                if sha.startswith(commit):
                    return rank
        if commit not in self._unknown:
            self._unknown.add(commit)
            log.warning("commit %r is not in git log: its results sort before every known commit",
                        commit)
        return -1

    def file_added(self, path: Path) -> tuple[str, str]:
        """(commit, date) of the commit that added ``path``."""
        out = _git(self.repo, "log", "--diff-filter=A", "--format=%H %cI", "--", str(path))
        fields = (out or "").split()
        return (fields[-2], fields[-1]) if len(fields) >= 2 else ("unknown", "")


def _command_from_argv(argv) -> str:
    if not argv:
        return ""
    argv = [str(a) for a in argv]
    script = Path(argv[0])
    if script.suffix == ".py" and script.parent.name == "experiments":
        return shlex.join(["python", "-m", f"experiments.{script.stem}", *argv[1:]])
    return shlex.join(argv)


def _readme_commands(readme: Path) -> dict[str, str]:
    """Commands of a README: ``""`` -> its first command; a file or folder name (or glob) named in
    code on a line with a command (``- `dense.json`, `run5-db29b81/`: `bash ...` ``) -> that command."""
    commands: dict[str, str] = {}
    for line in readme.read_text(encoding="utf-8").splitlines():
        spans = [" ".join(s.split()) for s in line.split("`")[1::2]]
        # "<part>" stands for any part: a description, not a command.
        found = [s for s in spans if s.startswith(COMMAND_PREFIXES) and "<part>" not in s]
        if not found:
            continue
        for name in spans:
            if name not in found and " " not in name:
                for one in _expand(name.rstrip("/")):
                    commands.setdefault(one, found[0])
        commands.setdefault("", found[0])
    return commands


def _expand(pattern: str) -> list[str]:
    """``a.{csv,json}`` -> ``[a.csv, a.json]`` (one brace group)."""
    if "{" in pattern and "}" in pattern:
        head, rest = pattern.split("{", 1)
        body, tail = rest.split("}", 1)
        return [head + part + tail for part in body.split(",")]
    return [pattern]


def _readme_command(path: Path, root: Path, cache: dict) -> str:
    """The command of ``path`` from the nearest README at or above it that has one: a line naming
    the file, or a folder on the way down to it, wins over that README's first command."""
    folder = path.parent
    below = [_plain_name(path), path.name]
    while True:
        if folder not in cache:
            readme = folder / "README.md"
            cache[folder] = _readme_commands(readme) if readme.exists() else {}
        commands = cache[folder]
        relative = path.parent.relative_to(folder).as_posix()
        for name in (*below, f"{relative}/{_plain_name(path)}", f"{relative}/{path.name}"):
            for pattern, command in commands.items():
                if pattern and fnmatch.fnmatchcase(name, pattern):
                    return command
        if commands.get(""):
            return commands[""]
        if folder == root or root not in folder.parents:
            return ""
        below.append(folder.name)
        folder = folder.parent


def _number(text: str):
    if text in ("", "None"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def _device(provenance: dict) -> str:
    gpu = str(provenance.get("gpu") or "")
    return "cpu" if not gpu or gpu.startswith("none") else "cuda"


def _harness_rows(doc: dict, path: Path, root: Path) -> Iterable[tuple[str, str, str, dict]]:
    """(suite, shape, provider, values) of each row of a harness-format file."""
    kind = _plain_name(path).split(".")[0]
    meta = doc.get("meta") or {}
    for row in doc.get("rows") or []:
        if kind == "equivalence":
            if "pooled_from" in meta and not meta.get("condition"):
                meta = {**_pooled_meta(meta, root), **meta}
            dim = str(meta.get("condition") or "").split("-")[0] or "d?"
            config = Path(str(meta.get("config") or "")).stem
            device = meta.get("device") or _device(doc.get("provenance") or {})
            shape = f"{config or 'pooled'} {dim} k={row.get('k')} on {device}"
            argv = [str(a) for a in meta.get("argv") or []]
            first = int(_flag(argv, "--start-query") or row.get("first_query") or 0)
            if first or _flag(argv, "--limit-queries"):  # a range of the queries, not all
                shape += f", queries {first}-{first + int(row.get('queries') or 0)}"
            yield ("equivalence", shape, "tilemaxsim", row)
        elif kind == "pq_agreement":
            yield ("pq_agreement", f"M={row.get('M')}", "pq", row)
        elif "shape" in row:
            # bench-engines times each engine at several settings of one shape.
            shape = f"{row['shape']} {row['setting']}" if row.get("setting") else str(row["shape"])
            yield (str(row.get("suite", kind)), shape, str(row.get("provider", "")), row)


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _pooled_meta(meta: dict, root: Path) -> dict:
    """The config, condition and device of the first file a pooled equivalence file was built from."""
    for part in meta.get("pooled_from") or []:
        name = str(part.get("file", ""))
        for candidate in (root.parent / name, root / name.removeprefix(f"{root.name}/")):
            found = _sibling(candidate, candidate.name)  # the file, or it gzipped
            if found is not None:
                inner = json.loads(_read_text(found)).get("meta") or {}
                return {k: inner[k] for k in ("config", "condition", "device") if k in inner}
    return {}


def _reproduce_row(doc: dict, path: Path) -> tuple[str, str, str, dict]:
    systems = doc.get("systems") or {}

    def median(name):
        total = ((systems.get(name) or {}).get("summary") or {}).get("total") or {}
        return total.get("median_ms")

    values = {
        "condition": doc.get("condition"), "device": doc.get("device"),
        "num_docs": doc.get("num_docs"), "dim": doc.get("dim"), "candidates": doc.get("candidates"),
        "queries": doc.get("queries"), "stock_ms": median("stock"), "patched_ms": median("patched"),
        "patched_eager_ms": median("patched-eager"),
    }
    if values["stock_ms"] and values["patched_ms"]:
        values["speedup"] = values["stock_ms"] / values["patched_ms"]
    evaluation = _sibling(path, "evaluation.json")
    if evaluation is not None:
        ev = json.loads(_read_text(evaluation))
        identity = ev.get("identity") or {}
        values.update({k: identity.get(k) for k in ("identical_top10", "same_set_top10",
                                                    "identical_top100", "max_abs_score_diff")})
        for system, scores in (ev.get("quality") or {}).items():
            for metric, value in scores.items():
                values[f"{system}_{metric}"] = value
        # A check is OK, FAIL or MISSING against the config's expected number, or n/a without one.
        values["checks_failed"] = sum(1 for c in ev.get("checks") or []
                                      if c.get("status") in ("FAIL", "MISSING"))
    shape = (f"{doc.get('condition')} docs={doc.get('num_docs')} d={doc.get('dim')} "
             f"on {doc.get('device')}")
    return ("reproduce", shape, "patched", values)


def load_measurements(root: Path) -> list[Measurement]:
    """Every measurement of every result file under ``root`` (a ``results/`` folder)."""
    root = Path(root).resolve()
    toplevel = _git(root, "rev-parse", "--show-toplevel")
    history = _History(Path(toplevel.strip()) if toplevel else root)
    readme_cache: dict = {}
    found: list[Measurement] = []
    files = sorted(p for p in root.rglob("*") if p.is_file()
                   and _plain_name(p).endswith((".json", ".csv")))
    names = {str(p.parent / _plain_name(p)) for p in files}
    for path in files:
        name = _plain_name(path)
        if name in NOT_MEASUREMENTS:
            continue
        source = str(path.relative_to(root.parent))
        if name.endswith(".csv"):
            if str(path.parent / name[:-4]) + ".json" in names:
                continue  # the .json beside it carries the same rows with their provenance
            provenance = _log_provenance(path)
            if provenance is None:
                commit, date = history.file_added(path)
                provenance = {"commit": commit, "date": date, "gpu": "not recorded"}
            doc = {"provenance": provenance, "meta": {},
                   "rows": [{k: _number(v) for k, v in r.items()}
                            for r in csv.DictReader(io.StringIO(_read_text(path)))]}
        else:
            try:
                doc = json.loads(_read_text(path))
            except json.JSONDecodeError as err:
                log.warning("skipping %s: not JSON (%s)", source, err)
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("provenance"), dict):
                log.debug("skipping %s: no provenance", source)
                continue
        provenance = doc["provenance"]
        if "systems" in doc and "condition" in doc:
            rows = [_reproduce_row(doc, path)]
            kind = "reproduce"
        elif isinstance(doc.get("rows"), list):
            rows = list(_harness_rows(doc, path, root))
            kind = name.split(".")[0]
        else:
            log.debug("skipping %s: unknown schema", source)
            continue
        command = _command_from_argv((doc.get("meta") or {}).get("argv")) \
            or _readme_command(path, root, readme_cache)
        commit = str(provenance.get("commit") or "")
        order = (history.commit_rank(commit), str(provenance.get("date") or ""), source)
        for suite, shape, provider, values in rows:
            found.append(Measurement(kind, suite, shape, provider, dict(values), dict(provenance),
                                     command, source, order))
    log.info("read %d measurements from %d files under %s", len(found),
             len({m.source for m in found}), root)
    return found


def latest(measurements: Iterable[Measurement]) -> dict[tuple, Measurement]:
    """The latest measurement of each (kind, suite, shape, provider)."""
    best: dict[tuple, Measurement] = {}
    for m in measurements:
        if m.key not in best or m.order > best[m.key].order:
            best[m.key] = m
    return best


# ----------------------------------------------------------------------------------------------
# the headline workloads


def _f(value, digits=3, scale=1.0, unit=""):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value * scale:.{digits}f}{unit}"


def _same_file(m: Measurement, index: dict, suite=None, shape=None, provider=None):
    return index.get((m.source, suite or m.suite, shape or m.shape, provider or m.provider))


# The public alternatives each benchmark times beside ours (bench.py, bench_compressed.py); the
# floors (floor_*, read_per_document, ...) are bounds, not alternatives.
DENSE_ALTERNATIVES = ("flash_maxsim", "late_interaction_kernels", "torch_einsum", "torch_compile",
                      "colbert_packed")
RESIDUAL_ALTERNATIVES = ("late_interaction_kernels", "torch_decompress_score")
# PQ has no public kernel: its comparison is our dense kernel on the decoded documents.
PQ_ALTERNATIVES = ("tilemaxsim_dense_decoded",)


def _best_alternative(m: Measurement, index: dict, providers: tuple[str, ...]) -> str:
    others = [o for o in (index.get((m.source, m.suite, m.shape, p)) for p in providers)
              if o is not None and o.values.get("ms")]
    if not others:
        return "—"
    best = min(others, key=lambda o: (o.values["ms"], o.provider))
    return f"{best.provider} {_f(best.values['ms'])} ms"


def _kernel(metric: str, alternatives: tuple[str, ...] = DENSE_ALTERNATIVES):
    def fmt(m, index):
        v = m.values
        text = (f"{_f(v.get('ms'))} ms, {_f(v.get('docs_per_s'), 1, 1e-6)} M docs/s, "
                f"{_f(v.get('pct_read_bw'), 1)} % of read BW")
        if v.get("bytes_per_token") is not None:
            text += f", {_f(v.get('bytes_per_token'), 1)} B/token"
        if v.get("bytes_vs_dense") is not None:
            text += f", {_f(v.get('bytes_vs_dense'), 1)}x fewer bytes than fp16"
        return v.get(metric), text, _best_alternative(m, index, alternatives)
    return fmt


def _throughput_ratio(ref_shape: str, what: str):
    def fmt(m, index):
        ref = _same_file(m, index, shape=ref_shape)
        if ref is None:
            return None, "—", "—"
        mine = m.values.get("docs_per_s") or (m.values.get("size", 0) / m.values["ms"] * 1e3)
        base = ref.values.get("docs_per_s") or (ref.values.get("size", 0) / ref.values["ms"] * 1e3)
        ratio = mine / base if base else None
        return ratio, (f"{_f(ratio, 2)}x the docs/s of {ref_shape} ({_f(mine, 1, 1e-6)} vs "
                       f"{_f(base, 1, 1e-6)} M docs/s, {what})"), "—"
    return fmt


# Each formatter: (measurement, same-file index) -> (the plotted figure, what we measured, the
# alternative timed in the same run).


def _search(m, index):
    v = m.values
    stock = _same_file(m, index, provider="colbert-ai")
    alt = "—" if stock is None else (f"colbert-ai {_f(stock.values.get('dense_search'))} ms "
                                      f"after encoding, {_f(stock.values.get('search'))} ms whole")
    text = (f"{_f(v.get('dense_search'))} ms after encoding, {_f(v.get('search'))} ms whole "
            f"(encode {_f(v.get('encode'))} ms)")
    return v.get("dense_search"), text, alt


def _rerank(m, index):
    v = m.values
    text = (f"{_f(v.get('ours_scoring_ms'))} ms scoring "
            f"({_f(v.get('ours_rank_wall_ms'), 1)} ms rank() wall)")
    return v.get("ours_scoring_ms"), text, f"colbert-ai rank() {_f(v.get('stock_rank_wall_ms'), 1)} ms"


def _reproduce_latency(m, index):
    v = m.values
    text = f"{_f(v.get('patched_ms'))} ms per query, identical top-10 {_f(v.get('identical_top10'))}"
    return v.get("patched_ms"), text, f"colbert-ai {_f(v.get('stock_ms'))} ms"


def _reproduce_quality(m, index):
    v = m.values
    text = (f"MRR@10 {_f(v.get('patched_MRR@10'), 4)}, identical top-10 "
            f"{_f(v.get('identical_top10'))}, same set {_f(v.get('same_set_top10'))}; "
            f"{_f(v.get('patched_ms'))} ms")
    alt = f"colbert-ai MRR@10 {_f(v.get('stock_MRR@10'), 4)}, {_f(v.get('stock_ms'))} ms"
    return v.get("identical_top10"), text, alt


def _equivalence(m, index):
    v = m.values
    text = (f"top-k equal to exact MaxSim: {_f(v.get('topk_exact'), 4)} "
            f"(+{_f(v.get('topk_exact_ties'), 4)} ties) of {v.get('queries')} queries")
    return v.get("topk_exact"), text, f"equal to stock top-k {_f(v.get('topk_equal_stock'))}"


def _distributed(m, index):
    v = m.values
    one = _same_file(m, index, provider="sharded-1gpu")
    speedup = one.values["ms"] / v["ms"] if one and v.get("ms") else None
    text = (f"{_f(v.get('ms'), 1)} ms, {_f(speedup, 2)}x one GPU, "
            f"top-k equal {v.get('topk_equal_to_first')}")
    return speedup, text, "—" if one is None else f"1 GPU {_f(one.values['ms'], 1)} ms"


def _pq_agreement(m, index):
    v = m.values
    text = (f"top-10 overlap {_f(v.get('top10_overlap'))}, success@10 "
            f"{_f(v.get('success_at_10'))} ({v.get('num_queries')} queries)")
    return v.get("top10_overlap"), text, f"exact success@10 {_f(v.get('exact_success_at_10'))}"


def _engines(m, index):
    """The plugin's batch-1 latency beside stock colbert-ai's and fast-plaid's, same run (recall
    beside fast-plaid's, timed on the same queries; results/engines/REPORT.md compares equal recall)."""
    v = m.values
    stock = _same_file(m, index, provider="colbert-ai")
    fast = _same_file(m, index, provider="fast-plaid")
    text = f"{_f(v.get('p50_ms'))} ms p50 after encoding, recall@10 {_f(v.get('recall@10'))}"
    parts = []
    if stock is not None:
        parts.append(f"colbert-ai {_f(stock.values.get('p50_ms'))} ms")
    if fast is not None:
        parts.append(f"fast-plaid {_f(fast.values.get('p50_ms'))} ms (recall@10 "
                     f"{_f(fast.values.get('recall@10'))})")
    return v.get("p50_ms"), text, "; ".join(parts) or "—"


@dataclasses.dataclass(frozen=True)
class Headline:
    """A workload of the headline table: which rows it reads and what the paper claims for it."""

    name: str
    kind: str
    suite: str
    shape: str
    provider: str
    metric: str                      # the plotted figure's label
    fmt: Callable                    # (measurement, same-file index) -> (figure, text, alternative)
    paper: str = "—"

    @property
    def key(self):
        return (self.kind, self.suite, self.shape, self.provider)


# The paper (TileMaxSim, NVIDIA H100): "80.2% of peak HBM bandwidth", "82M documents/second
# (71.6M/s on real MS MARCO passages)", "cuts scoring latency at 100K candidates from 268 ms to
# 1.2 ms", "constant throughput from 100K to 500K documents", "cutting HBM I/O by up to ~31x",
# "rankings match reference MaxSim" (MS MARCO and three BEIR sets).
PQ_CLAIM = "HBM traffic up to ~31x lower than full embeddings"
HEADLINES: tuple[Headline, ...] = (
    Headline("dense padded, 1 query x 100k docs (Ld 128, d 128)", "dense", "dense",
             "1q N=100k Ld=128 d=128", "tilemaxsim", "% of read BW", _kernel("pct_read_bw"),
             "80.2 % of peak HBM bandwidth; 82 M docs/s (H100)"),
    Headline("dense packed, 1 query x 100k docs (mean 70 tokens)", "dense", "dense",
             "1q packed N=100k mean70 d=128", "tilemaxsim", "% of read BW", _kernel("pct_read_bw"),
             "71.6 M docs/s on real MS MARCO passages (H100)"),
    Headline("dense padded, 32 queries sharing 100k docs", "dense", "dense",
             "32q share N=100k Ld=128 d=128", "tilemaxsim", "M (query, doc) pairs/s",
             _kernel("docs_per_s")),
    Headline("dense packed, 32 queries x 100k docs", "dense", "dense",
             "32q packed N=100k mean70 d=128", "tilemaxsim", "M (query, doc) pairs/s",
             _kernel("docs_per_s")),
    Headline("dense throughput, 1M vs 100k docs", "dense", "dense", "1q N=1000000 Ld=128",
             "tilemaxsim", "docs/s ratio", _throughput_ratio("1q N=100000 Ld=128", "same run"),
             "constant throughput from 100K to 500K docs"),
    Headline("residual codes nbits 2, 1 query x 100k docs", "bench_compressed", "compressed",
             "1q N=100k mean70 C=65536 nbits=2 d=128", "tilemaxsim_residual", "M docs/s",
             _kernel("docs_per_s", RESIDUAL_ALTERNATIVES)),
    Headline("PQ M 16, 1 query x 100k docs", "bench_compressed", "compressed",
             "1q N=100k mean70 C=65536 nbits=2 d=128", "tilemaxsim_pq_M16", "M docs/s",
             _kernel("docs_per_s", PQ_ALTERNATIVES), PQ_CLAIM),
    Headline("PQ M 32, 1 query x 100k docs", "bench_compressed", "compressed",
             "1q N=100k mean70 C=65536 nbits=2 d=128", "tilemaxsim_pq_M32", "M docs/s",
             _kernel("docs_per_s", PQ_ALTERNATIVES), PQ_CLAIM),
    Headline("PLAID search, synthetic 1M passages, k 10", "plaid", "search",
             "synthetic1000000 k=10", "tilemaxsim", "ms after encoding", _search),
    Headline("engines: synthetic 8.8M passages, C 2^18, nbits 2, k 10", "engines", "latency",
             "8,841,823 passages k=10 defaults", "tilemaxsim", "ms p50 after encoding", _engines,
             "MS MARCO passage: 8.8M passages, 2^18 centroids"),
    Headline("PLAID search, wiki, k 10", "plaid", "search", "wiki2000 k=10", "tilemaxsim",
             "ms after encoding", _search),
    Headline("PLAID rerank of 100k candidates (scoring)", "plaid", "rerank", "pids=100000 Lq=32",
             "tilemaxsim", "ms", _rerank, "scoring at 100K candidates 268 ms -> 1.2 ms"),
    Headline("PLAID rerank, 1M vs 100k candidates", "plaid", "rerank", "pids=1000000 Lq=32",
             "tilemaxsim", "docs/s ratio", _throughput_ratio("pids=100000 Lq=32", "scoring"),
             "constant throughput from 100K to 500K docs"),
    Headline("reproduce: synthetic 1M passages, PLAID k 10 from query embeddings", "reproduce",
             "reproduce", "plaid-k10 docs=1000000 d=128 on cuda", "patched", "ms",
             _reproduce_latency),
    Headline("reproduce: synthetic rerank-100k, rank() per query", "reproduce", "reproduce",
             "rerank-100k docs=1000000 d=128 on cuda", "patched", "ms", _reproduce_latency,
             "268 ms -> 1.2 ms at 100K candidates"),
    Headline("reproduce: wiki-vital d128 k 10 (GPU)", "reproduce", "reproduce",
             "d128-k10 docs=10033 d=128 on cuda", "patched", "identical top-10", _reproduce_quality,
             "rankings match reference MaxSim"),
    Headline("equivalence: wiki-vital d128 k 10, all queries (CPU)", "equivalence", "equivalence",
             "wiki-vital d128 k=10 on cpu", "tilemaxsim", "fraction exact", _equivalence,
             "rankings match reference MaxSim"),
    Headline("equivalence: wiki-vital d128 k 1000, all queries (CPU)", "equivalence", "equivalence",
             "wiki-vital d128 k=1000 on cpu", "tilemaxsim", "fraction exact", _equivalence,
             "rankings match reference MaxSim"),
    Headline("two GPUs, dense 5.6M docs, 32 queries", "distributed", "distributed",
             "dense N=5592326 T=402653142 B=32 Lq=32 d=128 k=100", "sharded-2gpu", "speedup",
             _distributed, "data-parallel multi-GPU sharding"),
    Headline("PQ M 16 ranking agreement vs exact", "pq_agreement", "pq_agreement", "M=16", "pq",
             "top-10 overlap", _pq_agreement),
)


# ----------------------------------------------------------------------------------------------
# writing


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _markdown(headers: list[str], rows: list[list]) -> str:
    try:
        from tabulate import tabulate
    except ImportError:
        lines = ["| " + " | ".join(map(_cell, headers)) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
        return "\n".join(lines)
    return tabulate([[_cell(c) for c in row] for row in rows], headers=headers, tablefmt="github")


def _provenance_cells(m: Measurement) -> list[str]:
    p = m.provenance
    return [p.get("gpu") or "—", p.get("torch") or "—", p.get("triton") or "—", p.get("cuda") or "—",
            str(p.get("commit") or "—")[:7], str(p.get("date") or "—")[:16],
            f"`{m.command}`" if m.command else "—", f"[{Path(m.source).name}]({m.source})"]


PROVENANCE = ["GPU", "torch", "triton", "CUDA", "commit", "date (UTC)", "command", "file"]


def _index(measurements: Iterable[Measurement]) -> dict:
    return {(m.source, m.suite, m.shape, m.provider): m for m in measurements}


def headline_rows(measurements: list[Measurement]) -> list[tuple[Headline, Measurement | None,
                                                                tuple]]:
    """(headline, its latest measurement or None, (figure, text, alternative)) for each headline."""
    best = latest(measurements)
    index = _index(measurements)
    rows = []
    for h in HEADLINES:
        m = best.get(h.key)
        if m is None:
            log.warning("no measurement for headline %r (%s)", h.name, h.key)
        rows.append((h, m, h.fmt(m, index) if m is not None else (None, "—", "—")))
    return rows


def render_table(measurements: list[Measurement], table_path: Path, root: Path) -> str:
    """The text of TABLE.md: the headline workloads, then every latest measurement by kind."""
    root = Path(root).resolve()
    table_dir = Path(table_path).resolve().parent

    def relink(m: Measurement) -> Measurement:
        # Links in the table are relative to the table's folder.
        return dataclasses.replace(m, source=os.path.relpath(root.parent / m.source, table_dir))

    out = ["# Results: the latest measurement of each workload", "",
           "Generated by `tilemaxsim results` from the result files under `results/`; do not edit. "
           "Latest = the provenance commit latest in `git log`, then the provenance date. "
           "The paper's figures are from NVIDIA H100 runs; ours name their GPU. Synthetic data "
           "unless the workload names a collection.", "",
           "## Headline", ""]
    rows = []
    for h, m, (_, text, alt) in headline_rows(measurements):
        cells = _provenance_cells(relink(m)) if m else ["—"] * len(PROVENANCE)
        rows.append([h.name, text, alt, h.paper, *cells])
    out += [_markdown(["workload", "measured (latest)", "alternative, same run", "paper claims",
                       *PROVENANCE], rows), ""]

    best = sorted(latest(measurements).values(), key=lambda m: m.key)
    sections: dict[str, list[Measurement]] = {}
    for m in best:
        if "sweep" not in m.kind and "sweep" not in m.suite:  # launch-config sweeps: see the files
            sections.setdefault(m.kind, []).append(m)
    sources = {src: f"s{i + 1}" for i, src in
               enumerate(sorted({m.source for ms in sections.values() for m in ms}))}
    for kind, ms in sorted(sections.items()):
        out += [f"## All latest: {kind}", ""]
        fields = _section_fields(kind)
        rows = [[m.suite, m.shape, m.provider, *(_field(m.values, f) for f in fields),
                 str(m.provenance.get("commit") or "—")[:7], sources[m.source]] for m in ms]
        headers = ["M docs/s" if f == "docs_per_s" else f for f in fields]
        out += [_markdown(["suite", "workload", "provider", *headers, "commit", "source"], rows), ""]
    out += ["## Sources", ""]
    by_source = {m.source: m for ms in sections.values() for m in ms}
    rows = [[sources[src], *_provenance_cells(relink(by_source[src]))] for src in sorted(sources)]
    out += [_markdown(["source", *PROVENANCE], rows), ""]
    return "\n".join(out)


def _section_fields(kind: str) -> list[str]:
    return {
        "dense": ["ms", "docs_per_s", "pct_read_bw"],
        "bench_compressed": ["ms", "docs_per_s", "pct_read_bw", "bytes_per_token"],
        "plaid": ["ms", "encode", "dense_search", "ours_scoring_ms", "stock_rank_wall_ms",
                  "same_as_exact_rescore"],
        "distributed": ["ms", "docs_per_s", "world_size", "topk_equal_to_first"],
        "pq_agreement": ["bytes_per_token", "top10_overlap", "top100_overlap", "success_at_10"],
        "equivalence": ["queries", "candidates_equal", "topk_exact", "topk_exact_ties",
                        "topk_equal_stock"],
        "reproduce": ["stock_ms", "patched_ms", "speedup", "identical_top10", "stock_MRR@10",
                      "patched_MRR@10", "checks_failed"],
        "engines": ["p50_ms", "p99_ms", "qps", "recall@10", "recall@100", "success@10",
                    "gpu_bytes_per_token", "first_query_s"],
    }.get(kind, ["ms"])


def _field(values: dict, name: str) -> str:
    v = values.get(name)
    if name == "docs_per_s" and isinstance(v, (int, float)):
        v = v / 1e6
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# The README's headline block: (headline, its label there). It sits between these markers.
README_ROWS = (
    ("dense packed, 1 query x 100k docs (mean 70 tokens)",
     "dense packed MaxSim, 1 query × 100k docs (mean 70 tokens, d = 128)"),
    ("residual codes nbits 2, 1 query x 100k docs", "residual codes (nbits = 2), same docs"),
    ("PQ M 16, 1 query x 100k docs", "PQ codes (M = 16), same docs"),
    ("PLAID search, synthetic 1M passages, k 10",
     "PLAID search after encoding, synthetic 1M passages, k = 10"),
    ("PLAID rerank of 100k candidates (scoring)", "PLAID rerank of 100k candidates"),
    ("engines: synthetic 8.8M passages, C 2^18, nbits 2, k 10",
     "PLAID search at MS MARCO's size (synthetic 8.8M passages, C = 2^18, k = 10), each engine's defaults"),
)
README_START = "<!-- headline:start"
README_END = "<!-- headline:end -->"


def _short(text: str, parts: int = 2) -> str:
    return ", ".join(text.split(", ")[:parts])


def render_readme_headline(measurements: list[Measurement], table_link: str) -> str:
    """The rows of the README's headline block (between its markers), from the same headlines."""
    by_name = {h.name: (m, out) for h, m, out in headline_rows(measurements)}
    row_gpu = {name: str(by_name[name][0].provenance.get("gpu")) for name, _ in README_ROWS
               if by_name.get(name) and by_name[name][0] is not None}
    counts = collections.Counter(row_gpu.values())
    # The card most rows were measured on heads the column; a row from another card names it.
    main_gpu = min(counts, key=lambda gpu: (-counts[gpu], gpu)) if counts else None
    rows = []
    for name, label in README_ROWS:
        m, (_, text, alt) = by_name[name]
        if row_gpu.get(name, main_gpu) != main_gpu:
            label = f"{label} [{row_gpu[name]}]"
        rows.append([label, _short(text), _short(alt, 1)])
    table = _markdown([f"workload ({main_gpu or 'no GPU recorded'})", "tilemaxsim",
                       "alternative, same run"], rows)
    return (f"{table}\n\nSynthetic data, not MS MARCO or BEIR. Every figure, its command, versions "
            f"and commit, and the paper's claim beside it: [`{table_link}`]({table_link}).")


def update_readme(path: Path, block: str) -> None:
    """Replace what lies between the README's headline markers with ``block``."""
    text = Path(path).read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"--readme {path}: no '{README_START} ...' / '{README_END}' markers")
    start = text.index("\n", start) + 1
    Path(path).write_text(text[:start] + block + "\n" + text[end:], encoding="utf-8")


def plot_headlines(measurements: list[Measurement], path: Path) -> Path | None:
    """One panel per headline: its figure in every measurement, by commit order."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed (pip install .[eval]): %s not written", path)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = _index(measurements)
    series = []
    for h in HEADLINES:
        points = {}
        for m in sorted((m for m in measurements if m.key == h.key), key=lambda m: m.order):
            figure = h.fmt(m, index)[0]
            if isinstance(figure, (int, float)) and not isinstance(figure, bool):
                scale = 1e-6 if h.metric.startswith("M ") else 1.0
                points[m.order] = (str(m.provenance.get("commit", "?"))[:7], figure * scale)
        if points:
            series.append((h, [points[k] for k in sorted(points)]))
    if not series:
        log.warning("no headline figures to plot")
        return None
    cols = 3
    rows = math.ceil(len(series) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (h, points) in zip(axes.flat, series):
        xs = range(len(points))
        ax.plot(xs, [y for _, y in points], marker="o")
        ax.set_xticks(list(xs), [c for c, _ in points], rotation=60, fontsize=6)
        ax.set_title(h.name, fontsize=8)
        ax.set_ylabel(h.metric, fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.suptitle("Headline figures over commits (each point one result file, in git order)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilemaxsim results", description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="results", help="folder of committed result files")
    parser.add_argument("--out", default=None, help="table to write (default RESULTS/TABLE.md)")
    parser.add_argument("--plot", default=None,
                        help="plot to write (default RESULTS/headline_over_commits.png)")
    parser.add_argument("--no-plot", action="store_true", help="write the table only")
    parser.add_argument("--readme", default=None,
                        help="also rewrite the headline block between this README's markers")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    root = Path(args.results)
    if not root.is_dir():
        raise ValueError(f"--results {root} is not a folder")
    out = Path(args.out) if args.out else root / "TABLE.md"
    measurements = load_measurements(root)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_table(measurements, out, root) + "\n", encoding="utf-8")
    print(f"wrote {out} ({len(latest(measurements))} workloads, {len(measurements)} measurements)")
    targets_out = out.parent / "TARGETS.md"
    targets.write(targets_out, targets.tables([root], TARGET_GPUS), "tilemaxsim results")
    print(f"wrote {targets_out}")
    if args.readme:
        readme = Path(args.readme)
        link = os.path.relpath(out.resolve(), readme.resolve().parent)
        update_readme(readme, render_readme_headline(measurements, link))
        print(f"wrote the headline block of {readme}")
    if not args.no_plot:
        plot = Path(args.plot) if args.plot else root / "headline_over_commits.png"
        plot = plot_headlines(measurements, plot)
        if plot is not None:
            print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
