"""wiki-vital as a local ir_datasets dataset, and the offline path of the public loaders.

ir_datasets reads IR_DATASETS_HOME when it is imported, so every public-dataset case runs in a
fresh interpreter with its own home holding tiny fabricated files, placed exactly where
ir_datasets looks for the real archives.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

from tilemaxsim_plaid import datasets

WIKI_VITAL_PASSAGES = 10_033
WIKI_VITAL_QUERIES = 9_862


def test_wiki_vital_is_an_ir_datasets_dataset_with_known_item_qrels():
    import ir_datasets

    dataset = datasets.load_dataset("wiki-vital")
    assert ir_datasets.load("wiki-vital") is dataset
    docs = list(dataset.docs_iter())
    queries = list(dataset.queries_iter())
    qrels = dataset.qrels_dict()
    assert dataset.docs_count() == len(docs) == WIKI_VITAL_PASSAGES
    assert len(queries) == WIKI_VITAL_QUERIES
    doc_ids = {doc.doc_id for doc in docs}
    assert len(doc_ids) == WIKI_VITAL_PASSAGES
    assert all(doc.text and "\t" not in doc.text and "\n" not in doc.text for doc in docs)
    assert {q.query_id for q in queries} == set(qrels)
    # Known-item: exactly one relevant passage per query, and it exists.
    assert all(len(judged) == 1 and set(judged) <= doc_ids for judged in qrels.values())
    assert all(q.text for q in queries)
    store = dataset.docs_store()
    first = docs[123]
    assert store.get(first.doc_id) == first


def test_wiki_vital_query_is_the_description_of_its_article():
    dataset = datasets.load_dataset("wiki-vital")
    docs = {doc.doc_id: doc for doc in dataset.docs_iter()}
    kubrick = [q for q in dataset.queries_iter() if "Stanley Kubrick" in q.text]
    assert kubrick, "the 2001: A Space Odyssey article has a Kubrick description"
    qrels = dataset.qrels_dict()
    titles = {docs[next(iter(qrels[q.query_id]))].title for q in kubrick}
    assert "2001: A Space Odyssey" in titles


def test_unknown_dataset_name_is_refused():
    with pytest.raises(ValueError, match="name must be"):
        datasets.load_dataset("beir/trec-covid")


def test_without_ir_datasets_load_dataset_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ir_datasets", None)  # makes `import ir_datasets` fail
    with pytest.raises(ImportError, match=r"tilemaxsim-plaid\[eval\]"):
        datasets.load_dataset("wiki-vital")


def test_allowed_download_of_a_missing_file_is_logged(tmp_path, monkeypatch, caplog):
    # ir_datasets downloads on first iteration, not on load, so nothing is fetched here.
    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="tilemaxsim_plaid.datasets"):
        datasets.load_dataset("beir/fiqa/test", allow_download=True)
    assert str(tmp_path / "beir" / "fiqa" / "source.zip") in caplog.text
    assert "download" in caplog.text


# ---------------------------------------------------------------------------------------------
# Offline public datasets: fabricated archives in ir_datasets' layout
# ---------------------------------------------------------------------------------------------

DOCS = {"d1": ("Title one", "First passage text."), "d2": ("Title two", "Second passage."),
        "d3": ("", "Third passage, no title.")}
QUERIES = {"q1": "what is the first passage", "q2": "second one"}
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 2}}


def _beir_zip(name: str, path) -> None:
    def doc_line(doc_id, title, text):
        record = {"_id": doc_id, "title": title, "text": text, "metadata": {}}
        if name == "nfcorpus":
            record["metadata"] = {"url": f"http://example.org/{doc_id}"}
        return json.dumps(record)

    def query_line(qid, text):
        record = {"_id": qid, "text": text, "metadata": {}}
        if name == "nfcorpus":
            record["metadata"] = {"url": f"http://example.org/{qid}"}
        return json.dumps(record)

    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/corpus.jsonl",
                         "\n".join(doc_line(d, t, x) for d, (t, x) in DOCS.items()) + "\n")
        archive.writestr(f"{name}/queries.jsonl",
                         "\n".join(query_line(q, t) for q, t in QUERIES.items()) + "\n")
        qrels = "query-id\tcorpus-id\tscore\n" + "".join(
            f"{q}\t{d}\t{r}\n" for q, judged in QRELS.items() for d, r in judged.items())
        archive.writestr(f"{name}/qrels/test.tsv", qrels)


def _msmarco_tar(path) -> None:
    files = {
        "collection.tsv": "".join(f"{d[1:]}\t{text}\n" for d, (_, text) in DOCS.items()),
        "queries.dev.small.tsv": "".join(f"{q[1:]}\t{text}\n" for q, text in QUERIES.items()),
        "qrels.dev.small.tsv": "".join(f"{q[1:]}\t0\t{d[1:]}\t{r}\n"
                                       for q, judged in QRELS.items() for d, r in judged.items()),
    }
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w:gz") as archive:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    from tilemaxsim_plaid import datasets
    name = sys.argv[1]
    try:
        dataset = datasets.load_dataset(name)
    except datasets.DatasetUnavailableError as error:
        print(json.dumps({"error": str(error)}))
        sys.exit(0)
    print(json.dumps({
        "docs": {d.doc_id: d.text for d in dataset.docs_iter()},
        "queries": {q.query_id: q.text for q in dataset.queries_iter()},
        "qrels": {q: dict(j) for q, j in dataset.qrels_dict().items()},
    }))
""")


def _load_in_fresh_interpreter(name: str, home) -> dict:
    env = {**os.environ, "IR_DATASETS_HOME": str(home), "HF_HUB_OFFLINE": "1",
           # Any attempt to reach the network fails at once instead of hanging.
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    completed = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, name], env=env,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [
    pytest.param("scifact", id="beir-scifact"),
    pytest.param("nfcorpus", id="beir-nfcorpus"),
    pytest.param("fiqa", id="beir-fiqa"),
])
def test_beir_loads_offline_from_source_zip(tmp_path, name):
    _beir_zip(name, tmp_path / "beir" / name / "source.zip")
    loaded = _load_in_fresh_interpreter(f"beir/{name}/test", tmp_path)
    assert loaded["docs"] == {d: text for d, (_, text) in DOCS.items()}
    assert loaded["queries"] == QUERIES
    assert loaded["qrels"] == QRELS


def test_msmarco_dev_small_loads_offline_from_collectionandqueries(tmp_path):
    _msmarco_tar(tmp_path / "msmarco-passage" / "collectionandqueries.tar.gz")
    loaded = _load_in_fresh_interpreter("msmarco-passage/dev/small", tmp_path)
    assert loaded["docs"] == {d[1:]: text for d, (_, text) in DOCS.items()}
    assert loaded["queries"] == {q[1:]: text for q, text in QUERIES.items()}
    assert loaded["qrels"] == {q[1:]: {d[1:]: r for d, r in judged.items()}
                               for q, judged in QRELS.items()}


@pytest.mark.parametrize("name, expected_file", [
    pytest.param("beir/fiqa/test", "beir/fiqa/source.zip", id="beir-fiqa"),
    pytest.param("msmarco-passage/dev/small", "msmarco-passage/collectionandqueries.tar.gz",
                 id="msmarco"),
])
def test_missing_dataset_names_the_file_and_where_to_put_it(tmp_path, name, expected_file):
    loaded = _load_in_fresh_interpreter(name, tmp_path)
    message = loaded["error"]
    assert str(tmp_path / expected_file) in message
    assert "IR_DATASETS_HOME" in message
    assert "http" in message  # where the file comes from
