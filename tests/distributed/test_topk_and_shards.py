"""Single-process pieces of sharded search: key packing, pid ranges, shard slicing, PLAID reading."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.helpers import random_packed_corpus, write_plaid_index
from tilemaxsim_plaid.distributed import (
    DenseShard,
    exact_topk,
    load_plaid_shard,
    partition_pid_ranges,
    plaid_pid_ranges,
)
from tilemaxsim_plaid.distributed.sharded_index import check_layouts
from tilemaxsim_plaid.distributed.topk import PAD_KEY, decode_keys, encode_keys, topk_keys

SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 3.4e38, -3.4e38, 1.0, -1.0]


def _sorted_by_score_then_pid(scores: list[float], pids: list[int], k: int):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], pids[i]))[:k]
    return [scores[i] for i in order], [pids[i] for i in order]


def test_keys_round_trip_every_special_float():
    scores = torch.tensor([SPECIAL + [0.5] * 4], dtype=torch.float32)
    pids = torch.tensor([0, 1, 2**32 - 1, 7, 2**31, 5, 6, 8, 9, 10, 11, 12, 13, 14])
    got_scores, got_pids = decode_keys(encode_keys(scores, pids))
    assert torch.equal(got_pids[0], pids)
    # -0.0 comes back as +0.0 (they compare equal); everything else bit for bit.
    assert torch.equal(got_scores.view(torch.int32), (scores + 0.0).view(torch.int32))


@pytest.mark.parametrize("num_docs, k", [pytest.param(40, 7, id="k<M"), pytest.param(9, 20, id="k>M"),
                                         pytest.param(1, 1, id="one-doc")])
def test_exact_topk_orders_by_score_then_pid(num_docs, k):
    # Few distinct values: most scores tie, with -0.0 and +0.0 mixed in.
    values = torch.tensor([0.0, -0.0, 1.5, -2.0, float("-inf"), 1.5])
    scores = values[torch.randint(0, len(values), (3, num_docs))]
    pids = torch.randperm(1000)[:num_docs]
    got_scores, got_pids = exact_topk(scores, k, pids)
    for row in range(3):
        want_scores, want_pids = _sorted_by_score_then_pid(scores[row].tolist(), pids.tolist(), k)
        assert got_pids[row].tolist() == want_pids
        assert got_scores[row].tolist() == want_scores


def test_topk_keys_pads_short_rows_last():
    keys = encode_keys(torch.tensor([[float("-inf"), 2.0]]), torch.tensor([4, 3]))
    top = topk_keys(keys, 4)
    assert top[0, 2:].tolist() == [PAD_KEY, PAD_KEY]
    assert decode_keys(top[:, :2])[1].tolist() == [[3, 4]]


def test_exact_topk_rejects_bad_k():
    with pytest.raises(ValueError, match="positive int"):
        exact_topk(torch.zeros(3), 0)


@pytest.mark.parametrize("lengths, world", [
    pytest.param([5] * 10, 3, id="uniform"),
    pytest.param([1, 1, 1, 500, 1, 1, 1], 3, id="one-huge-doc"),
    pytest.param([500, 1, 1], 3, id="huge-first"),
    pytest.param([0, 0, 7, 0, 3], 5, id="empty-docs-one-each"),
])
@pytest.mark.parametrize("balance", ["tokens", "docs"])
def test_partition_tiles_the_corpus_with_nonempty_ranges(lengths, world, balance):
    ranges = partition_pid_ranges(torch.tensor(lengths), world, balance=balance)
    assert len(ranges) == world and ranges[0][0] == 0 and ranges[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(stop > start for start, stop in ranges)


def test_partition_by_tokens_balances_tokens():
    lengths = torch.randint(1, 200, (1000,))
    ranges = partition_pid_ranges(lengths, 4, balance="tokens")
    tokens = [int(lengths[a:b].sum()) for a, b in ranges]
    assert max(tokens) - min(tokens) <= 2 * 200


def test_partition_rejects_more_ranks_than_documents():
    with pytest.raises(ValueError, match="larger than the corpus"):
        partition_pid_ranges(torch.tensor([3, 4]), 3)


def test_shard_slices_are_views_of_the_corpus():
    embeddings, offsets = random_packed_corpus([3, 0, 2, 5], 16, seed=0)
    shard = DenseShard.from_corpus(embeddings, offsets, 1, 4)
    assert (shard.pid_start, shard.pid_stop, shard.max_doc_len) == (1, 4, 5)
    assert shard.offsets.tolist() == [0, 0, 2, 7]
    assert shard.embeddings.data_ptr() == embeddings[3:].data_ptr()
    blocks = shard.blocks(2)
    assert [(b.pid_start, b.pid_stop) for b in blocks] == [(1, 3), (3, 4)]
    assert torch.equal(blocks[1].embeddings, embeddings[5:10])


def test_check_layouts_names_the_problem():
    base = {"kind": "dense", "dim": 8, "codec": {"dtype": "torch.float16"}, "num_tokens": 4}
    ok = [dict(base, pid_start=0, pid_stop=3), dict(base, pid_start=3, pid_stop=5)]
    assert check_layouts(ok) == ([(0, 3), (3, 5)], 5)
    with pytest.raises(ValueError, match="kind"):
        check_layouts([ok[0], dict(ok[1], kind="residual")])
    with pytest.raises(ValueError, match="codec"):
        check_layouts([ok[0], dict(ok[1], codec={"dtype": "torch.float32"})])
    with pytest.raises(ValueError, match="without gaps"):
        check_layouts([ok[0], dict(ok[1], pid_start=4)])
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\] hold no documents"):
        check_layouts([ok[0], dict(ok[1], pid_start=3, pid_stop=3), dict(ok[1], pid_start=3, pid_stop=5)])


def test_load_plaid_shard_ranges_concatenate_to_the_index(tmp_path):
    chunk_doclens = [[3, 1, 4], [1, 5, 9, 2], [6, 5]]
    write_plaid_index(str(tmp_path), chunk_doclens, dim=16, nbits=2, num_centroids=8, seed=0)
    whole = load_plaid_shard(str(tmp_path), 0, 9)
    all_codes = torch.cat([torch.load(tmp_path / f"{i}.codes.pt") for i in range(3)])
    assert torch.equal(whole.codes, all_codes)
    assert whole.offsets.tolist() == [0, 3, 4, 8, 9, 14, 23, 25, 31, 36]
    ranges = plaid_pid_ranges(str(tmp_path), 3)
    parts = [load_plaid_shard(str(tmp_path), a, b) for a, b in ranges]
    assert torch.equal(torch.cat([p.codes for p in parts]), whole.codes)
    assert torch.equal(torch.cat([p.residuals for p in parts]), whole.residuals)
    for part in parts:
        assert torch.equal(part.offsets, whole.docs(part.pid_start, part.pid_stop).offsets)


@pytest.mark.colbert
def test_load_plaid_shard_reads_a_real_colbert_index(tiny_plaid_index):
    """The ranges of a real index, read chunk file by chunk file, are colbert-ai's own arrays."""
    from colbert.search.index_loader import IndexLoader

    loader = IndexLoader(tiny_plaid_index.index_path, use_gpu=False)
    num_docs = loader.doclens.numel()
    ranges = plaid_pid_ranges(tiny_plaid_index.index_path, 3)
    parts = [load_plaid_shard(tiny_plaid_index.index_path, a, b) for a, b in ranges]
    num_tokens = int(loader.doclens.sum())
    assert sum(p.num_docs for p in parts) == num_docs
    # colbert-ai keeps 512 uninitialised rows after the real ones: compare the real ones only.
    assert torch.equal(torch.cat([p.codes for p in parts]), loader.embeddings.codes[:num_tokens])
    assert torch.equal(torch.cat([p.residuals for p in parts]), loader.embeddings.residuals[:num_tokens])
    assert torch.equal(torch.cat([p.offsets[1:] - p.offsets[:-1] for p in parts]), loader.doclens)
    assert torch.equal(parts[0].centroids, loader.codec.centroids.to(parts[0].centroids.dtype))
    assert parts[0].nbits == tiny_plaid_index.nbits and parts[0].dim == tiny_plaid_index.dim
