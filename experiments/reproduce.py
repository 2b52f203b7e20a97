"""Reproduce a results table from its YAML config: stock PLAID vs PLAID patched with our kernels.

``tilemaxsim reproduce configs/<table>.yaml [--dry-run] [--steps ...]`` runs four steps; each
can run alone, so the data and the evaluation can stay on a machine with ir_datasets and ranx
while the search runs where the GPU is:

=============  ==================================================================================
``prepare``    collection, queries and qrels through ir_datasets (plain files), the checkpoint
               and the PLAID index (or the synthetic index), each in a folder named by a hash of
               exactly the settings it depends on, under ``<out>/cache`` and ``<out>/<name>``.
``search``     per condition, on one loaded index and the same query embeddings: stock PLAID
               (only the plugin's ``compat`` group) then patched PLAID (``compat`` + ``scoring``);
               per-stage latency (CUDA events on a GPU, wall clock on a CPU, labelled so) over
               warm queries; TREC run files. Needs only torch, colbert-ai and this package.
``evaluate``   ranx: MRR@10, nDCG@10, Recall@100/@1000 and ``ranx.compare`` with a paired test;
               ranking identity of the two runs; OK/FAIL against the config's expected numbers.
``report``     ``report.md`` and plots, reading only the files the other steps wrote.
=============  ==================================================================================

A condition with ``candidates_sweep: [1000, 3000, 10000]`` is that many conditions
(``<name>-1k``, ``<name>-3k``, ``<name>-10k``), identical but for the number of sampled
candidates each query reranks: the points of the report's latency-vs-candidates plot.

Progress goes to stderr through ``logging``; the OK / FAIL line of each expected number goes to
stdout.

Folders are named by a hash of their inputs and hold a ``manifest.json`` with the full key: a
cached checkpoint, dataset or index is reused only when the key matches (and the runner says
so); results of a changed condition land in a new folder, and ``evaluate`` refuses runs whose
manifest does not match the current config. Search results are always recomputed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import pathlib
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "ConfigError",
    "resolve_config",
    "STEPS",
    "SYSTEMS",
    "Condition",
    "Experiment",
    "StageTimer",
    "load_config",
    "plan_experiment",
    "run_prepare",
    "run_search",
    "run_evaluate",
    "run_report",
    "check_expected",
    "main",
]

STEPS = ("prepare", "search", "evaluate", "report")
SYSTEMS = ("stock", "patched")
# On a GPU the plugin runs each query as one CUDA graph replay, whose stages cannot be timed
# apart; a second, timing-only pass runs it eagerly for the per-stage breakdown.
PATCHED_EAGER = "patched-eager"
# Bump when the meaning of a cached folder's content changes, so old folders are not reused.
FORMAT_VERSION = 1

DEFAULT_SEARCH = {
    "device": "auto",
    "warmup_queries": 5,
    # Encode the queries during `prepare` and store them next to the index: the search then
    # needs no checkpoint or transformers (only the index and the embeddings). true: all
    # queries; an integer N: the first N (fp16 embeddings take N * 32 * dim * 2 bytes to carry).
    "precompute_queries": False,
    "stock_groups": ["compat"],
    "patched_groups": ["compat", "scoring"],
    "seed": 0,
}
DEFAULT_EVALUATION = {
    "metrics": ["MRR@10", "nDCG@10", "Recall@100", "Recall@1000"],
    "stat_test": "student",
    "max_p": 0.01,
    "identity_k": [10, 100],
    "rbo_p": 0.9,
}
DEFAULT_INDEX = {"doc_maxlen": 180, "kmeans_niters": 4}
DEFAULT_TOLERANCE = 1e-3


log = logging.getLogger(__name__)


def _log(message: str) -> None:
    """Progress of a step (stderr, through logging); check results go to stdout (``_say``)."""
    log.info(message)


def _say(message: str) -> None:
    """The command's own output: one OK / FAIL / MISSING line per expected number."""
    print(message, flush=True)


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# Hand-written: no config library (omegaconf, pydantic) is a dependency of the package, and
# this nine-line recursive dict merge is all that the configs need.
def _deep_merge(base: dict, override: dict | None) -> dict:
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclass
class Condition:
    """One table row: a checkpoint, an index and PLAID's knobs, with its expected numbers."""

    name: str
    plaid: dict  # k, ncells, centroid_score_threshold, ndocs, nbits
    checkpoint: dict | None  # {"minilm_dim": d} or {"path": ...}; None for synthetic indexes
    index: dict  # doc_maxlen, kmeans_niters (built indexes)
    synthetic: dict | None  # SyntheticIndexSpec fields (synthetic indexes)
    candidates: int | None  # rerank this many sampled pids instead of PLAID's stages 1-3
    expected: dict
    queries: int | None = None  # search only the first N queries (large candidate counts)
    sweep: str | None = None  # the candidates_sweep entry this condition is one point of
    # Every setting that defines the row, flat and readable ("plaid.k", "synthetic.doclen_median",
    # "candidates"): written to latency.json so a plot can check its points differ in one key.
    settings: dict = field(default_factory=dict)
    data_key: dict | None = None
    index_key: dict = field(default_factory=dict)
    checkpoint_key: dict | None = None
    key: dict = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return f"{self.name}-{_hash(self.key)}"


@dataclass
class Experiment:
    """A parsed config with every folder it reads or writes."""

    name: str
    path: pathlib.Path
    raw: dict
    label: str
    out: pathlib.Path
    dataset: dict | None
    search: dict
    evaluation: dict
    conditions: list[Condition]

    @property
    def root(self) -> pathlib.Path:
        return self.out / self.name

    @property
    def cache(self) -> pathlib.Path:
        return self.out / "cache"

    def data_dir(self, condition: Condition) -> pathlib.Path | None:
        if condition.data_key is None:
            return None
        return self.root / f"data-{_hash(condition.data_key)}"

    def checkpoint_dir(self, condition: Condition) -> pathlib.Path | None:
        if condition.checkpoint_key is None:
            return None
        if "path" in condition.checkpoint_key:
            return None  # a user's checkpoint is used where it is
        return self.cache / "checkpoints" / _hash(condition.checkpoint_key)

    def index_dir(self, condition: Condition) -> pathlib.Path:
        return self.cache / "indexes" / _hash(condition.index_key)

    def results_dir(self, condition: Condition) -> pathlib.Path:
        return self.root / "results" / condition.slug

    @property
    def report_dir(self) -> pathlib.Path:
        return self.root / "report"


def _plaid_knobs(plaid: dict) -> dict:
    """Fill the knobs a condition leaves null as ``Searcher.dense_search`` does for its k."""
    from tilemaxsim_plaid.plaid.scoring import dense_search_knobs

    k = int(plaid["k"])
    defaults = dense_search_knobs(k)
    filled = {"k": k, "nbits": int(plaid.get("nbits", 2))}
    for knob, value in defaults.items():
        filled[knob] = plaid.get(knob) if plaid.get(knob) is not None else value
    return filled


class ConfigError(ValueError):
    """A reproduction config that cannot be used: the message names the file and the field."""


# Every key a config may hold, per section: anything else is refused with the closest valid key,
# so a misspelt knob (``max_pasages``) cannot silently fall back to a default.
_PLAID_KEYS = {"k", "ncells", "centroid_score_threshold", "ndocs", "nbits"}
_DATASET_KEYS = {"ir_datasets", "max_passages", "max_queries", "seed"}
_CHECKPOINT_KEYS = {"minilm_dim", "path"}
_SCHEMA = {
    "top": {"name", "label", "dataset", "synthetic", "checkpoint", "index", "search", "evaluation",
            "plaid", "conditions"},
    "dataset": _DATASET_KEYS,
    "synthetic": None,  # SyntheticIndexSpec's fields, read when a config has a synthetic section
    "checkpoint": _CHECKPOINT_KEYS,
    "index": set(DEFAULT_INDEX),
    "search": set(DEFAULT_SEARCH),
    "evaluation": set(DEFAULT_EVALUATION),
    "plaid": _PLAID_KEYS,
    "condition": {"name", "plaid", "index", "synthetic", "checkpoint", "dataset", "candidates",
                  "candidates_sweep", "expected", "queries"},
    "expected": {"stock", "patched", "identity", "tolerance"},
}


# Hand-written: pydantic and jsonschema are not dependencies of the package, and neither names
# the closest valid key of a misspelt one, which is what a config author needs.
def _check_keys(path: pathlib.Path, where: str, mapping, section: str) -> None:
    import difflib

    if mapping is None:
        return
    if not isinstance(mapping, dict):
        raise ConfigError(f"{path}: {where} must be a mapping, got {type(mapping).__name__}")
    allowed = _SCHEMA[section]
    if allowed is None:
        import dataclasses

        from tilemaxsim_plaid.synthetic import SyntheticIndexSpec

        allowed = {spec_field.name for spec_field in dataclasses.fields(SyntheticIndexSpec)}
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(allowed))}"
            raise ConfigError(f"{path}: unknown key {key!r} in {where}{hint}")


def _validate_schema(path: pathlib.Path, raw: dict) -> None:
    _check_keys(path, "the top level", raw, "top")
    for section in ("dataset", "synthetic", "checkpoint", "index", "search", "evaluation", "plaid"):
        _check_keys(path, f"'{section}'", raw.get(section), section)
    if not isinstance(raw["conditions"], list) or not raw["conditions"]:
        raise ConfigError(f"{path}: 'conditions' must be a non-empty list")
    for number, entry in enumerate(raw["conditions"]):
        where = f"condition #{number}" + (f" ({entry['name']!r})" if isinstance(entry, dict) and "name" in entry else "")
        _check_keys(path, where, entry, "condition")
        for section in ("plaid", "index", "synthetic", "checkpoint", "dataset", "expected"):
            _check_keys(path, f"{where}: '{section}'", entry.get(section), section)


# A sweep needs this many points: a line through two points shows no trend.
MIN_SWEEP_POINTS = 3


def _count_name(count: int) -> str:
    """1000 -> "1k", 30000 -> "30k", 1000000 -> "1m", 300 -> "300": a sweep point's name suffix."""
    for suffix, unit in (("m", 1_000_000), ("k", 1_000)):
        if count >= unit and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def _expand_sweeps(path: pathlib.Path, entries: list) -> list[tuple[dict, str | None]]:
    """Each ``candidates_sweep: [n1, n2, ...]`` entry becomes one condition per count, named
    ``<name>-<count>`` (``rerank-1k``), identical but for ``candidates``; other entries as they are.

    Returns:
        ``(entry, sweep name or None)`` per condition, in config order.
    """
    expanded = []
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict) or "candidates_sweep" not in entry:
            expanded.append((entry, None))
            continue
        name = entry.get("name", f"#{number}")
        counts = entry["candidates_sweep"]
        if "candidates" in entry:
            raise ConfigError(f"{path}: condition {name!r}: give 'candidates' or "
                              "'candidates_sweep', not both")
        if (not isinstance(counts, list) or not all(isinstance(c, int) and not isinstance(c, bool)
                                                    and c >= 1 for c in counts)):
            raise ConfigError(f"{path}: condition {name!r}: candidates_sweep must be a list of "
                              f"integers >= 1, got {counts!r}")
        if len(set(counts)) < MIN_SWEEP_POINTS or len(set(counts)) != len(counts):
            raise ConfigError(f"{path}: condition {name!r}: candidates_sweep needs at least "
                              f"{MIN_SWEEP_POINTS} different counts, each once, got {counts!r}")
        base = {key: value for key, value in entry.items() if key != "candidates_sweep"}
        for count in sorted(counts):
            expanded.append(({**base, "name": f"{name}-{_count_name(count)}", "candidates": count},
                             name))
    return expanded


def _flat(prefix: str, mapping: dict | None) -> dict:
    return {f"{prefix}.{key}": value for key, value in (mapping or {}).items()}


def resolve_config(name_or_path) -> pathlib.Path:
    """A config by path, or by name (``wiki-vital-cpu``) from the configs shipped with the package.

    Raises:
        ConfigError: when neither a file of that path nor a shipped config of that name exists.
    """
    path = pathlib.Path(name_or_path)
    if path.is_file():
        return path
    stem = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else path.name
    for folder in _config_folders():
        candidate = folder / f"{stem}.yaml"
        if candidate.is_file():
            return candidate
    known = sorted({p.stem for folder in _config_folders() for p in folder.glob("*.yaml")})
    raise ConfigError(f"{name_or_path}: no such config file, and no shipped config of that name "
                      f"(shipped: {', '.join(known)})")


def _config_folders() -> list[pathlib.Path]:
    """The checkout's configs/ (when run from one), then the copy installed with the package."""
    folders = [pathlib.Path(__file__).resolve().parent.parent / "configs"]
    try:
        import importlib.resources

        folders.append(pathlib.Path(str(importlib.resources.files("tilemaxsim_plaid.configs"))))
    except (ModuleNotFoundError, TypeError):
        pass
    return [folder for folder in folders if folder.is_dir()]


def load_config(path, out="runs") -> Experiment:
    """Parse and validate a reproduction config; compute every condition's cache keys.

    Args:
        path: a YAML file, or the name of a shipped config (``wiki-vital-cpu``).

    Raises:
        ConfigError: naming the config file and the offending field (unknown keys come with the
            closest valid key), a YAML syntax error, or a config that does not exist.
    """
    import yaml

    path = resolve_config(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for required in ("name", "conditions"):
        if required not in raw:
            raise ConfigError(f"{path}: missing required field {required!r}")
    _validate_schema(path, raw)
    dataset, synthetic = raw.get("dataset"), raw.get("synthetic")
    if (dataset is None) == (synthetic is None):
        raise ConfigError(f"{path}: give exactly one of 'dataset' and 'synthetic'")
    search = _deep_merge(DEFAULT_SEARCH, raw.get("search"))
    evaluation = _deep_merge(DEFAULT_EVALUATION, raw.get("evaluation"))
    conditions = []
    names = set()
    for number, (entry, sweep) in enumerate(_expand_sweeps(path, raw["conditions"])):
        if "name" not in entry or "plaid" not in entry:
            raise ConfigError(f"{path}: condition #{number} needs 'name' and 'plaid'")
        if entry["name"] in names:
            raise ConfigError(f"{path}: condition name {entry['name']!r} is used twice")
        names.add(entry["name"])
        plaid = _plaid_knobs(_deep_merge(raw.get("plaid", {}), entry["plaid"]))
        condition = Condition(
            name=entry["name"],
            plaid=plaid,
            checkpoint=None,
            index=_deep_merge(DEFAULT_INDEX, _deep_merge(raw.get("index", {}), entry.get("index"))),
            synthetic=None,
            candidates=entry.get("candidates"),
            expected=entry.get("expected") or {},
            queries=entry.get("queries"),
            sweep=sweep,
        )
        if synthetic is not None:
            spec = _deep_merge(synthetic, entry.get("synthetic"))
            spec["nbits"] = plaid["nbits"]
            condition.synthetic = spec
            condition.index_key = {"synthetic": spec, "format": FORMAT_VERSION}
        else:
            checkpoint = _deep_merge(raw.get("checkpoint", {}), entry.get("checkpoint"))
            if not ("minilm_dim" in checkpoint) ^ ("path" in checkpoint):
                raise ConfigError(
                    f"{path}: condition {entry['name']!r}: checkpoint needs exactly one of "
                    "'minilm_dim' (build the offline MiniLM checkpoint) and 'path'"
                )
            condition.checkpoint = checkpoint
            condition.checkpoint_key = {
                **checkpoint,
                "doc_maxlen": condition.index["doc_maxlen"],
                "format": FORMAT_VERSION,
            }
            # A condition may name its own dataset (one table over several BEIR sets).
            condition.data_key = {**_deep_merge(dataset, entry.get("dataset")),
                                  "format": FORMAT_VERSION}
            condition.index_key = {
                "data": _hash(condition.data_key),
                "checkpoint": _hash(condition.checkpoint_key),
                "nbits": plaid["nbits"],
                **condition.index,
                "format": FORMAT_VERSION,
            }
        if condition.candidates is not None and int(condition.candidates) < 1:
            raise ConfigError(f"{path}: condition {entry['name']!r}: candidates must be >= 1")
        condition.settings = {
            **_flat("plaid", plaid), "candidates": condition.candidates,
            "queries": condition.queries,
            **(_flat("synthetic", condition.synthetic) if condition.synthetic is not None else {
                **_flat("dataset", {k: v for k, v in condition.data_key.items() if k != "format"}),
                **_flat("checkpoint", condition.checkpoint), **_flat("index", condition.index)}),
        }
        condition.key = {
            "index": _hash(condition.index_key),
            "data": _hash(condition.data_key) if condition.data_key else None,
            "plaid": plaid,
            "candidates": condition.candidates,
            "queries": condition.queries,
            "search": search,
        }
        conditions.append(condition)
    return Experiment(
        name=str(raw["name"]),
        path=path,
        raw=raw,
        label=str(raw.get("label", raw["name"])),
        out=pathlib.Path(out),
        dataset=dataset,
        search=search,
        evaluation=evaluation,
        conditions=conditions,
    )


# ---------------------------------------------------------------------------------------------
# Manifests: what a folder was made from
# ---------------------------------------------------------------------------------------------


def _read_manifest(folder: pathlib.Path) -> dict | None:
    manifest = folder / "manifest.json"
    return json.loads(manifest.read_text()) if manifest.exists() else None


def _write_manifest(folder: pathlib.Path, key: dict, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(
        json.dumps({"key": key, "complete": True, **extra}, indent=2, default=str)
    )


def _reusable(folder: pathlib.Path, key: dict) -> bool:
    """True when ``folder`` was completed from exactly ``key``; a mismatch is an error."""
    manifest = _read_manifest(folder)
    if manifest is None or not manifest.get("complete"):
        return False
    if manifest["key"] != json.loads(json.dumps(key, default=str)):
        raise RuntimeError(
            f"{folder} was made from other settings ({manifest['key']}), not {key}: "
            "delete it to rebuild"
        )
    return True


def _fresh(folder: pathlib.Path) -> pathlib.Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


# ---------------------------------------------------------------------------------------------
# prepare: data, checkpoint, index
# ---------------------------------------------------------------------------------------------


def _clean_text(text: str) -> str:
    # One passage per TSV line: tabs and newlines inside a passage would split it.
    return " ".join(str(text).split())


def _subsample(dataset: dict, doc_ids: list[str], queries: dict[str, str],
               qrels: dict[str, dict[str, int]]):
    """Pick the queries and passages of a smaller collection, deterministically.

    Queries with a relevant passage are shuffled with the seed and taken in order while their
    relevant passages fit in ``max_passages``; the remaining room is filled with other
    passages drawn with the same seed. Passage order stays the collection's order.
    """
    max_passages, max_queries = dataset.get("max_passages"), dataset.get("max_queries")
    rng = random.Random(dataset.get("seed", 0))
    judged = [qid for qid in queries if any(rel > 0 for rel in qrels.get(qid, {}).values())]
    known = set(doc_ids)
    rng.shuffle(judged)
    keep_docs: set[str] = set()
    keep_queries = []
    for qid in judged:
        if max_queries is not None and len(keep_queries) >= max_queries:
            break
        relevant = {doc for doc, rel in qrels[qid].items() if rel > 0 and doc in known}
        if not relevant:
            continue
        if max_passages is not None and len(keep_docs | relevant) > max_passages:
            continue
        keep_docs |= relevant
        keep_queries.append(qid)
    if max_passages is None:
        keep_docs = known
    else:
        others = [doc for doc in doc_ids if doc not in keep_docs]
        rng.shuffle(others)
        keep_docs |= set(others[: max(0, max_passages - len(keep_docs))])
    kept_ids = [doc for doc in doc_ids if doc in keep_docs]
    kept_queries = {qid: queries[qid] for qid in sorted(keep_queries)}
    kept_qrels = {qid: {doc: rel for doc, rel in qrels[qid].items() if doc in keep_docs}
                  for qid in kept_queries}
    return kept_ids, kept_queries, kept_qrels


def prepare_data(experiment: Experiment, condition: Condition, *, dry_run=False) -> pathlib.Path:
    """collection.tsv (pid<TAB>text), docids.txt, queries.tsv, qrels.trec from ir_datasets."""
    folder = experiment.data_dir(condition)
    if _reusable(folder, condition.data_key):
        _log(f"[prepare] data: reusing {folder} (same settings)")
        return folder
    dataset = condition.data_key
    _log(f"[prepare] data: {'would build' if dry_run else 'building'} {folder} from "
         f"ir_datasets {dataset['ir_datasets']!r} (max_passages={dataset.get('max_passages')}, "
         f"max_queries={dataset.get('max_queries')})")
    if dry_run:
        return folder
    from tqdm import tqdm

    from tilemaxsim_plaid.datasets import load_dataset
    from tilemaxsim_plaid.evaluation import write_trec_qrels

    source = load_dataset(dataset["ir_datasets"])
    queries = {q.query_id: _clean_text(q.default_text()) for q in source.queries_iter()}
    # Not ranx.Qrels.from_ir_datasets: it calls ir_datasets.load itself, past load_dataset's
    # offline check, so a missing public dataset would start a download.
    qrels = {qid: {doc: int(rel) for doc, rel in judged.items()}
             for qid, judged in source.qrels_dict().items()}
    doc_ids = [doc.doc_id for doc in tqdm(source.docs_iter(), desc="doc ids", unit="doc",
                                          total=source.docs_count())]
    kept_ids, kept_queries, kept_qrels = _subsample(dataset, doc_ids, queries, qrels)
    if not kept_queries:
        raise RuntimeError(f"{dataset['ir_datasets']}: no judged query fits the subsample")
    kept = set(kept_ids)
    staging = _fresh(folder.with_name(folder.name + ".partial"))
    with open(staging / "collection.tsv", "w", encoding="utf-8") as collection, \
            open(staging / "docids.txt", "w", encoding="utf-8") as ids:
        pid = 0
        for doc in tqdm(source.docs_iter(), desc="collection", unit="doc",
                        total=source.docs_count()):
            if doc.doc_id in kept:
                collection.write(f"{pid}\t{_clean_text(doc.default_text())}\n")
                ids.write(f"{doc.doc_id}\n")
                pid += 1
    with open(staging / "queries.tsv", "w", encoding="utf-8") as handle:
        for qid, text in kept_queries.items():
            handle.write(f"{qid}\t{text}\n")
    write_trec_qrels(kept_qrels, staging / "qrels.trec")
    _write_manifest(staging, condition.data_key, passages=len(kept_ids),
                    queries=len(kept_queries), source_passages=len(doc_ids),
                    source_queries=len(queries))
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    return folder


def _read_collection(folder: pathlib.Path) -> list[str]:
    with open(folder / "collection.tsv", encoding="utf-8") as handle:
        return [line.rstrip("\n").split("\t", 1)[1] for line in handle]


def _read_queries(folder: pathlib.Path) -> dict[str, str]:
    with open(folder / "queries.tsv", encoding="utf-8") as handle:
        return dict(line.rstrip("\n").split("\t", 1) for line in handle)


def _read_docids(folder: pathlib.Path) -> list[str]:
    with open(folder / "docids.txt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


class CheckpointUnavailableError(FileNotFoundError):
    """The config names a checkpoint that is not on this machine."""


def _resolve_user_checkpoint(path_or_name: str) -> str:
    """A local checkpoint folder, or a hub name already in the local Hugging Face cache."""
    if os.path.isdir(path_or_name):
        return path_or_name
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=path_or_name, local_files_only=True)
    except Exception as error:  # any hub failure means: not available offline
        raise CheckpointUnavailableError(
            f"checkpoint {path_or_name!r} is neither a folder on this machine nor in the local "
            "Hugging Face cache. Put the colbert-ai checkpoint folder (config.json, weights, "
            "tokenizer, artifact.metadata; e.g. the colbertv2.0 release) somewhere and set "
            "'checkpoint: {path: /that/folder}' in the config, or download the hub model "
            "first with network access."
        ) from error


def prepare_checkpoint(experiment: Experiment, condition: Condition, *, dry_run=False) -> str:
    if "path" in condition.checkpoint:
        if dry_run:
            _log(f"[prepare] checkpoint: would use {condition.checkpoint['path']}")
            return condition.checkpoint["path"]
        return _resolve_user_checkpoint(condition.checkpoint["path"])
    folder = experiment.checkpoint_dir(condition)
    if _reusable(folder, condition.checkpoint_key):
        _log(f"[prepare] checkpoint: reusing {folder} (same settings)")
        return str(folder)
    dim = int(condition.checkpoint["minilm_dim"])
    _log(f"[prepare] checkpoint: {'would build' if dry_run else 'building'} MiniLM d={dim} at {folder}")
    if dry_run:
        return str(folder)
    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint

    _fresh(folder)
    build_minilm_checkpoint(folder, dim=dim, doc_maxlen=int(condition.index["doc_maxlen"]))
    _write_manifest(folder, condition.checkpoint_key)
    return str(folder)


def prepare_index(experiment: Experiment, condition: Condition, *, dry_run=False) -> pathlib.Path:
    """Build (or reuse) the condition's PLAID index; returns the index folder."""
    folder = experiment.index_dir(condition)
    index_path = folder / "index"
    if _reusable(folder, condition.index_key):
        _log(f"[prepare] index: reusing {index_path} (same settings)")
        return index_path
    if condition.synthetic is not None:
        from tilemaxsim_plaid.synthetic import SyntheticIndexSpec

        spec = SyntheticIndexSpec(**condition.synthetic)
        _log(f"[prepare] index: {'would write' if dry_run else 'writing'} a synthetic index of "
             f"{spec.num_passages:,} passages (dim {spec.dim}, nbits {spec.nbits}) at {index_path}")
        if dry_run:
            return index_path
        from tilemaxsim_plaid.synthetic import write_synthetic_index

        folder.mkdir(parents=True, exist_ok=True)
        summary = write_synthetic_index(spec, index_path)
        _write_manifest(folder, condition.index_key, synthetic=summary)
        return index_path
    data = experiment.data_dir(condition)
    checkpoint = prepare_checkpoint(experiment, condition, dry_run=dry_run)
    _log(f"[prepare] index: {'would build' if dry_run else 'building'} PLAID index "
         f"(nbits={condition.plaid['nbits']}) of {data} with {checkpoint} at {index_path}")
    if dry_run:
        return index_path
    from tilemaxsim_plaid.plaid.checkpoint import build_plaid_index

    _fresh(folder)
    started = time.perf_counter()
    build_plaid_index(
        checkpoint, _read_collection(data), folder, "index", nbits=condition.plaid["nbits"],
        doc_maxlen=int(condition.index["doc_maxlen"]),
        kmeans_niters=int(condition.index["kmeans_niters"]),
    )
    _write_manifest(folder, condition.index_key, checkpoint=checkpoint, data=str(data),
                    seconds=time.perf_counter() - started)
    return index_path


def _query_embeddings_path(experiment: Experiment, condition: Condition) -> pathlib.Path:
    key = {"data": condition.data_key, "limit": experiment.search["precompute_queries"]}
    return experiment.index_dir(condition) / f"queries-{_hash(key)}.pt"


def precompute_query_embeddings(experiment: Experiment, condition: Condition, *,
                                dry_run=False) -> pathlib.Path:
    """Encode every query once with the condition's checkpoint: fp16 [num_queries, Lq, dim]."""
    path = _query_embeddings_path(experiment, condition)
    if path.exists():
        _log(f"[prepare] query embeddings: reusing {path}")
        return path
    _log(f"[prepare] query embeddings: {'would encode' if dry_run else 'encoding'} to {path}")
    if dry_run:
        return path
    import torch
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    from tilemaxsim_plaid.plaid import enabled

    checkpoint = prepare_checkpoint(experiment, condition)
    queries = _read_queries(experiment.data_dir(condition))
    limit = experiment.search["precompute_queries"]
    if limit is not True:
        queries = dict(list(queries.items())[: int(limit)])
    with enabled(groups=("compat",)):
        encoder = Checkpoint(checkpoint, colbert_config=ColBERTConfig(checkpoint=checkpoint),
                             verbose=0)
        with torch.inference_mode():
            Q = encoder.queryFromText(list(queries.values()), bsize=128, to_cpu=True)
    partial = path.with_name(path.name + ".partial")
    torch.save({"qids": list(queries), "Q": Q.half()}, partial)
    os.replace(partial, path)
    return path


def run_prepare(experiment: Experiment, *, dry_run=False) -> None:
    for condition in experiment.conditions:
        _log(f"[prepare] condition {condition.name}")
        if condition.data_key is not None:
            prepare_data(experiment, condition, dry_run=dry_run)
        prepare_index(experiment, condition, dry_run=dry_run)
        if condition.data_key is not None and experiment.search["precompute_queries"]:
            precompute_query_embeddings(experiment, condition, dry_run=dry_run)


# ---------------------------------------------------------------------------------------------
# search: timing
# ---------------------------------------------------------------------------------------------


class StageTimer:
    """Per-query, per-stage times: CUDA events on a GPU (no host sync until the query ends),
    ``time.perf_counter`` on a CPU.

    The timing interface a scorer can use: ``with timer.stage("name"): ...`` inside a query
    started by :meth:`start_query`; :meth:`finish_query` synchronises once and returns
    ``{stage: ms}`` (a stage entered twice in a query adds up).
    """

    def __init__(self, use_cuda: bool):
        self.use_cuda = use_cuda
        self._open: list[tuple[str, object, object]] | None = None
        self.label = "CUDA events" if use_cuda else "CPU wall clock"

    def _mark(self):
        if self.use_cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start_query(self) -> None:
        self._open = []
        self._counts: dict[str, int] = {}
        self._query_start = self._mark()

    def note(self, name: str, value: int) -> None:
        """Record a count for the current query (e.g. how many candidates stage 1 produced)."""
        if self._open is not None:
            self._counts[name] = value

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._open is None:  # outside a timed query (warm-up): no bookkeeping
            yield
            return
        start = self._mark()
        try:
            yield
        finally:
            self._open.append((name, start, self._mark()))

    def finish_query(self) -> tuple[dict[str, float], dict[str, int]]:
        """Returns ``({stage: ms, "total": ms}, {count name: value})`` of the finished query."""
        end = self._mark()
        if self.use_cuda:
            import torch

            torch.cuda.synchronize()

            def elapsed(a, b):
                return float(a.elapsed_time(b))
        else:

            def elapsed(a, b):
                return (b - a) * 1e3

        times = {"total": elapsed(self._query_start, end)}
        for name, start, stop in self._open:
            times[name] = times.get(name, 0.0) + elapsed(start, stop)
        self._open = None
        return times, self._counts


def _timed(timer: StageTimer, name: str, function: Callable,
           count: Callable | None = None) -> Callable:
    def timed(*args, **kwargs):
        with timer.stage(name):
            result = function(*args, **kwargs)
        if count is not None:
            timer.note(name, count(result))
        return result

    timed.__wrapped__ = function
    return timed


# Where each system's stages can be observed from outside, as (owner, attribute, stage).
# Stock: IndexScorer's own steps (retrieve = stage 1, score_pids = stages 2-4, lookup_pids = GPU
# decompression inside it, colbert_score_packed = exact MaxSim inside it). Patched: the
# module-level stage functions of tilemaxsim_plaid.plaid.scoring, which rank_on_device looks
# up by name at every call. A missing attribute is reported, never guessed.
STOCK_INSTANCE_HOOKS = (("retrieve", "candidates"), ("score_pids", "score_pids"),
                        ("lookup_pids", "decompress"))
STOCK_MODULE_HOOKS = (("colbert.search.index_storage", "colbert_score_packed", "exact"),)
# CPU decompression: score_pids calls it through the class (IndexScorer.decompress_residuals).
STOCK_CLASS_HOOKS = (("decompress_residuals", "decompress"),)
PATCHED_MODULE_HOOKS = (
    ("tilemaxsim_plaid.plaid.scoring", "_centroid_scores", "candidates"),
    ("tilemaxsim_plaid.plaid.scoring", "_generate_candidates", "candidates"),
    ("tilemaxsim_plaid.plaid.scoring", "_stages_2_and_3", "filter"),
    ("tilemaxsim_plaid.plaid.scoring", "_stage_4", "exact"),
)


@contextlib.contextmanager
def _stage_hooks(system: str, ranker, timer: StageTimer) -> Iterator[list[str]]:
    """Wrap the system's stage functions with timer stages for the duration of the block.

    Yields:
        The names of hooks that could not be installed (the report lists them).
    """
    import importlib

    missing: list[str] = []
    undo: list[Callable[[], None]] = []
    ranker.stage_timer = timer  # a scorer that knows the interface may time finer stages
    if system == "stock":
        for attribute, stage in STOCK_INSTANCE_HOOKS:
            if not hasattr(type(ranker), attribute):
                missing.append(f"IndexScorer.{attribute}")
                continue

            # Looked up on the class at call time: a method patched later is still timed.
            def bound(*args, _attribute=attribute, **kwargs):
                return getattr(type(ranker), _attribute)(ranker, *args, **kwargs)

            # retrieve returns (pids, centroid_scores); numel reads the shape, not the device.
            count = (lambda result: int(result[0].numel())) if attribute == "retrieve" else None
            setattr(ranker, attribute, _timed(timer, stage, bound, count))
            undo.append(lambda a=attribute: delattr(ranker, a))
        if not ranker.use_gpu:
            owner = type(ranker)
            for attribute, stage in STOCK_CLASS_HOOKS:
                raw = vars(owner).get(attribute)
                if raw is None:
                    missing.append(f"IndexScorer.{attribute}")
                    continue
                function = raw.__func__ if isinstance(raw, staticmethod) else raw
                setattr(owner, attribute, staticmethod(_timed(timer, stage, function)))
                undo.append(lambda o=owner, a=attribute, r=raw: setattr(o, a, r))
    module_hooks = STOCK_MODULE_HOOKS if system == "stock" else PATCHED_MODULE_HOOKS
    for module_name, attribute, stage in module_hooks:
        module = importlib.import_module(module_name)
        if not hasattr(module, attribute):
            missing.append(f"{module_name}.{attribute}")
            continue
        original = getattr(module, attribute)
        setattr(module, attribute, _timed(timer, stage, original))
        undo.append(lambda m=module, a=attribute, o=original: setattr(m, a, o))
    try:
        yield missing
    finally:
        for restore in reversed(undo):
            restore()
        del ranker.stage_timer


def _derived_stages(system: str, times: dict[str, float]) -> dict[str, float]:
    """Split the measured times into the report's stages (each query's stages add to total)."""
    out = {"total": times["total"]}
    if system == "stock":
        decompress = times.get("decompress", 0.0)
        exact = times.get("exact", 0.0)
        score = times.get("score_pids", 0.0)
        out["candidates"] = times.get("candidates", 0.0)
        out["filter"] = max(score - decompress - exact, 0.0)
        out["decompress"] = decompress
        out["exact"] = exact
        out["other"] = max(times["total"] - out["candidates"] - score, 0.0)
    else:
        out["candidates"] = times.get("candidates", 0.0)
        out["filter"] = times.get("filter", 0.0)
        out["decompress"] = 0.0  # fused into the exact-scoring kernel
        out["exact"] = times.get("exact", 0.0)
        out["other"] = max(times["total"] - out["candidates"] - out["filter"] - out["exact"], 0.0)
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _summarise(per_query: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        stage: {"median_ms": statistics.median(values) if values else math.nan,
                "p95_ms": _percentile(values, 0.95),
                "mean_ms": statistics.fmean(values) if values else math.nan}
        for stage, values in per_query.items()
    }


# ---------------------------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------------------------


def _select_device(requested: str) -> str:
    """Hide the GPUs for a CPU run before colbert-ai reads how many there are."""
    if requested not in ("auto", "cpu", "cuda"):
        raise ValueError(f"search.device must be auto, cpu or cuda, got {requested!r}")
    if requested == "cpu":
        if "colbert" in sys.modules:
            from colbert.infra.config import ColBERTConfig

            if ColBERTConfig().total_visible_gpus > 0:
                raise RuntimeError(
                    "search.device is 'cpu' but colbert-ai was imported with GPUs visible; "
                    "start the command with CUDA_VISIBLE_DEVICES= set"
                )
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("search.device is 'cuda' but no CUDA device is visible")
    return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def _system(groups: list[str]) -> Iterator[None]:
    """Exactly the plugin groups ``groups`` patched inside the block (others undone); the
    caller's patch state is put back afterwards."""
    from tilemaxsim_plaid import plaid
    from tilemaxsim_plaid.plaid.registry import enabled_groups

    before = enabled_groups()
    plaid.disable()
    try:
        if groups and not plaid.enable(groups=groups):
            raise RuntimeError(f"could not patch colbert-ai with groups {groups} (see the warning)")
        yield
    finally:
        plaid.disable()
        if before:
            plaid.enable(groups=sorted(before))


@dataclass
class _Queries:
    qids: list[str]
    texts: list[str] | None
    Q: object | None  # fp16 [n, Lq, dim] when precomputed or synthetic
    doc_ids: list[str] | None  # pid -> doc id; None: the pid is the id
    targets: list[int] | None = None  # synthetic queries: the passage each was drawn from


def _load_search_inputs(experiment: Experiment, condition: Condition) -> _Queries:
    import torch

    if condition.synthetic is not None:
        from tilemaxsim_plaid.synthetic import load_synthetic_queries

        Q, targets = load_synthetic_queries(experiment.index_dir(condition) / "index")
        return _Queries([f"s{i:05d}" for i in range(Q.shape[0])], None, Q, None,
                        targets.tolist())
    data = experiment.data_dir(condition)
    if _read_manifest(data) is None:
        raise RuntimeError(f"{data} is missing: run the 'prepare' step first")
    queries = _read_queries(data)
    doc_ids = _read_docids(data)
    if experiment.search["precompute_queries"]:
        stored = torch.load(_query_embeddings_path(experiment, condition), map_location="cpu")
        return _Queries(stored["qids"], None, stored["Q"], doc_ids)
    return _Queries(list(queries), list(queries.values()), None, doc_ids)


def _colbert_config(condition: Condition, index_path: pathlib.Path):
    from colbert.infra.config import ColBERTConfig

    config = ColBERTConfig.load_from_index(str(index_path))
    config.configure(ncells=condition.plaid["ncells"],
                     centroid_score_threshold=condition.plaid["centroid_score_threshold"],
                     ndocs=condition.plaid["ndocs"])
    return config


def run_search(experiment: Experiment, *, dry_run=False, limit_queries: int | None = None) -> None:
    """Search every condition with both systems and write runs and latencies."""
    for condition in experiment.conditions:
        folder = experiment.results_dir(condition)
        mode = (f"rerank {condition.candidates:,} sampled candidates" if condition.candidates
                else "full PLAID pipeline")
        _log(f"[search] {condition.name}: {', '.join(SYSTEMS)} with {condition.plaid} ({mode}) "
             f"-> {folder}")
        if dry_run:
            continue
        _search_condition(experiment, condition, folder, limit_queries)


def _search_condition(experiment, condition, folder, limit_queries) -> None:
    import torch
    from tqdm import tqdm

    device = _select_device(experiment.search["device"])
    index_path = experiment.index_dir(condition) / "index"
    if not _read_manifest(index_path.parent):
        raise RuntimeError(f"{index_path} is missing: run the 'prepare' step first")
    inputs = _load_search_inputs(experiment, condition)
    limits = [n for n in (limit_queries, condition.queries) if n is not None]
    count = min([len(inputs.qids), *limits])
    warmup = min(int(experiment.search["warmup_queries"]), max(count - 1, 0))
    config = _colbert_config(condition, index_path)
    use_gpu = device == "cuda"

    with _system(experiment.search["stock_groups"]):
        from colbert.modeling.colbert import ColBERT
        from colbert.search.index_storage import IndexScorer

        ColBERT.try_load_torch_extensions(use_gpu)  # CPU exact scoring needs segmented_maxsim
        ranker = IndexScorer(str(index_path), use_gpu=use_gpu)
        encode_ms: list[float] = []
        Q_all = inputs.Q
        if Q_all is None:
            from colbert.modeling.checkpoint import Checkpoint

            checkpoint = prepare_checkpoint(experiment, condition)
            encoder = Checkpoint(checkpoint, colbert_config=config, verbose=0)
            if use_gpu:
                encoder = encoder.cuda()
            encoder.query_tokenizer.query_maxlen = config.query_maxlen
            encoded = []
            timer = StageTimer(use_gpu)
            for number, text in enumerate(tqdm(inputs.texts[:count], desc="encode", unit="q")):
                timer.start_query()
                Q = encoder.queryFromText([text], to_cpu=True)
                times, _ = timer.finish_query()
                if number >= warmup:
                    encode_ms.append(times["total"])
                encoded.append(Q)
            Q_all = torch.cat(encoded)
    Q_all = Q_all[:count].float()

    num_docs = int(ranker.doclens.numel())
    doclens = ranker.doclens
    if condition.candidates and int(condition.candidates) > num_docs:
        log.warning("[search] %s: %s candidates asked, the index holds %s passages: reranking "
                    "all of them", condition.name, f"{int(condition.candidates):,}", f"{num_docs:,}")

    def candidates_for(number: int) -> list[int] | None:
        """The pids query ``number`` reranks: the same for both systems, drawn per query so a
        million-candidate sweep never holds every list at once."""
        if not condition.candidates:
            return None
        import numpy as np

        rng = np.random.default_rng([int(experiment.search["seed"]), number])
        size = min(int(condition.candidates), num_docs)
        return np.sort(rng.choice(num_docs, size=size, replace=False)).tolist()

    from tilemaxsim_plaid.plaid import graphs

    results: dict[str, dict] = {}
    runs: dict[str, dict[str, dict[str, float]]] = {}
    passes = [*SYSTEMS, PATCHED_EAGER] if use_gpu else list(SYSTEMS)
    for system in passes:
        groups = experiment.search[f"{system.removesuffix('-eager')}_groups"]
        timer = StageTimer(use_gpu)
        per_query: dict[str, list[float]] = {}
        retrieved: list[int] = []
        scored_docs, scored_tokens = [], []
        run: dict[str, dict[str, float]] = {}
        # The graph pass is timed whole (stage hooks would not see inside a replay).
        graph_pass = use_gpu and system == "patched"
        hooks = contextlib.nullcontext([]) if graph_pass else _stage_hooks(
            system.removesuffix("-eager"), ranker, timer)
        mode = graphs.disabled() if system == PATCHED_EAGER else contextlib.nullcontext()
        with _system(groups), mode, hooks as missing:
            for number in tqdm(range(count), desc=f"{condition.name} {system}", unit="q"):
                Q = Q_all[number : number + 1]
                pids_in = candidates_for(number)
                if use_gpu and pids_in is not None and system == "stock":
                    # colbert-ai's GPU rerank indexes its CPU pid list with the device order of
                    # its scores, which works only for a query on the GPU (as its encoder gives).
                    Q = Q.cuda().half()
                timed = number >= warmup
                if timed:
                    timer.start_query()
                pids, scores = ranker.rank(config, Q, pids=pids_in)
                if timed:
                    raw_times, counts = timer.finish_query()
                    times = _derived_stages(system, raw_times)
                    if "candidates" in counts:
                        retrieved.append(counts["candidates"])
                    for stage, value in times.items():
                        per_query.setdefault(stage, []).append(value)
                    scored_docs.append(len(pids))
                    scored_tokens.append(int(doclens[torch.as_tensor(pids, dtype=torch.long)].sum())
                                         if pids else 0)
                k = condition.plaid["k"]
                qid = inputs.qids[number]
                ids = inputs.doc_ids
                run[qid] = {(ids[pid] if ids else str(pid)): float(score)
                            for pid, score in zip(pids[:k], scores[:k])}
        results[system] = {
            "groups": groups,
            "per_query_ms": per_query,
            "summary": _summarise(per_query),
            "scored_docs": scored_docs,
            "scored_tokens": scored_tokens,
            "missing_hooks": missing,
        }
        if retrieved:
            results[system]["retrieved_candidates"] = retrieved
        results[system]["stages_timed"] = not graph_pass
        if graph_pass:
            results[system]["timing"] = "one CUDA graph replay per query (stages not separable)"
        if system == PATCHED_EAGER:
            results[system]["timing"] = "eager, per-stage CUDA events (timing only)"
            # Same kernels with and without the graph: the lists must be identical.
            results[system]["identical_to_patched"] = sum(
                run[qid] == runs["patched"][qid] for qid in run) / max(len(run), 1)
        runs[system] = run

    _fresh(folder)
    from tilemaxsim_plaid.evaluation import write_trec_run

    for system in SYSTEMS:
        write_trec_run(runs[system], folder / f"{system}.trec", tag=f"{condition.name}-{system}")
    (folder / "queries.txt").write_text("".join(f"{qid}\n" for qid in inputs.qids[:count]))
    if inputs.targets is not None:
        # Synthetic queries are known-item: the passage each was drawn from. Written here so
        # that `evaluate` needs only this folder, not the (large) synthetic index.
        (folder / "qrels.trec").write_text("".join(
            f"{qid} 0 {int(pid)} 1\n" for qid, pid in zip(inputs.qids[:count], inputs.targets)))
    latency = {
        "condition": condition.name,
        "device": device,
        "timer": StageTimer(use_gpu).label,
        "queries": count,
        "warm_queries": count - warmup,
        "warmup_queries": warmup,
        "plaid": condition.plaid,
        "candidates": condition.candidates,
        "sweep": condition.sweep,
        "settings": condition.settings,
        "num_docs": num_docs,
        "num_embeddings": int(doclens.sum()),
        "dim": int(ranker.codec.dim),
        "nbits": int(ranker.codec.nbits),
        "query_tokens": int(Q_all.shape[1]),
        "encode_ms": _summarise({"encode": encode_ms})["encode"] if encode_ms else None,
        "systems": results,
        "provenance": _provenance(),
        "ceilings": _ceilings(use_gpu),
    }
    (folder / "latency.json").write_text(json.dumps(latency, indent=2))
    _write_manifest(folder, json.loads(json.dumps(condition.key, default=str)),
                    condition=condition.name, index=str(index_path))
    for system in passes:
        total = results[system]["summary"].get("total", {})
        _log(f"[search] {condition.name} {system}: total median {total.get('median_ms', math.nan):.3f} "
             f"ms, p95 {total.get('p95_ms', math.nan):.3f} ms ({latency['timer']}, {device})")


def _provenance() -> dict:
    try:
        from .harness import provenance
    except ImportError:  # the harness needs triton; a CPU box without it still records the rest
        import platform

        import torch

        return {"python": platform.python_version(), "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)"}
    info = provenance()
    try:
        import importlib.metadata

        info["colbert_ai"] = importlib.metadata.version("colbert-ai")
    except importlib.metadata.PackageNotFoundError:
        info["colbert_ai"] = None
    return info


_CEILINGS: dict = {}


def _ceilings(use_gpu: bool) -> dict | None:
    """The GPU's read-bandwidth and matmul ceilings, measured once per process (for the roofline)."""
    if not use_gpu:
        return None
    if not _CEILINGS:
        from .harness import measure_ceilings

        _CEILINGS.update(measure_ceilings())
    return dict(_CEILINGS)


# ---------------------------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------------------------


def _qrels_for(experiment: Experiment, condition: Condition) -> dict[str, dict[str, int]]:
    from tilemaxsim_plaid.evaluation import read_trec_qrels

    if condition.synthetic is not None:
        return read_trec_qrels(experiment.results_dir(condition) / "qrels.trec")
    return read_trec_qrels(experiment.data_dir(condition) / "qrels.trec")


def check_expected(expected: dict, measured: dict) -> list[dict]:
    """Compare a condition's expected numbers with the measured ones.

    Args:
        expected: ``{"stock": {metric: value}, "patched": {...}, "identity": {...},
            "tolerance": abs_tol}``; a null value means "not measured yet".
        measured: ``{"stock": {metric: value}, "patched": ..., "identity": ...}``.

    Returns:
        One ``{"name", "expected", "measured", "status"}`` per expected entry, status one of
        ``OK``, ``FAIL``, ``n/a`` (null expected value) or ``MISSING`` (not measured).
    """
    tolerance = float(expected.get("tolerance", DEFAULT_TOLERANCE))
    checks = []
    for section, values in expected.items():
        if section == "tolerance":
            continue
        for name, value in (values or {}).items():
            got = measured.get(section, {}).get(name)
            if value is None:
                status = "n/a"
            elif got is None or (isinstance(got, float) and math.isnan(got)):
                status = "MISSING"
            else:
                status = "OK" if abs(float(got) - float(value)) <= tolerance else "FAIL"
            checks.append({"name": f"{section}.{name}", "expected": value, "measured": got,
                           "status": status})
    return checks


def run_evaluate(experiment: Experiment, *, dry_run=False) -> bool:
    """Evaluate every condition's runs; returns False when any expected number FAILs."""
    from tilemaxsim_plaid.evaluation import (
        compare_runs,
        evaluate_runs,
        ranking_identity,
        read_trec_run,
    )

    settings = experiment.evaluation
    all_ok = True
    for condition in experiment.conditions:
        folder = experiment.results_dir(condition)
        _log(f"[evaluate] {condition.name}: ranx {settings['metrics']} and ranking identity "
             f"of {folder}")
        if dry_run:
            continue
        manifest = _read_manifest(folder)
        if manifest is None:
            raise RuntimeError(f"{folder} has no results: run the 'search' step first")
        if manifest["key"] != json.loads(json.dumps(condition.key, default=str)):
            raise RuntimeError(f"{folder} holds results of other settings: rerun 'search'")
        searched = (folder / "queries.txt").read_text().split()
        qrels = _qrels_for(experiment, condition)
        runs = {system: read_trec_run(folder / f"{system}.trec") for system in SYSTEMS}
        # A query with no result has no line in a TREC file; it is an empty ranking.
        for run in runs.values():
            for qid in searched:
                run.setdefault(qid, {})
        judged = {qid: qrels[qid] for qid in searched if qid in qrels}
        quality = evaluate_runs(judged, runs, settings["metrics"])
        comparison = compare_runs(judged, runs, settings["metrics"],
                                  stat_test=settings["stat_test"], max_p=settings["max_p"])
        identity = ranking_identity(runs["stock"], runs["patched"],
                                    ks=[int(k) for k in settings["identity_k"]],
                                    rbo_p=float(settings["rbo_p"]))
        measured = {"stock": quality["stock"], "patched": quality["patched"],
                    "identity": identity}
        checks = check_expected(condition.expected, measured)
        for check in checks:
            if check["status"] in ("OK", "FAIL", "MISSING"):
                _say(f"  {check['status']:<7} {condition.name} {check['name']}: expected "
                     f"{check['expected']}, measured {check['measured']}")
            all_ok &= check["status"] in ("OK", "n/a")
        if not any(check["status"] != "n/a" for check in checks):
            _say(f"  n/a     {condition.name}: no expected numbers in the config yet")
        evaluation = {"condition": condition.name, "quality": quality, "comparison": comparison,
                      "identity": identity, "checks": checks, "judged_queries": len(judged)}
        (folder / "evaluation.json").write_text(json.dumps(evaluation, indent=2))
    return all_ok


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def run_report(experiment: Experiment, *, dry_run=False) -> pathlib.Path:
    from . import report

    target = experiment.report_dir
    _log(f"[report] {target / 'report.md'} and plots")
    if dry_run:
        return target
    folders = [experiment.results_dir(condition) for condition in experiment.conditions]
    return report.write_report(
        title=experiment.label,
        config_path=experiment.path,
        config_name=experiment.name,
        result_folders=folders,
        out_dir=target,
        data_manifests=sorted({str(experiment.data_dir(c)) for c in experiment.conditions
                               if c.data_key is not None}),
    )


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


def plan_experiment(experiment: Experiment, steps) -> None:
    """Print what each step would do, building nothing (``--dry-run``)."""
    _log(f"# {experiment.name}: {experiment.label}")
    _log(f"# config {experiment.path}; outputs under {experiment.root} and {experiment.cache}")
    for step in steps:
        {"prepare": run_prepare, "search": run_search, "evaluate": run_evaluate,
         "report": run_report}[step](experiment, dry_run=True)


def main(argv=None) -> int:
    """``tilemaxsim reproduce CONFIG [--dry-run] [--steps S,...] [--out DIR] [--device D]``."""
    parser = argparse.ArgumentParser(
        prog="tilemaxsim reproduce",
        description="Reproduce a results table: stock vs patched PLAID, ranx evaluation, report.",
    )
    parser.add_argument("config", help="configs/<table>.yaml, or a shipped config's name (wiki-vital-cpu)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated subset of {','.join(STEPS)} (default: all)")
    parser.add_argument("--out", default="runs", help="output root (default: runs)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"),
                        help="override search.device of the config")
    parser.add_argument("--conditions", help="comma-separated condition names to run, a sweep's "
                        "name for all its points (default: all)")
    parser.add_argument("--limit-queries", type=int, help="search only the first N queries")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:  # a caller that configured logging keeps its own
        logging.basicConfig(format="%(message)s")
    logging.getLogger(__package__ or "experiments").setLevel(logging.INFO)  # every experiments module

    steps = [step.strip() for step in args.steps.split(",") if step.strip()]
    unknown = set(steps) - set(STEPS)
    if unknown:
        parser.error(f"--steps: unknown step(s) {sorted(unknown)}; choose from {STEPS}")
    try:
        experiment = load_config(args.config, out=args.out)
    except ConfigError as error:
        parser.error(str(error))
    if args.device:
        experiment.search["device"] = args.device
    if args.conditions:
        # A sweep's name selects every point of it.
        wanted = {name.strip() for name in args.conditions.split(",")}
        known = ({condition.name for condition in experiment.conditions}
                 | {condition.sweep for condition in experiment.conditions if condition.sweep})
        if wanted - known:
            parser.error(f"--conditions: unknown {sorted(wanted - known)}; known {sorted(known)}")
        experiment.conditions = [c for c in experiment.conditions
                                 if c.name in wanted or c.sweep in wanted]
    if args.dry_run:
        plan_experiment(experiment, steps)
        return 0
    ok = True
    for step in steps:
        if step == "prepare":
            run_prepare(experiment)
        elif step == "search":
            run_search(experiment, limit_queries=args.limit_queries)
        elif step == "evaluate":
            ok = run_evaluate(experiment)
        else:
            run_report(experiment)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
