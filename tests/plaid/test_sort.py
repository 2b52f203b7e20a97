"""The one-program candidate sort against torch: same order up to the tie rule, exact values."""

from __future__ import annotations

import math

import pytest
import torch

from tilemaxsim_plaid.ops.sort import MAX_SORTED_IN_ONE_PROGRAM, sort_candidates


def _expected(pids, scores, valid):
    used = torch.ones_like(pids, dtype=torch.bool) if valid is None else valid
    # -0.0 ranks just below +0.0: the kernel orders the floats' bit patterns.
    rows = sorted((-float(s), math.copysign(1.0, float(s)) < 0, int(p), float(s))
                  for p, s, u in zip(pids, scores, used) if u)
    return [row[2] for row in rows], [row[3] for row in rows], int(used.sum())


@pytest.mark.parametrize("K", [1, 5, 64, 100, 1024, MAX_SORTED_IN_ONE_PROGRAM])
@pytest.mark.parametrize("with_valid", [False, True])
def test_sorts_by_score_then_pid_with_unused_slots_last(K, with_valid, device):
    generator = torch.Generator().manual_seed(K)
    # Large ids (the key keeps 31 bits of them); a repeated id (a rerank may repeat) is fine.
    pids = torch.randint(0, 2**31 - 1, (K,), generator=generator)
    pids[-1] = 2**31 - 1 if K > 1 else pids[-1]
    # Ties (rounded scores), both signs, zeros of both signs, infinities and PLAID's floor.
    scores = (torch.randn(K, generator=generator) * 8).round() / 4
    scores[: K // 7] = torch.tensor([-0.0, 0.0, float("inf"), float("-inf"), -9999.0 * 32, 1e-30, -1e-30])[
        torch.arange(K // 7) % 7]
    valid = (torch.rand(K, generator=generator) < 0.8) if with_valid else None
    got_pids, got_scores, got_valid = (t.cpu() for t in sort_candidates(
        pids.to(device), scores.to(device), None if valid is None else valid.to(device)))
    expected_pids, expected_scores, used = _expected(pids, scores, valid)
    assert int(got_valid.sum()) == used and bool(got_valid[:used].all())
    assert got_pids[:used].tolist() == expected_pids
    # Bit-exact values (the float round trip through the key), -0.0 included.
    assert torch.equal(got_scores[:used].view(torch.int32),
                       torch.tensor(expected_scores, dtype=torch.float32).view(torch.int32))
    assert bool(torch.isneginf(got_scores[used:]).all()) and bool((got_pids[used:] == 0).all())


def test_bad_inputs_are_refused():
    with pytest.raises(TypeError, match="int64"):
        sort_candidates(torch.zeros(3, dtype=torch.int32), torch.zeros(3), None)
    with pytest.raises(ValueError, match="slots"):
        sort_candidates(torch.zeros(MAX_SORTED_IN_ONE_PROGRAM + 1, dtype=torch.int64),
                        torch.zeros(MAX_SORTED_IN_ONE_PROGRAM + 1), None)


@pytest.mark.parametrize("with_valid", [False, True])
def test_top_candidates_keep_the_same_scores_on_both_backends(with_valid, monkeypatch, device):
    """The head of the one-program sort and torch.topk keep the same multiset of scores (which of
    several tied slots at the cut is kept may differ: the sort keeps the smaller pid)."""
    import types

    from tilemaxsim_plaid.plaid import backends

    generator = torch.Generator().manual_seed(7)
    index = types.SimpleNamespace(device=device, num_docs=10_000)
    pids = torch.randperm(10_000, generator=generator)[:1000]
    scores = (torch.randn(1000, generator=generator) * 4).round()  # many ties
    valid = (torch.rand(1000, generator=generator) < 0.9) if with_valid else None
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    kept = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
        top_pids, top_valid = backends.top_candidates(index, pids.to(device), scores.to(device),
                                                      None if valid is None else valid.to(device), 250)
        assert top_pids.shape == (250,) and (top_valid is None or top_valid.shape == (250,))
        score_of = dict(zip(pids.tolist(), scores.tolist()))
        kept[backend] = sorted((score_of[p] for p in top_pids.cpu().tolist()), reverse=True)
    assert kept["torch"] == kept["triton"]


def test_sorted_lists_are_packed_and_clone_in_one_buffer(device):
    """The sort writes one byte buffer; RankedCandidates clones it whole (one copy per graph
    replay) and keeps pids, scores and valid as before."""
    from tilemaxsim_plaid.ops.packed_lists import packed_base
    from tilemaxsim_plaid.plaid.scoring import RankedCandidates

    pids = torch.tensor([5, 3, 9, 1], dtype=torch.int64, device=device)
    scores = torch.tensor([0.5, 2.0, -1.0, 2.0], device=device)
    valid = torch.tensor([True, True, False, True], device=device)
    ranked = RankedCandidates(*sort_candidates(pids, scores, valid))
    base = packed_base(ranked.pids, ranked.scores, ranked.valid)
    assert base is not None and base.numel() == 13 * 4
    copy = ranked.clone()
    copy_base = packed_base(copy.pids, copy.scores, copy.valid)
    assert copy_base is not None and copy_base.data_ptr() != base.data_ptr()
    base.zero_()  # what the next replay would do to the original
    assert copy.pids.tolist() == [1, 3, 5, 0] and copy.scores.tolist()[:3] == [2.0, 2.0, 0.5]
    assert copy.valid.tolist() == [True, True, True, False]
    assert copy.to_lists() == ([1, 3, 5], [2.0, 2.0, 0.5])
    # Tensors that live apart are not mistaken for a packed list, and clone one by one.
    apart = RankedCandidates(pids.clone(), scores.clone(), valid.clone())
    assert packed_base(apart.pids, apart.scores, apart.valid) is None
    assert torch.equal(apart.clone().pids, pids)
    assert apart.to_lists() == ([5, 3, 1], [0.5, 2.0, 2.0]), "stored order, unused slot dropped"
