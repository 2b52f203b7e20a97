"""wiki-vital in ir_datasets' registry: registered by the import, idempotent, offline, and
exported by ir_datasets' own command line.

The command line runs in a fresh interpreter, as a user would run it, with a home folder of its
own and every proxy pointed at a closed port, so a download attempt fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tilemaxsim_plaid import datasets

WIKI_VITAL_PASSAGES = 10_033
WIKI_VITAL_QUERIES = 9_862

# ir_datasets' documented entry point is `ir_datasets.main(argv)` (the `ir_datasets` script
# calls it with sys.argv[1:]); importing the module first is what registers wiki-vital.
IR_DATASETS_CLI = "import sys, tilemaxsim_plaid.datasets, ir_datasets; ir_datasets.main(sys.argv[1:])"


def _offline_env(home) -> dict:
    return {**os.environ, "IR_DATASETS_HOME": str(home), "HF_HUB_OFFLINE": "1",
            "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}


def _files_under(home) -> list:
    # Folders are expected: importing ir_datasets creates its (empty) per-dataset folders.
    return [path for path in home.rglob("*") if not path.is_dir()]


def _ir_datasets_cli(*args, home) -> list[str]:
    completed = subprocess.run([sys.executable, "-c", IR_DATASETS_CLI, *args],
                               env=_offline_env(home), capture_output=True, text=True,
                               timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.splitlines()


REGISTRATION_SCRIPT = """
import importlib, json
import ir_datasets
import tilemaxsim_plaid.datasets as d
registered = "wiki-vital" in ir_datasets.registry
parsed = d._wiki_vital_records.cache_info().currsize > 0
first = ir_datasets.load("wiki-vital")
d.register_wiki_vital()
importlib.reload(d)  # runs the import-time registration once more
print(json.dumps({"registered": registered, "parsed_at_import": parsed,
                  "same_after_reregistering": ir_datasets.load("wiki-vital") is first}))
"""


def test_import_registers_wiki_vital_once_without_reading_or_downloading(tmp_path):
    # A fresh interpreter: the import under test is the first, and reloading the module here
    # would leave other tests holding classes of the old module.
    completed = subprocess.run([sys.executable, "-c", REGISTRATION_SCRIPT],
                               env=_offline_env(tmp_path), capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout.splitlines()[-1]) == {
        "registered": True, "parsed_at_import": False, "same_after_reregistering": True}
    assert _files_under(tmp_path) == []


def test_load_dataset_returns_the_registered_dataset():
    import ir_datasets

    registered = ir_datasets.load("wiki-vital")
    datasets.register_wiki_vital()
    assert datasets.load_dataset("wiki-vital") is registered


def test_wiki_vital_doc_fields_are_plain_str_for_the_exporters():
    # ir_datasets' TSV exporter skips a field whose annotation is not the class str itself.
    assert all(datasets.WikiVitalDoc.__annotations__[field] is str
               for field in datasets.WikiVitalDoc._fields)


def test_ir_datasets_export_docs(tmp_path):
    lines = _ir_datasets_cli("export", "wiki-vital", "docs", home=tmp_path)
    assert len(lines) == WIKI_VITAL_PASSAGES
    rows = [line.split("\t") for line in lines]
    assert all(len(row) == len(datasets.WikiVitalDoc._fields) for row in rows)
    first = next(iter(datasets.load_dataset("wiki-vital").docs_iter()))
    assert tuple(rows[0]) == tuple(first)
    assert len({row[0] for row in rows}) == WIKI_VITAL_PASSAGES
    assert _files_under(tmp_path) == []


@pytest.mark.parametrize("entity", [pytest.param("queries"), pytest.param("qrels")])
def test_ir_datasets_export_queries_and_qrels(tmp_path, entity):
    lines = _ir_datasets_cli("export", "wiki-vital", entity, home=tmp_path)
    dataset = datasets.load_dataset("wiki-vital")
    if entity == "queries":
        expected = [f"{q.query_id}\t{q.text}" for q in dataset.queries_iter()]
    else:  # TREC qrels: qid iteration docid relevance
        expected = [f"{q.query_id} 0 {q.doc_id} {q.relevance}" for q in dataset.qrels_iter()]
    assert len(lines) == WIKI_VITAL_QUERIES
    assert lines == expected
