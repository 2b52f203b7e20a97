"""Packed-document MaxSim on tensor cores with per-warp document streams (scoring="mma",
kernels/maxsim_dense_mma.cu).

The kernel is CUDA C++ and runs on a GPU only. On the CPU its column order is replayed with the
kernel's indexing (the query's fragments from one formula, the documents' loaded words from
another: they must pair up) and scored against the float64 reference; the source is compiled for
sm_90 by NVRTC in every variant the host launches. On a GPU the kernel itself is checked against
the reference over d = 64-768 and odd query lengths, pids, empty documents, strided and
misaligned rows, NaN and inf, and a CUDA graph replay.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ON_GPU, compile_cubin_sm90, replayed_from_cuda_graph
from tests.kernels.test_maxsim_dense import _packed_from_lengths, _rand
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import dense, dense_mma
from tilemaxsim_plaid.ops.dense import MaxSimConfig, maxsim_packed, maxsim_padded

on_gpu = pytest.mark.skipif(not ON_GPU, reason="the CUDA kernel needs a GPU; the CPU replays its "
                                                "column order in the tests above")
MMA = MaxSimConfig(scoring="mma")
DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dim", [64, 128, 384, 768])
def test_column_order_is_a_permutation_of_whole_load_segments(dim):
    order = dense_mma.mma_column_order(dim)
    assert sorted(order.tolist()) == list(range(dim))
    # Lane quad q's columns of chunk c are its two loads' 8-column segments, at 64c + 8q and
    # 64c + 32 + 8q: the four quads' segments of a load one contiguous run of 32.
    k = torch.arange(dim) % 16
    quads = (k % 8) // 2
    chunk = torch.arange(dim) // 64
    for c in range(dim // 64):
        for q in range(4):
            mine = order[(chunk == c) & (quads == q)]
            want = [64 * c + 32 * load + 8 * q + i for load in range(2) for i in range(8)]
            assert sorted(mine.tolist()) == want


def _kernel_dim_of(kb, q, h):
    """kernels/maxsim_dense_mma.cu's dim_of: the query fragments' column pairs."""
    r = 2 * (kb % 4) + h
    return (kb // 4) * 64 + (r // 4) * 32 + q * 8 + 2 * (r % 4)


@pytest.mark.parametrize("dim", [64, 192])
@pytest.mark.parametrize("rows", [1, 16, 33, 64])
def test_replayed_fragments_score_like_the_reference(dim, rows):
    """The products as the kernel forms them: A fragments from its query formula, B registers
    from the words its lanes load (loads lo and hi at 64c + 8q and 64c + 32 + 8q, word r of the
    chunk register r % 2 of k-block 4c + r // 2), m16n8k16 semantics, then the max over tokens
    and the sum over rows."""
    torch.manual_seed(0)
    Q = torch.randn(rows, dim, dtype=torch.float64)
    D = torch.randn(11, dim, dtype=torch.float64)
    blocks = -(-rows // 16)
    order = dense_mma.mma_column_order(dim)
    S = torch.zeros(16 * blocks, D.shape[0], dtype=torch.float64)
    for kb in range(dim // 16):
        c, kbi = divmod(kb, 4)
        for g in range(8):
            for q in range(4):
                for h in range(2):
                    for p in range(2):
                        k = 2 * q + 8 * h + p  # the product column of this lane's pair
                        a_dim = _kernel_dim_of(kb, q, h) + p
                        load, within = divmod(2 * kbi + h, 4)
                        b_dim = 64 * c + 32 * load + 8 * q + 2 * within + p
                        assert a_dim == b_dim == int(order[kb * 16 + k])
                        for mb in range(blocks):
                            for r in range(2):
                                row = mb * 16 + g + 8 * r
                                if row < rows:
                                    S[row] += Q[row, a_dim] * D[:, b_dim]
    scores = S[:rows].amax(dim=1).sum()
    torch.testing.assert_close(scores, (Q @ D.T).amax(dim=1).sum())


def test_kernel_source_compiles_for_sm90():
    """NVRTC compiles every variant the host launches for the H200 without a GPU."""
    for element in dense_mma.ELEMENT_NAMES.values():
        for dim in (128, 768):
            for blocks in (1, 2, 3, 4):
                warps, depth = dense_mma.pipeline(blocks)
                cubin = compile_cubin_sm90(
                    dense_mma.SOURCE, {"WARPS": warps, "ELEM": element, "DIM": dim,
                                       "QUERY_BLOCKS": blocks, "DEPTH": depth})
                assert cubin[:4] == b"\x7fELF"


def test_pipeline_keeps_registers_within_the_warps():
    assert dense_mma.pipeline(1) == dense_mma.pipeline(2) == dense_mma.pipeline(3) == (16, 2)
    assert dense_mma.pipeline(4) == (12, 2)


def test_reasons_name_what_does_not_apply():
    Q = torch.zeros(1, 4, 96, dtype=torch.float32)
    D = torch.zeros(5, 96, dtype=torch.float32)
    reasons = " ".join(dense_mma.reasons_not_to_apply(Q, D))
    for what in ("dtype torch.float32", "d = 96", "device cpu"):
        assert what in reasons
    Q16 = torch.zeros(1, 4, 128, dtype=torch.float16)
    odd = torch.zeros(5, 136, dtype=torch.float16)[:, 4:132]  # rows start 8 bytes in
    assert any("aligned" in r for r in dense_mma.reasons_not_to_apply(Q16, odd))
    assert any("without rows" in r
               for r in dense_mma.reasons_not_to_apply(Q16, torch.zeros(0, 128, dtype=torch.float16)))


def test_scoring_is_a_checked_config_field():
    Q = torch.zeros(4, 128, dtype=torch.float16)
    D, offsets = _packed_from_lengths([3, 4], 128, torch.float16, "cpu")
    with pytest.raises(ValueError, match="scoring"):
        maxsim_packed(Q, D, offsets, config=MaxSimConfig(scoring="wgmma"))
    with pytest.raises(ValueError, match="packed layout"):
        maxsim_padded(Q, torch.zeros(2, 5, 128, dtype=torch.float16), config=MMA)
    if not ON_GPU:
        with pytest.raises(ValueError, match="a CUDA GPU"):
            maxsim_packed(Q, D, offsets, config=MMA)


@on_gpu
@pytest.mark.parametrize("blocks", [1, 2, 3, 4])
def test_kernel_fits_its_registers_without_spills(device, blocks):
    warps, depth = dense_mma.pipeline(blocks)
    kernel = dense_mma.kernel(device, torch.float16, 128, blocks, warps, depth)
    assert kernel.num_regs * 32 * warps <= 65536
    assert kernel.local_bytes == 0


# Lengths around the 8-token halves and 16-token tiles, empty documents first, inside and last.
LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 33, 0, 130, 64, 2, 31, 0]


@on_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 128, 192, 384, 768])
@pytest.mark.parametrize("Lq", [1, 9, 16, 32, 33, 48, 64, 65, 130])
def test_kernel_matches_reference(device, dtype, dim, Lq):
    D, offsets = _packed_from_lengths(LENGTHS * 7, dim, dtype, device)
    Q = _rand(3, Lq, dim, dtype=dtype, device=device)
    query_lengths = torch.tensor([Lq, max(Lq // 2, 1), 0], device=device)
    out = maxsim_packed(Q, D, offsets, query_lengths=query_lengths, config=MMA)
    want = reference.maxsim_packed(Q, D, offsets, query_lengths=query_lengths)
    assert_close(out, want, "maxsim_dense", dtype)
    assert torch.isneginf(out[:2, 0]).all() and (out[2] == 0).all()
    assert torch.isneginf(out[:2, -1]).all()


@on_gpu
@pytest.mark.parametrize("grab", [1, 3, 4, 16])
def test_kernel_grabs_and_pids(device, grab):
    lengths = torch.randint(0, 140, (5000,), generator=torch.Generator().manual_seed(3)).tolist()
    D, offsets = _packed_from_lengths(lengths, 128, torch.float16, device)
    pids = torch.randperm(5000, device=device)[:777].int()
    Q = _rand(2, 32, 128, dtype=torch.float16, device=device)
    config = MaxSimConfig(scoring="mma", docs_per_program=grab)
    out = maxsim_packed(Q, D, offsets, pids, config=config)
    assert_close(out, reference.maxsim_packed(Q, D, offsets, pids), "maxsim_dense", torch.float16)
    whole = maxsim_packed(Q[0], D, offsets, config=config)
    assert_close(whole, reference.maxsim_packed(Q[0], D, offsets), "maxsim_dense", torch.float16)
    # The Triton default on the same documents: the same exact products, summed in fp32.
    torch.testing.assert_close(whole, maxsim_packed(Q[0], D, offsets), rtol=1e-5, atol=1e-5)


@on_gpu
def test_kernel_reads_strided_rows_and_strided_queries(device):
    """Rows of a wider tensor and a query with strided rows; rows not 16-byte aligned refused."""
    lengths = [5, 0, 40, 17, 9]
    wide, offsets = _packed_from_lengths(lengths, 200, torch.float16, device)
    D = wide[:, 8:136]
    Q = _rand(2, 70, 128, dtype=torch.float16, device=device)[:, ::2]
    out = maxsim_packed(Q, D, offsets, config=MMA)
    assert_close(out, reference.maxsim_packed(Q, D, offsets), "maxsim_dense", torch.float16)
    with pytest.raises(ValueError, match="aligned"):
        maxsim_packed(Q, wide[:, 4:132], offsets, config=MMA)


@on_gpu
def test_kernel_takes_strided_views_of_every_index_argument(device):
    """offsets, pids and query_lengths as columns of 2-D tensors score as the contiguous ones."""
    lengths = torch.randint(0, 90, (600,), generator=torch.Generator().manual_seed(4)).tolist()
    D, offsets = _packed_from_lengths(lengths, 128, torch.float16, device)
    pids = torch.randperm(600, device=device)[:97]
    Q = _rand(3, 40, 128, dtype=torch.float16, device=device)
    query_lengths = torch.tensor([40, 7, 0], device=device)

    def column(t):
        return torch.stack([t, torch.full_like(t, -1)], 1)[:, 0]

    want = maxsim_packed(Q, D, offsets, pids, query_lengths=query_lengths, config=MMA)
    got = maxsim_packed(Q, D, column(offsets), column(pids), query_lengths=column(query_lengths),
                        config=MMA)
    assert torch.equal(got, want)
    assert_close(got, reference.maxsim_packed(Q, D, offsets, pids, query_lengths=query_lengths),
                 "maxsim_dense", torch.float16)


@on_gpu
def test_kernel_nan_and_inf_reach_exactly_their_scores(device):
    D, offsets = _packed_from_lengths([3, 20, 0, 9], 128, torch.float16, device)
    Q = _rand(1, 32, 128, dtype=torch.float16, device=device)
    clean = maxsim_packed(Q, D, offsets, config=MMA, validate=False)
    poisoned = D.clone()
    poisoned[10, 5] = float("nan")  # a token of document 1
    out = maxsim_packed(Q, poisoned, offsets, config=MMA, validate=False)
    assert torch.isnan(out[0, 1]) and torch.equal(out[0, [0, 2, 3]], clean[0, [0, 2, 3]])
    poisoned = D.clone()
    poisoned[0] = float("inf")  # every product of document 0's first token: +-inf or NaN
    out = maxsim_packed(Q, poisoned, offsets, config=MMA, validate=False)
    want = reference.maxsim_packed(Q, poisoned, offsets)
    assert torch.equal(torch.isnan(out), torch.isnan(want.float()))
    assert torch.equal(out[0, 1:], clean[0, 1:])
    # A NaN in a query row past the query's length counts for nothing.
    Qn = Q.clone()
    Qn[0, 20] = float("nan")
    out = maxsim_packed(Qn, D, offsets, query_lengths=torch.tensor([20], device=device),
                        config=MMA, validate=False)
    assert not torch.isnan(out).any()
    assert_close(out, reference.maxsim_packed(Q, D, offsets,
                                              query_lengths=torch.tensor([20], device=device)),
                 "maxsim_dense", torch.float16)


@on_gpu
def test_kernel_replays_from_a_cuda_graph(device):
    D, offsets = _packed_from_lengths(LENGTHS * 20, 128, torch.float16, device)
    Q = _rand(2, 40, 128, dtype=torch.float16, device=device)
    eager = maxsim_packed(Q, D, offsets, config=MMA)
    captured = replayed_from_cuda_graph(
        lambda: maxsim_packed(Q, D, offsets, config=MMA, validate=False))
    assert torch.equal(captured, eager)


def test_default_configs_keep_the_triton_kernels():
    assert dense.default_config(1, 32, None, 128, True, 100_000).scoring == "tiles"
