"""PQ MaxSim on tensor cores with per-warp document streams (scoring="mma",
kernels/maxsim_pq_mma.cu).

The kernel is CUDA C++ and runs on a GPU only. On the CPU the two layouts it builds (the
codebook's shared-memory lines and the query's fragments: ops/pq_mma.mma_codebook_lines and
mma_query_fragments) are replayed with the kernel's indexing and the scores checked against the
float64 reference; the source is compiled for sm_90 by NVRTC. On a GPU the kernel itself is
checked against the reference.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ON_GPU, compile_cubin_sm90
from tests.kernels.test_maxsim_pq import random_pq_index, split, unit_queries
from tests.kernels.test_maxsim_residual import DOC_LENGTHS, poisoned_outputs  # noqa: F401
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import mma_fragments, nvrtc, pq_mma
from tilemaxsim_plaid.ops.pq import PQConfig, maxsim_pq

on_gpu = pytest.mark.skipif(not ON_GPU, reason="the CUDA kernel needs a GPU; the CPU replays its "
                                                "layouts in the tests above")


def test_column_order_is_a_permutation():
    order = pq_mma.mma_column_order()
    assert sorted(order.tolist()) == list(range(pq_mma.DIM))


def replay_kernel(Q3, pq_codes, offsets, codebooks, query_lengths=None):
    """The kernel's arithmetic in float64 on the CPU, reading only what it reads: line
    (h, code) slot 2q + (token & 1) of mma_codebook_lines for lane (token, q), and the A
    fragments of mma_query_fragments, unpacked by the m16n8k16 register layout."""
    lines = pq_mma.mma_codebook_lines(codebooks.to(Q3.dtype))
    B = Q3.shape[0]
    # Query [B, 32, 128] in product-column order, from the fragments.
    query = mma_fragments.query_from_fragments(pq_mma.mma_query_fragments(Q3, query_lengths),
                                               Q3.dtype)
    # Tokens [T, 128] in product-column order: product k-block 2h + s, column c comes from lane
    # quad q = (c % 8) // 2, register (w.x, w.y) for s = 0 or (w.z, w.w) for s = 1, pair c // 8.
    T = pq_codes.shape[0]
    tokens = torch.zeros(T, pq_mma.DIM, dtype=torch.float64)
    # Lane (token g, quad q) of a half reads copy g & 1; g has the parity of the token's
    # position in its document (tiles start at the document's first token).
    lengths = offsets.diff()
    starts = torch.repeat_interleave(offsets[:-1], lengths)
    parity = (torch.arange(T) - starts) % 2
    for h in range(4):
        for q in range(4):
            code = pq_codes[:, 4 * h + q].long()
            entry = lines[(h * 256 + code) * 8 + 2 * q + parity].double()  # [T, 8]
            for s in range(2):
                for hi in range(2):
                    for bit in range(2):
                        column = (2 * h + s) * 16 + 2 * q + 8 * hi + bit
                        tokens[:, column] = entry[:, 4 * s + 2 * hi + bit]
    scores = torch.einsum("bid,td->bit", query, tokens)
    # Rows past a query's length add 0, also to an empty document's -inf.
    rows_in_query = torch.arange(pq_mma.MAX_QUERY_TOKENS)[None] < (
        query_lengths[:, None] if query_lengths is not None else Q3.shape[1])
    out = torch.empty(B, offsets.numel() - 1, dtype=torch.float64)
    for n in range(offsets.numel() - 1):
        start, end = int(offsets[n]), int(offsets[n + 1])
        best = scores[:, :, start:end].amax(-1) if end > start else torch.full(
            (B, pq_mma.MAX_QUERY_TOKENS), float("-inf"), dtype=torch.float64)
        out[:, n] = torch.where(rows_in_query, best, 0.0).sum(-1)
    return out


@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.bfloat16, id="bf16")])
@pytest.mark.parametrize("Lq", [32, 7])
def test_replayed_layouts_score_like_the_reference(dtype, Lq):
    index = random_pq_index("cpu", 128, 16)
    (pq_codes, offsets, codebooks), _ = split(index)
    Q = unit_queries(3, Lq, 128, dtype, "cpu")
    query_lengths = torch.tensor([Lq, 1, 0])
    got = replay_kernel(Q, pq_codes, offsets, codebooks, query_lengths)
    want = reference.maxsim_pq(Q, pq_codes, offsets, codebooks.to(dtype),
                               query_lengths=query_lengths)
    assert torch.isneginf(got[:2, 0]).all() and got[2, 0] == 0  # DOC_LENGTHS[0] == 0
    torch.testing.assert_close(got, want.double(), rtol=1e-9, atol=1e-9)


def test_both_codebook_copies_hold_every_entry():
    codebooks = torch.randn(16, 256, 8).half()
    lines = pq_mma.mma_codebook_lines(codebooks).reshape(4, 256, 8, 8)  # [h, code, slot, 8]
    for h in range(4):
        for q in range(4):
            for copy in range(2):
                assert torch.equal(lines[h, :, 2 * q + copy], codebooks[4 * h + q])
    assert lines.numel() * 2 == pq_mma.BOOK_BYTES


def test_kernel_source_compiles_for_sm90():
    """NVRTC (PyTorch's CUDA builds, or the nvidia-cuda-nvrtc wheel) compiles the source for
    the H200 without a GPU, for both element types and codebook dtypes."""
    for element in pq_mma.ELEMENT_NAMES.values():
        for book_fp32 in (0, 1):
            cubin = compile_cubin_sm90(pq_mma.SOURCE, {"WARPS": pq_mma.WARPS, "ELEM": element,
                                                       "BOOK_F32": book_fp32})
            assert cubin[:4] == b"\x7fELF"


@on_gpu
def test_kernel_fits_128_registers_without_spills(device):
    """16 warps of one block per SM allow 128 registers per thread; a spill would put the
    held query fragments in local memory."""
    kernel = pq_mma.kernel(device, torch.float16)
    assert kernel.num_regs <= 128
    assert kernel.local_bytes == 0


def test_compile_errors_carry_nvrtc_log():
    with pytest.raises(nvrtc.NvrtcError, match="undeclared_name"):
        nvrtc.compile_cubin('extern "C" __global__ void k() { undeclared_name = 1; }', "bad.cu",
                            "sm_90")


@on_gpu
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.bfloat16, id="bf16")])
@pytest.mark.parametrize("grab", [1, 3, 4])
@pytest.mark.parametrize("book_dtype", ["fp32", "query"])
def test_kernel_matches_reference(device, poisoned_outputs, dtype, grab, book_dtype):
    # Lengths around the 8- and 16-token halves and tiles, an empty first document.
    lengths = list(DOC_LENGTHS) + [1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 33, 130]
    index = random_pq_index(device, 128, 16, lengths=lengths)
    if book_dtype == "query":  # staged as given; fp32 ones are rounded by the kernel
        index["codebooks"] = index["codebooks"].to(dtype)
    args, _ = split(index)
    Q = unit_queries(3, 32, 128, dtype, device)
    query_lengths = torch.tensor([32, 5, 0], device=device)
    config = PQConfig(scoring="mma", docs_per_program=grab)
    out = maxsim_pq(Q, *args, query_lengths=query_lengths, config=config)
    assert_close(out, reference.maxsim_pq(Q, *args, query_lengths=query_lengths), "maxsim_pq",
                 dtype)
    assert torch.isneginf(out[:2, 0]).all() and (out[2] == 0).all()


@on_gpu
def test_kernel_pids_long_query_and_many_documents(device, poisoned_outputs):
    lengths = torch.randint(0, 140, (5000,)).tolist()
    index = random_pq_index(device, 128, 16, lengths=lengths)
    args, _ = split(index)
    pids = torch.randperm(5000, device=device)[:777]
    # Two launches of <= 32 query tokens, from a query with strided rows.
    Q = unit_queries(2, 90, 128, torch.float16, device)[:, ::2]
    out = maxsim_pq(Q, *args, pids=pids, config=PQConfig(scoring="mma"))
    want = reference.maxsim_pq(Q, *args)[:, pids.cpu()]
    assert_close(out, want, "maxsim_pq", torch.float16)
    out2d = maxsim_pq(Q[0, :9], *args, config=PQConfig(scoring="mma"))
    assert_close(out2d, reference.maxsim_pq(Q[0, :9], *args), "maxsim_pq", torch.float16)
