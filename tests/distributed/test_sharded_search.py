"""Sharded search on two gloo processes equals single-process search, ties included.

The single-process result is ``exact_topk`` over the scores of the whole corpus computed by the
same scorer in one call; each scenario runs on both ranks and asserts on both.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tests.distributed.helpers import (
    random_packed_corpus,
    random_queries,
    random_residual_codes,
    run_on_two_ranks,
    write_plaid_index,
)
from tilemaxsim_plaid.distributed import (
    DenseShard,
    PQShard,
    ResidualShard,
    ShardedDenseIndex,
    ShardedIndex,
    ShardedResidualIndex,
    default_scorer,
    exact_topk,
    load_plaid_shard,
)

DIM = 32


def _assert_same_topk(actual, expected, where: str) -> None:
    (scores, pids), (want_scores, want_pids) = actual, expected
    assert pids.shape == want_pids.shape, f"{where}: shape {tuple(pids.shape)} != {tuple(want_pids.shape)}"
    assert torch.equal(pids.cpu(), want_pids.cpu()), f"{where}: pids\n{pids}\n!=\n{want_pids}"
    # Bit-equal, not close: the same scorer scored the same document.
    assert torch.equal(scores.cpu(), want_scores.cpu()), f"{where}: scores differ"


# ---------------------------------------------------------------- scenarios (run on every rank)

def _tie_heavy_dense_corpus():
    """Documents with duplicates on both sides of every cut, an empty document, a length-1 one."""
    lengths = [5, 1, 7, 0, 3, 9, 2, 6, 4, 8, 1, 5, 3]
    embeddings, offsets = random_packed_corpus(lengths, DIM, seed=11)
    # Documents 11 and 12 repeat documents 1 and 4 token for token: equal scores, other shards.
    embeddings[offsets[11]:offsets[12]] = embeddings[offsets[1]:offsets[2]].repeat(5, 1)[:5]
    embeddings[offsets[12]:offsets[13]] = embeddings[offsets[4]:offsets[5]]
    embeddings[offsets[9]:offsets[10]] = torch.cat([embeddings[offsets[1]:offsets[2]]] * 8)
    return embeddings, offsets


def scenario_dense(ranges, batch_size, max_docs_per_call):
    rank = dist.get_rank()
    embeddings, offsets = _tie_heavy_dense_corpus()
    scorer = default_scorer("dense", "reference")
    Q = random_queries(5, 4, DIM, seed=3)
    query_lengths = torch.tensor([4, 0, 2, 4, 1])  # query 1 has no tokens: every document ties at 0
    shard = DenseShard.from_corpus(embeddings, offsets, *ranges[rank])
    index = ShardedIndex(shard, scorer, max_docs_per_call=max_docs_per_call)
    whole = scorer(Q, DenseShard.from_corpus(embeddings, offsets, 0, 13), query_lengths=query_lengths)
    for k in (1, 4, 13, 50):
        got = index.score(Q, k, query_lengths=query_lengths, batch_size=batch_size)
        _assert_same_topk(got, exact_topk(whole, k), f"rank {rank}, k={k}")
    # Document 4 and 12 are identical: both present, the smaller pid first.
    scores, pids = index.score(Q, 13, query_lengths=query_lengths)
    row = pids[0].tolist()
    assert row.index(4) < row.index(12) and scores[0, row.index(4)] == scores[0, row.index(12)]
    # An empty query ranks every document at 0 by pid; the empty document scores -inf elsewhere.
    assert pids[1].tolist() == list(range(13)) and bool((scores[1] == 0).all())
    assert scores[0, -1] == float("-inf") and pids[0, -1] == 3
    # A 2-D query is one query.
    got = index.score(Q[0], 6)
    _assert_same_topk(got, exact_topk(scorer(Q[0], DenseShard.from_corpus(embeddings, offsets, 0, 13)), 6),
                      f"rank {rank}, 2-D Q")
    # Stage-4 rerank: candidates on both shards, in no particular order, fewer than k.
    candidates = torch.tensor([12, 0, 4, 9, 1, 7])
    got = index.score(Q, 10, pids=candidates, query_lengths=query_lengths)
    _assert_same_topk(got, exact_topk(whole[:, candidates], 10, candidates), f"rank {rank}, pids")


def scenario_dense_from_corpus(balance):
    embeddings, offsets = _tie_heavy_dense_corpus()
    scorer = default_scorer("dense", "reference")
    index = ShardedDenseIndex.from_corpus(embeddings, offsets, scorer=scorer, balance=balance)
    start, stop = index.pid_ranges[dist.get_rank()]
    assert index.shard.pid_start == start and index.shard.num_docs == stop - start
    Q = random_queries(3, 5, DIM, seed=4)
    whole = scorer(Q, DenseShard.from_corpus(embeddings, offsets, 0, 13))
    _assert_same_topk(index.score(Q, 7), exact_topk(whole, 7), f"balance={balance}")


def scenario_residual_plaid(index_path, nbits):
    rank = dist.get_rank()
    scorer = default_scorer("residual", "reference")
    index = ShardedResidualIndex.from_plaid_index(index_path, scorer=scorer, max_docs_per_call=4)
    whole_shard = load_plaid_shard(index_path, 0, index.num_docs)
    assert index.shard.nbits == nbits and index.num_docs == whole_shard.num_docs
    Q = random_queries(4, 6, DIM, seed=5)
    whole = scorer(Q, whole_shard)
    for k in (1, 5, index.num_docs + 3):
        _assert_same_topk(index.score(Q, k, batch_size=3), exact_topk(whole, k), f"rank {rank}, k={k}")
    candidates = torch.arange(index.num_docs - 1, -1, -3)
    _assert_same_topk(index.score(Q, 4, pids=candidates), exact_topk(whole[:, candidates], 4, candidates),
                      f"rank {rank}, residual rerank")


def scenario_residual_ties():
    """Residual shards of unequal size whose documents repeat across the cut."""
    rank = dist.get_rank()
    lengths = [3, 4, 1, 2, 3, 4, 2]
    codes, residuals, centroids, weights = random_residual_codes(sum(lengths), DIM, 2, 8, seed=6)
    codes[13:17], residuals[13:17] = codes[3:7], residuals[3:7]  # pid 5 repeats pid 1 (rank 1 / rank 0)
    offsets = torch.tensor([0, 3, 7, 8, 10, 13, 17, 19])
    ranges = [(0, 2), (2, 7)]
    shard = ResidualShard.from_corpus(codes, residuals, offsets, centroids, weights, 2, *ranges[rank])
    scorer = default_scorer("residual", "reference")
    index = ShardedIndex(shard, scorer)
    Q = random_queries(3, 3, DIM, seed=7)
    whole = scorer(Q, ResidualShard.from_corpus(codes, residuals, offsets, centroids, weights, 2, 0, 7))
    scores, pids = index.score(Q, 7)
    _assert_same_topk((scores, pids), exact_topk(whole, 7), f"rank {rank}")
    for q, row in enumerate(pids.tolist()):
        assert whole[q, 1] == whole[q, 5] and row.index(1) < row.index(5)


def scenario_pq():
    rank = dist.get_rank()
    lengths = [2, 5, 3, 1, 4]
    g = torch.Generator().manual_seed(8)
    codebooks = torch.randn(4, 256, DIM // 4, generator=g)
    codes = torch.randint(0, 256, (sum(lengths), 4), generator=g, dtype=torch.uint8)
    offsets = torch.tensor([0, 2, 7, 10, 11, 15])
    shard = PQShard.from_corpus(codes, offsets, codebooks, *[(0, 4), (4, 5)][rank])
    scorer = default_scorer("pq", "reference")
    index = ShardedIndex(shard, scorer)
    Q = random_queries(2, 3, DIM, seed=9)
    whole = scorer(Q, PQShard.from_corpus(codes, offsets, codebooks, 0, 5))
    _assert_same_topk(index.score(Q, 3), exact_topk(whole, 3), f"rank {rank}, pq")


def scenario_triton_dense():
    """The real Triton kernel (interpreter on CPU): shards score documents as the whole corpus does."""
    rank = dist.get_rank()
    embeddings, offsets = _tie_heavy_dense_corpus()
    scorer = default_scorer("dense", "op")
    index = ShardedIndex(DenseShard.from_corpus(embeddings, offsets, *[(0, 5), (5, 13)][rank]), scorer)
    Q = random_queries(2, 3, DIM, seed=10)
    whole = scorer(Q, DenseShard.from_corpus(embeddings, offsets, 0, 13))
    _assert_same_topk(index.score(Q, 6), exact_topk(whole, 6), f"rank {rank}, triton")


def scenario_triton_residual(index_path):
    """The real residual kernel (interpreter on CPU) on a sharded on-disk PLAID index."""
    rank = dist.get_rank()
    scorer = default_scorer("residual", "op")
    index = ShardedResidualIndex.from_plaid_index(index_path, scorer=scorer)
    Q = random_queries(2, 3, DIM, seed=13)
    whole = scorer(Q, load_plaid_shard(index_path, 0, index.num_docs))
    _assert_same_topk(index.score(Q, 5), exact_topk(whole, 5), f"rank {rank}, triton residual")


def scenario_errors():
    rank = dist.get_rank()
    embeddings, offsets = _tie_heavy_dense_corpus()
    scorer = default_scorer("dense", "reference")
    index = ShardedIndex(DenseShard.from_corpus(embeddings, offsets, *[(0, 6), (6, 13)][rank]), scorer)
    Q = random_queries(2, 3, DIM, seed=1)
    for bad_k in (0, -3, 2.5):
        with pytest.raises(ValueError, match="k must be a positive int"):
            index.score(Q, bad_k)
    with pytest.raises(ValueError, match="embedding dimension"):
        index.score(random_queries(2, 3, DIM + 8, seed=1), 3)
    # One rank passes other shapes: both ranks raise instead of waiting on each other.
    with pytest.raises(ValueError, match="same shapes"):
        index.score(Q[: rank + 1], 3)
    with pytest.raises(ValueError, match="same shapes"):
        index.score(Q, 3 + rank)
    with pytest.raises(ValueError, match="pids must lie in"):
        index.score(Q, 3, pids=torch.tensor([0, 13]))
    with pytest.raises(ValueError, match="unique"):
        index.score(Q, 3, pids=torch.tensor([2, 2]))
    # Shards of different dimensions.
    dim = DIM if rank == 0 else DIM * 2
    other, other_offsets = random_packed_corpus([2, 3], dim, seed=2)
    with pytest.raises(ValueError, match="dim"):
        ShardedIndex(DenseShard.from_corpus(other, other_offsets, 0, 2), scorer)
    # Overlapping ranges.
    with pytest.raises(ValueError, match="without gaps or overlaps"):
        ShardedIndex(DenseShard.from_corpus(embeddings, offsets, *[(0, 6), (5, 13)][rank]), scorer)
    # A corpus of one document on two ranks.
    tiny, tiny_offsets = random_packed_corpus([3], DIM, seed=3)
    with pytest.raises(ValueError, match="larger than the corpus"):
        ShardedDenseIndex.from_corpus(tiny, tiny_offsets, scorer=scorer)
    with pytest.raises(ValueError, match="larger than the corpus"):
        ShardedIndex(DenseShard.from_corpus(tiny, tiny_offsets, *[(0, 1), (1, 1)][rank]), scorer)
    # The group still works after all of the above.
    assert index.score(Q, 2)[1].shape == (2, 2)


def scenario_cli(tmp_dir):
    from tilemaxsim_plaid.distributed.cli import main

    embeddings, offsets = _tie_heavy_dense_corpus()
    Q = random_queries(3, 4, DIM, seed=12)
    corpus_path, queries_path = os.path.join(tmp_dir, "corpus.pt"), os.path.join(tmp_dir, "queries.pt")
    output = os.path.join(tmp_dir, "ranking.tsv")
    if dist.get_rank() == 0:
        torch.save({"embeddings": embeddings, "offsets": offsets}, corpus_path)
        torch.save({"Q": Q, "query_lengths": torch.tensor([4, 2, 3])}, queries_path)
    dist.barrier()
    assert main(["--dense", corpus_path, "--queries", queries_path, "--k", "5", "--scorer", "reference",
                 "--batch-size", "2", "--output", output]) == 0
    dist.barrier()
    scorer = default_scorer("dense", "reference")
    whole = scorer(Q, DenseShard.from_corpus(embeddings, offsets, 0, 13), query_lengths=torch.tensor([4, 2, 3]))
    want_scores, want_pids = exact_topk(whole, 5)
    with open(output) as f:
        rows = [line.split("\t") for line in f.read().splitlines()]
    assert [(int(q), int(p), int(r)) for q, p, r, _ in rows] == [
        (q, want_pids[q, r].item(), r + 1) for q in range(3) for r in range(5)]
    assert [float(s) for *_, s in rows] == want_scores.flatten().tolist()


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize(
    "ranges, batch_size, max_docs_per_call",
    [
        pytest.param([(0, 2), (2, 13)], None, None, id="unequal-2-11"),
        pytest.param([(0, 10), (10, 13)], 2, 3, id="unequal-10-3-batched-blocked"),
        pytest.param([(7, 13), (0, 7)], 1, 1, id="rank-order-not-pid-order"),
    ],
)
def test_dense_sharded_equals_single_process(tmp_path, ranges, batch_size, max_docs_per_call):
    run_on_two_ranks(tmp_path, scenario_dense, ranges, batch_size, max_docs_per_call)


@pytest.mark.parametrize("balance", [pytest.param("tokens", id="tokens"), pytest.param("docs", id="docs")])
def test_dense_from_corpus_balances(tmp_path, balance):
    run_on_two_ranks(tmp_path, scenario_dense_from_corpus, balance)


@pytest.mark.parametrize("nbits", [pytest.param(1, id="nbits1"), pytest.param(2, id="nbits2"),
                                   pytest.param(4, id="nbits4")])
def test_residual_plaid_index_sharded_equals_single_process(tmp_path, nbits):
    # Three chunks; the token-balanced cut falls inside chunk 1, so rank 1 reads two chunk files.
    index_path = str(tmp_path / "index")
    write_plaid_index(index_path, [[3, 1, 4], [1, 5, 9, 2], [6, 5]], dim=DIM, nbits=nbits,
                      num_centroids=16, seed=nbits)
    run_on_two_ranks(tmp_path, scenario_residual_plaid, index_path, nbits)


def test_residual_ties_across_unequal_shards(tmp_path):
    run_on_two_ranks(tmp_path, scenario_residual_ties)


def test_pq_sharded_equals_single_process(tmp_path):
    run_on_two_ranks(tmp_path, scenario_pq)


def test_triton_dense_op_sharded_equals_single_process(tmp_path):
    run_on_two_ranks(tmp_path, scenario_triton_dense)


def test_triton_residual_op_sharded_equals_single_process(tmp_path):
    index_path = str(tmp_path / "index")
    write_plaid_index(index_path, [[3, 1, 4], [1, 5, 2]], dim=DIM, nbits=2, num_centroids=16, seed=3)
    run_on_two_ranks(tmp_path, scenario_triton_residual, index_path)


def test_bad_input_raises_on_every_rank(tmp_path):
    run_on_two_ranks(tmp_path, scenario_errors)


def test_cli_main_writes_the_single_process_ranking(tmp_path):
    run_on_two_ranks(tmp_path, scenario_cli, str(tmp_path))
