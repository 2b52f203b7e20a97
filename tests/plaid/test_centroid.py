"""The fused centroid-interaction op (PLAID stages 2-3) against its float64 reference."""

from __future__ import annotations

import pytest
import torch

from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.centroid import centroid_interaction


def _packed_index(doc_lengths, num_centroids, device):
    lengths = torch.tensor(doc_lengths, dtype=torch.int64)
    offsets = torch.zeros(len(doc_lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    # Trailing rows past offsets[-1], like colbert-ai's 512 padding rows: never read.
    codes = torch.randint(0, num_centroids, (int(offsets[-1]) + 5,), dtype=torch.int32)
    return codes.to(device), offsets.to(device)


CASES = [
    pytest.param(dict(C=64, Lq=32, lengths=[70, 1, 0, 33, 129], pids=None, keep=None), id="stage3-all-docs"),
    pytest.param(dict(C=64, Lq=31, lengths=[70, 1, 0, 33, 129], pids=None, keep=0.5), id="stage2-pruned-Lq31"),
    pytest.param(dict(C=17, Lq=1, lengths=[5, 64, 65], pids=[2, 0, 2, 1], keep=0.3), id="Lq1-duplicate-pids"),
    pytest.param(dict(C=40, Lq=130, lengths=[3, 90], pids=[1, 0], keep=None), id="Lq130-two-launches"),
    pytest.param(dict(C=40, Lq=0, lengths=[3, 0], pids=None, keep=None), id="no-query-tokens"),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_matches_reference(case, dtype, device):
    codes, offsets = _packed_index(case["lengths"], case["C"], device)
    centroid_scores = torch.randn(case["C"], case["Lq"], device=device).to(dtype)
    pids = None if case["pids"] is None else torch.tensor(case["pids"], device=device)
    keep = None if case["keep"] is None else torch.rand(case["C"], device=device) < case["keep"]
    actual = centroid_interaction(centroid_scores, codes, offsets, pids, keep=keep)
    expected = reference.centroid_interaction(centroid_scores, codes, offsets, pids, keep=keep)
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    assert_close(actual[finite], expected[finite], "centroid_interaction", dtype)


def test_invalid_slots_score_minus_inf_and_are_not_read(device):
    codes, offsets = _packed_index([4, 9, 2], 8, device)
    centroid_scores = torch.randn(8, 32, device=device)
    # Slot 1 points at a pid past the end: only safe because it is never read.
    pids = torch.tensor([0, 1000, 2, 1], device=device)
    valid = torch.tensor([True, False, True, True], device=device)
    actual = centroid_interaction(centroid_scores, codes, offsets, pids, valid=valid, validate=False)
    safe = torch.where(valid, pids, torch.zeros_like(pids))
    expected = reference.centroid_interaction(centroid_scores, codes, offsets, safe, valid=valid)
    assert torch.isneginf(actual[1])
    assert_close(actual[valid], expected[valid], "centroid_interaction", torch.float32)


def test_matches_colbert_filter_semantics_on_a_real_pruning_mask(device):
    # Stage 2 exactly as PLAID builds it: keep the centroids whose best query token passes 0.45.
    codes, offsets = _packed_index([30, 45, 12, 80], 256, device)
    centroid_scores = torch.rand(256, 32, device=device) * 0.9
    keep = centroid_scores.max(-1).values >= 0.45
    actual = centroid_interaction(centroid_scores, codes, offsets, keep=keep)
    rows = [codes[int(offsets[n]):int(offsets[n + 1])].long() for n in range(4)]
    by_loop = torch.stack([
        centroid_scores[r[keep[r]]].double().max(0).values.sum() if keep[r].any() else torch.tensor(float("-inf"))
        for r in rows
    ])
    assert_close(actual, by_loop.to(actual.device), "centroid_interaction", torch.float32)


@pytest.mark.parametrize("Lq", [31, 130], ids=["one-launch", "two-launches"])
@pytest.mark.parametrize("num_used", [0, 1, 7, 37, 40], ids=lambda n: f"used{n}")
def test_num_used_scores_the_used_prefix_and_minus_inf_past_it(num_used, Lq, device):
    """A fixed-capacity list (used slots first, as nonzero_static leaves them): with num_used
    the fixed grid gives the scores of a one-program-per-slot launch whose valid mask also
    ends at num_used, bit for bit, including unread garbage pids past the count."""
    g = torch.Generator().manual_seed(num_used)
    lengths = torch.randint(0, 90, (23,), generator=g).tolist()
    codes, offsets = _packed_index(lengths, 50, device)
    centroid_scores = torch.randn(50, Lq, generator=g).to(device)
    keep = (torch.rand(50, generator=g) < 0.6).to(device)
    pids = torch.randint(0, 23, (40,), generator=g)
    pids[num_used:] = 10**6  # never read
    valid = torch.rand(40, generator=g) < 0.9
    valid[num_used:] = False
    pids, valid = pids.to(device), valid.to(device)
    count = torch.tensor([[num_used, 10**6]], device=device)[:, 0]  # a strided one-element view
    fixed = centroid_interaction(centroid_scores, codes, offsets, pids, keep=keep, valid=valid,
                                 unmatched=-9999.0, num_used=count, validate=False)
    assert torch.equal(fixed, centroid_interaction(
        centroid_scores, codes, offsets, pids, keep=keep, valid=valid, unmatched=-9999.0,
        num_used=torch.tensor(num_used, device=device), validate=False)), "a 0-d count alike"
    safe = torch.where(valid, pids, torch.zeros_like(pids))
    per_slot = centroid_interaction(centroid_scores, codes, offsets, safe, keep=keep, valid=valid,
                                    unmatched=-9999.0)
    assert torch.equal(fixed, per_slot)
    assert torch.isneginf(fixed[num_used:]).all()
    expected = reference.centroid_interaction(centroid_scores, codes, offsets, safe, keep=keep,
                                              valid=valid)
    finite = torch.isfinite(expected)
    assert_close(fixed[finite], expected[finite], "centroid_interaction", torch.float32)


@pytest.mark.parametrize("num_used, match", [
    pytest.param(torch.tensor([6]), "num_used must lie in", id="past-the-slots"),
    pytest.param(torch.tensor([-1]), "num_used must lie in", id="negative"),
    pytest.param(torch.tensor([1, 2]), "num_used must hold one count", id="two-counts"),
    pytest.param(torch.tensor(2.0), "num_used", id="float"),
])
def test_bad_num_used_is_refused_by_name(num_used, match):
    codes, offsets = _packed_index([4, 2, 6], 8, "cpu")
    with pytest.raises((ValueError, TypeError), match=match):
        centroid_interaction(torch.randn(8, 32), codes, offsets, torch.tensor([0, 1, 2, 0, 1]),
                             num_used=num_used)


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        pytest.param(lambda a: a.update(centroid_scores=a["centroid_scores"][None]), ValueError, "centroid_scores", id="3d-scores"),
        pytest.param(lambda a: a.update(codes=a["codes"].float()), TypeError, "codes", id="float-codes"),
        pytest.param(lambda a: a.update(pids=torch.tensor([0, 3])), ValueError, "pids", id="pid-out-of-range"),
        pytest.param(lambda a: a.update(keep=torch.ones(7, dtype=torch.bool)), ValueError, "keep", id="keep-wrong-length"),
        pytest.param(lambda a: a.update(offsets=a["offsets"].int()), TypeError, "offsets", id="int32-offsets"),
        pytest.param(lambda a: a.update(codes=a["codes"] + 100), ValueError, "codes", id="code-out-of-range"),
        pytest.param(lambda a: a.update(valid=torch.ones(5, dtype=torch.bool)), ValueError, "valid", id="valid-wrong-length"),
    ],
)
def test_bad_inputs_name_the_argument(mutate, error, match):
    codes, offsets = _packed_index([4, 2, 6], 8, "cpu")
    args = dict(centroid_scores=torch.randn(8, 32), codes=codes, offsets=offsets, pids=None, keep=None, valid=None)
    mutate(args)
    with pytest.raises(error, match=match):
        centroid_interaction(args.pop("centroid_scores"), args.pop("codes"), args.pop("offsets"), **args)


@pytest.mark.parametrize("Lq", [32, 130], ids=["one-launch", "two-launches"])
def test_unmatched_documents_score_the_floor_per_query_token(Lq, device):
    """PLAID's semantics fused into the kernel: a used slot whose document keeps no token (or has
    none) scores unmatched * Lq; unused slots stay -inf; every other score is unchanged."""
    codes, offsets = _packed_index([6, 0, 9, 4, 7], 16, device)
    centroid_scores = torch.randn(16, Lq, device=device)
    keep = torch.zeros(16, dtype=torch.bool, device=device)
    keep[codes[int(offsets[0]) : int(offsets[1])].long()] = True  # doc 0 keeps all its tokens
    keep[codes[int(offsets[2])].long()] = True  # doc 2 keeps some of them
    pids = torch.tensor([0, 1, 2, 3, 4, 4], device=device)
    valid = torch.tensor([True, True, True, True, True, False], device=device)
    plain = centroid_interaction(centroid_scores, codes, offsets, pids, keep=keep, valid=valid)
    floored = centroid_interaction(centroid_scores, codes, offsets, pids, keep=keep, valid=valid,
                                   unmatched=-9999.0)
    unmatched = torch.isneginf(plain) & valid
    assert unmatched.any() and (~unmatched & valid).any(), "both kinds of used slot are present"
    assert torch.equal(floored[unmatched], torch.full_like(floored[unmatched], -9999.0 * Lq))
    assert torch.equal(floored[~unmatched & valid], plain[~unmatched & valid])
    assert torch.isneginf(floored[~valid]).all()
    # Without a valid mask every slot is used: the empty document 1 is floored too.
    every = centroid_interaction(centroid_scores, codes, offsets, keep=keep, unmatched=-9999.0)
    assert every[1] == -9999.0 * Lq and not torch.isneginf(every).any()


def test_torch_backend_floors_unmatched_documents_as_the_kernel_does(device):
    """The CPU backend (reference + floor) and the fused kernel agree on the floor."""
    import types

    from tilemaxsim_plaid.plaid import backends

    codes, offsets = _packed_index([6, 0, 9, 4, 7], 16, "cpu")
    index = types.SimpleNamespace(device=torch.device("cpu"), codes=codes, offsets=offsets)
    assert backends.backend_for(index.device) == "torch"
    centroid_scores = torch.randn(16, 32)
    keep = torch.rand(16) < 0.3
    pids = torch.tensor([0, 1, 2, 3, 4, 4])
    valid = torch.tensor([True, True, True, True, True, False])
    on_cpu = backends.centroid_interaction(index, centroid_scores, pids, keep=keep, valid=valid, unmatched=-9999.0)
    fused = centroid_interaction(centroid_scores.to(device), codes.to(device), offsets.to(device), pids.to(device),
                                 keep=keep.to(device), valid=valid.to(device), unmatched=-9999.0).cpu()
    assert torch.equal(torch.isneginf(on_cpu), torch.isneginf(fused)) and torch.isneginf(on_cpu[5])
    assert_close(on_cpu[:5], fused[:5], "centroid_interaction", torch.float32)


def _probe_table(C, R, dtype, device, strided):
    table = torch.randn(R, C).t() if strided else torch.randn(C, R)  # strided: a transposed view
    if C > 8 and R > 2:
        table[3, 1] = float("nan")         # column 1's argmax, row 3 never kept
        table[C - 1, 2] = float("inf")     # column 2's argmax at the last row
        table[5, 2] = float("inf")         # ... unless an earlier +inf ties it: the first one
        table[:, R - 1] = float("-inf")    # a column of -inf: the first row
        table[7] = 0.25                    # a row tied across its columns
        table[C // 2:, 0] = table[:, 0].max()  # ties in column 0 across programs
    table = table.to(dtype)
    return table.to(device) if not strided else table.t().contiguous().t().to(device)


@pytest.mark.parametrize("C,R", [(1, 1), (7, 3), (300, 32), (4097, 17), (129, 64), (70, 200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "transposed-view"])
def test_probe_centroids_equals_torchs_two_reductions(C, R, dtype, strided, device):
    """Stage 1's fused reductions: cells and pruning mask bit for bit as torch's argmax over the
    centroids and max over the query columns, with NaN, +-inf and ties across programs."""
    from tilemaxsim_plaid.ops.centroid import probe_centroids

    table = _probe_table(C, R, dtype, device, strided)
    assert strided is (not table.is_contiguous()) or R == 1 or C == 1
    for threshold in (0.25, 0.5, float("-inf"), float("inf")):
        cells, keep = probe_centroids(table, threshold)
        assert cells.dtype == torch.int64 and keep.dtype == torch.bool
        assert torch.equal(cells, table.argmax(dim=0))
        assert torch.equal(keep, table.max(-1).values >= threshold)


@pytest.mark.parametrize("ncells", [1, 3])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_backends_probe_the_same_cells_and_mask(ncells, backend, monkeypatch, device):
    import types

    from tilemaxsim_plaid.plaid import backends

    monkeypatch.setenv("TILEMAXSIM_PLAID_BACKEND", backend)
    table = torch.randn(500, 32, device=device)
    index = types.SimpleNamespace(device=torch.device(device))
    cells, keep = backends.probe_centroids(index, table, ncells, 0.4)
    assert torch.equal(keep, table.max(-1).values >= 0.4)
    expected = table.topk(ncells, dim=0).indices
    assert torch.equal(cells.view(ncells, 32).sort(0).values, expected.sort(0).values)


@pytest.mark.parametrize("shape, error", [
    pytest.param((0, 32), ValueError, id="no-centroids"),
    pytest.param((8, 0), ValueError, id="no-columns"),
    pytest.param((8, 257), ValueError, id="too-many-columns"),
    pytest.param((8,), ValueError, id="1d"),
])
def test_probe_centroids_refuses_bad_tables_by_name(shape, error):
    from tilemaxsim_plaid.ops.centroid import probe_centroids

    with pytest.raises(error, match="centroid_scores"):
        probe_centroids(torch.randn(shape), 0.5)
    with pytest.raises(TypeError, match="centroid_scores"):
        probe_centroids(torch.zeros(8, 4, dtype=torch.int32), 0.5)


@pytest.mark.parametrize("C,Lq", [(1, 1), (300, 32), (129, 17), (257, 64)])
def test_split_table_probe_equals_the_table_then_the_probe(C, Lq, device):
    """One launch builds the split-query table and reduces it for stage 1: the same table,
    halves, cells and mask as the table build followed by probe_centroids on its output,
    with ties, a NaN query token and a NaN centroid."""
    import torch.nn.functional as F

    from tilemaxsim_plaid.ops.centroid import probe_centroids
    from tilemaxsim_plaid.ops.residual import (split_query_centroid_probe,
                                               split_query_centroid_scores)

    centroids = F.normalize(torch.randn(C, 64), dim=-1).half()
    if C > 8:
        centroids[5] = centroids[2]              # tied rows in every column
        centroids[7, 3] = float("nan")           # one centroid's scores all NaN
    Q = F.normalize(torch.randn(Lq, 64), dim=-1)
    if Lq > 4:
        Q[4, 0] = float("nan")                   # one query column all NaN
    centroids, Q = centroids.to(device), Q.to(device)
    for threshold in (0.3, float("-inf")):
        table, head, tail, cells, keep = split_query_centroid_probe(Q, centroids, threshold)
        want_table, want_head, want_tail = split_query_centroid_scores(Q[None], centroids)
        for got, want in ((table, want_table), (head, want_head), (tail, want_tail)):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        want_cells, want_keep = probe_centroids(table, threshold)
        assert torch.equal(cells, want_cells) and torch.equal(keep, want_keep)
        assert torch.equal(cells, table.argmax(dim=0))
        assert torch.equal(keep, table.max(-1).values >= threshold)
    # Strided views of both operands read as their contiguous copies.
    strided_Q = torch.stack([Q, torch.zeros_like(Q)], -1)[..., 0]
    strided_centroids = centroids.t().contiguous().t()
    assert not strided_Q.is_contiguous() and (C == 1 or not strided_centroids.is_contiguous())
    for got, want in zip(split_query_centroid_probe(strided_Q, strided_centroids, 0.3),
                         split_query_centroid_probe(Q, centroids, 0.3)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_split_table_probe_refuses_what_one_launch_cannot_reduce():
    from tilemaxsim_plaid.ops.residual import split_query_centroid_probe

    centroids = torch.randn(8, 64).half()
    for Q in (torch.randn(65, 64), torch.randn(0, 64), torch.randn(1, 4, 64)):
        with pytest.raises(ValueError, match="split_query_centroid_probe"):
            split_query_centroid_probe(Q, centroids, 0.5)
    with pytest.raises(ValueError, match="C >= 1"):
        split_query_centroid_probe(torch.randn(4, 64), centroids[:0], 0.5)
    with pytest.raises(TypeError, match="fp32 Q and fp16 centroids"):
        split_query_centroid_probe(torch.randn(4, 64).half(), centroids, 0.5)
