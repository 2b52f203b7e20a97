"""The host query tokenizer must produce colbert-ai's ``QueryTokenizer.tensorize`` tensors exactly:
on every real query of wiki-vital, on its passages (far longer than a query: truncation), for
several ``query_maxlen`` and with ``attend_to_mask_tokens``; and the patched ``tensorize`` must
verify before trusting it, fall back when it differs, and leave other calls to upstream."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.plaid.conftest import patch_state
from tilemaxsim_plaid import datasets
from tilemaxsim_plaid.plaid import encoder_graphs, query_tokens

pytestmark = pytest.mark.colbert


def _upstream():
    from colbert.modeling.tokenization import QueryTokenizer

    return getattr(QueryTokenizer.tensorize, "__wrapped__", QueryTokenizer.tensorize)


def _query_tokenizer(checkpoint_path, query_maxlen, attend_to_mask_tokens=False):
    from colbert.infra import ColBERTConfig
    from colbert.modeling.tokenization import QueryTokenizer

    config = ColBERTConfig(checkpoint=checkpoint_path, query_maxlen=query_maxlen,
                           attend_to_mask_tokens=attend_to_mask_tokens)
    with patch_state(("compat",)):
        return QueryTokenizer(config, verbose=0)


@pytest.fixture(scope="module")
def wiki_texts():
    records = datasets._wiki_vital_records()
    queries = [text for text in records.descriptions if text]
    passages = [doc.text for doc in records.docs[:500]]
    return queries, passages


def _assert_equal_in_batches(query_tokenizer, host, texts, batch):
    upstream = _upstream()
    for first in range(0, len(texts), batch):
        chunk = texts[first : first + batch]
        ids, mask = upstream(query_tokenizer, chunk)
        got_ids, got_mask = host.tensorize(chunk, torch.device("cpu"))
        assert torch.equal(got_ids, ids) and got_ids.dtype == ids.dtype, chunk[:2]
        assert torch.equal(got_mask, mask) and got_mask.dtype == mask.dtype, chunk[:2]
        assert getattr(got_mask, query_tokens.HAS_PADDING_ATTRIBUTE) == bool((mask == 0).any())


@pytest.mark.parametrize("query_maxlen, attend", [(32, False), (8, False), (64, False), (32, True)])
def test_host_tokens_equal_upstream_on_every_wiki_query(tiny_plaid_index, wiki_texts, query_maxlen, attend):
    queries, passages = wiki_texts
    assert len(queries) > 9000
    query_tokenizer = _query_tokenizer(tiny_plaid_index.checkpoint_path, query_maxlen, attend)
    host = query_tokens.HostQueryTokenizer(query_tokenizer, query_maxlen)
    texts = queries if (query_maxlen, attend) == (32, False) else queries[::7]
    _assert_equal_in_batches(query_tokenizer, host, texts, batch=256)
    # One text at a time takes the single-encode branch; passages are truncated.
    _assert_equal_in_batches(query_tokenizer, host, passages[:40] + list(query_tokens.PROBE_TEXTS), batch=1)
    _assert_equal_in_batches(query_tokenizer, host, passages, batch=50)


def test_patched_tensorize_checks_once_then_stays_on_the_host(tiny_plaid_index, monkeypatch):
    query_tokenizer = _query_tokenizer(tiny_plaid_index.checkpoint_path, 32)
    upstream = _upstream()
    calls = []

    def counting(self, *args, **kwargs):
        calls.append(args[0])
        return upstream(self, *args, **kwargs)

    texts = ["who painted the mona lisa", "a " * 60]
    first = query_tokens.tensorize(counting, query_tokenizer, texts[:1])
    assert len(calls) == 2 + len(query_tokens.PROBE_TEXTS), "the call itself, then the check"
    assert isinstance(query_tokenizer.__dict__[query_tokens._CACHE_ATTRIBUTE][(32, False)],
                      query_tokens.HostQueryTokenizer)
    calls.clear()
    for text in texts:
        ids, mask = query_tokens.tensorize(counting, query_tokenizer, [text])
        expected_ids, expected_mask = upstream(query_tokenizer, [text])
        assert torch.equal(ids, expected_ids) and torch.equal(mask, expected_mask)
        assert getattr(mask, query_tokens.HAS_PADDING_ATTRIBUTE) == (text == texts[0])
        assert encoder_graphs.token_pair(ids, mask) is not None, "one buffer: the graph copies it at once"
    assert calls == [], "verified once: later calls never run upstream"
    assert torch.equal(first[0], upstream(query_tokenizer, texts[:1])[0])


def test_a_host_path_that_differs_is_never_used(tiny_plaid_index, monkeypatch, caplog):
    query_tokenizer = _query_tokenizer(tiny_plaid_index.checkpoint_path, 32)
    upstream = _upstream()
    real_rows = query_tokens.HostQueryTokenizer.rows

    def off_by_one_on_long_texts(self, texts):
        ids_rows, mask_rows = real_rows(self, texts)
        if len(texts[0]) > 1000:  # only a probe shows it: the first call's own text is short
            ids_rows[0][-1] += 1
        return ids_rows, mask_rows

    monkeypatch.setattr(query_tokens.HostQueryTokenizer, "rows", off_by_one_on_long_texts)
    with caplog.at_level(logging.WARNING, logger=query_tokens.__name__):
        for text in ["short query", "another one", "word " * 500]:
            ids, mask = query_tokens.tensorize(upstream, query_tokenizer, [text])
            expected_ids, expected_mask = upstream(query_tokenizer, [text])
            assert torch.equal(ids, expected_ids) and torch.equal(mask, expected_mask)
            assert not hasattr(mask, query_tokens.HAS_PADDING_ATTRIBUTE)
    assert caplog.text.count("stays upstream's") == 1 and "input ids differ" in caplog.text
    assert query_tokenizer.__dict__[query_tokens._CACHE_ATTRIBUTE][(32, False)] is None


@pytest.mark.parametrize("case", ["bsize", "context", "full_length_search", "string", "empty"])
def test_calls_the_host_path_does_not_cover_go_upstream(tiny_plaid_index, case):
    query_tokenizer = _query_tokenizer(tiny_plaid_index.checkpoint_path, 32)
    texts, kwargs = ["who painted the mona lisa", "largest moon of saturn"], {}
    if case == "bsize":
        kwargs = {"bsize": 1}
    elif case == "context":
        kwargs = {"context": ["background one", "background two"]}
    elif case == "full_length_search":
        texts, kwargs = texts[:1], {"full_length_search": True}
    elif case == "string":
        texts = "not a list"
    elif case == "empty":
        query_tokens.tensorize(_upstream(), query_tokenizer, ["verifies the host path first"])
        texts = []
    seen = []
    query_tokens.tensorize(lambda *a, **k: seen.append((a, k)), query_tokenizer, texts, **kwargs)
    assert len(seen) == 1 and seen[0][0][1] is texts


def test_patched_searcher_encodes_as_upstream(tiny_searcher, tiny_plaid_index):
    """Through the registry: Searcher.encode with the plugin equals stock colbert-ai's."""
    texts = tiny_plaid_index.queries[:4]
    with patch_state(("compat",)):
        stock = [tiny_searcher.encode(text) for text in texts]
    with patch_state(("compat", "scoring")):
        from colbert.modeling.tokenization import QueryTokenizer

        assert QueryTokenizer.tensorize.__wrapped__ is _upstream()
        patched = [tiny_searcher.encode(text) for text in texts]
        patched += [tiny_searcher.encode(text) for text in texts]  # after the check: host path
        hosts = tiny_searcher.checkpoint.query_tokenizer.__dict__[query_tokens._CACHE_ATTRIBUTE]
        assert isinstance(hosts[(tiny_searcher.config.query_maxlen, False)], query_tokens.HostQueryTokenizer)
    for expected, got in zip(stock + stock, patched):
        assert torch.equal(got, expected)


class _FakeEvent:
    """A CUDA event whose copy completes when the test says so."""

    def __init__(self):
        self.done = True  # never recorded: nothing pending

    def record(self, stream=None):
        self.done = False

    def query(self):
        return self.done


def test_pinned_uploads_reuse_a_buffer_only_after_its_copy_ran():
    uploads = query_tokens.PinnedUploads(pin_memory=False, make_event=_FakeEvent)
    cpu = torch.device("cpu")
    rows = lambda value: ([[value] * 5], [[1, 1, 1, 0, 0]])  # noqa: E731
    first = uploads.upload(rows(7), cpu)
    assert torch.equal(first, torch.tensor(rows(7))) and first.dtype == torch.int64
    (ring,) = uploads._rings.values()
    assert len(ring) == 1
    # Still in flight: the next upload takes a new buffer, and never writes into the first.
    outs = [uploads.upload(rows(value), cpu) for value in (8, 9, 10)]
    assert len(ring) == query_tokens.PinnedUploads.RING
    overflow = uploads.upload(rows(11), cpu)  # every buffer busy: a spare tensor, not one of the ring's
    assert torch.equal(overflow, torch.tensor(rows(11))) and len(ring) == query_tokens.PinnedUploads.RING
    ring[2][2].done = True
    again = uploads.upload(rows(12), cpu)
    assert torch.equal(again, torch.tensor(rows(12)))
    assert ring[2][0][0, 0, 0] == 12, "the buffer whose copy completed was reused"
    # What was handed out is a copy, never the reused buffer itself.
    assert torch.equal(first, torch.tensor(rows(7)))
    assert [int(out[0, 0, 0]) for out in outs] == [8, 9, 10]
