"""Residual-code MaxSim on tensor cores with per-warp document streams (scoring="mma",
kernels/maxsim_residual_mma.cu).

The kernel is CUDA C++ and runs on a GPU only. On the CPU its layouts (the byte table, the
query's fragments, the permuted centroid-score table: ops/residual_mma) are replayed with the
kernel's indexing and the scores checked against the float64 reference; the source is compiled
for sm_90 by NVRTC. On a GPU the kernel itself is checked against the reference, against the
Triton kernel, and for NaN, clamped codes, strided and int64 inputs.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ON_GPU, compile_cubin_sm90, replayed_from_cuda_graph
from tests.kernels.test_maxsim_residual import (  # noqa: F401
    DOC_LENGTHS,
    expected,
    norms_of,
    poisoned_outputs,
    random_index,
    score,
    unit_queries,
)
from tests.tolerances import assert_close
from tilemaxsim_plaid.ops import mma_fragments, residual_mma
from tilemaxsim_plaid.ops.residual import ResidualConfig

on_gpu = pytest.mark.skipif(not ON_GPU, reason="the CUDA kernel needs a GPU; the CPU replays its "
                                                "layouts in the tests above")
MMA = ResidualConfig(scoring="mma")
NBITS = [pytest.param(2, id="nbits2"), pytest.param(4, id="nbits4")]
DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]


def test_orders_are_permutations():
    assert sorted(residual_mma.mma_column_order().tolist()) == list(range(128))
    assert sorted(residual_mma.table_column_of_row().tolist()) == list(range(32))
    # Lane g's rows g + 8j sit at columns 4g + j.
    columns = residual_mma.table_column_of_row()
    for g in range(8):
        assert [int(columns[g + 8 * j]) for j in range(4)] == [4 * g + j for j in range(4)]


def decoded_tokens(residuals, bucket_weights, nbits, dtype):
    """[T, 128] float64 in product-column order, as the lanes decode them: lane quad q takes
    bytes q * LANE .. of a token's row, byte i of it giving registers 2i, 2i + 1 (nbits 2) or
    register i (nbits 4) from the byte table, register j = 2 kb + r holding product columns
    (kb, 2q + 8r + (0, 1))."""
    table = residual_mma.byte_table(bucket_weights, nbits, dtype)  # [256, words]
    T = residuals.shape[0]
    lane_bytes = residuals.shape[1] // 4
    tokens = torch.zeros(T, 128, dtype=torch.float64)
    for q in range(4):
        registers = table[residuals[:, q * lane_bytes:(q + 1) * lane_bytes].long()]
        registers = registers.reshape(T, 16)  # register j of the lane, in byte order
        pairs = registers.contiguous().view(dtype).reshape(T, 16, 2).double()
        for j in range(16):
            kb, r = divmod(j, 2)
            for e in range(2):
                tokens[:, kb * 16 + 2 * q + 8 * r + e] = pairs[:, j, e]
    return tokens


def replay_kernel(Q3, index, nbits, inv_norms, query_lengths=None):
    """The kernel's arithmetic in float64 on the CPU, from what it reads: the A fragments of
    mma_query_fragments, the lanes' decoded registers, and entries of the permuted table."""
    dtype = Q3.dtype
    B = Q3.shape[0]
    query = mma_fragments.query_from_fragments(residual_mma.mma_query_fragments(Q3, query_lengths),
                                               dtype)
    tokens = decoded_tokens(index["residuals"], index["bucket_weights"], nbits, dtype)
    # The permuted table of the fp32 products <q, c> (the kernel's is fp16 or fp32; a caller's
    # given in query-row order is permuted the same way); row R of query b reads column
    # table_column_of_row[R] of its 32.
    C = index["centroids"].shape[0]
    rows_first = torch.einsum("cd,bid->cbi", index["centroids"].float(), Q3.float())
    table = residual_mma.permuted_table(Q3, None, torch.float32, given=rows_first)
    table = table.view(C, B, 32).double()
    centroid_part = table[index["codes"].long()][:, :, residual_mma.table_column_of_row()]
    scores = (torch.einsum("bid,td->bit", query, tokens) + centroid_part.permute(1, 2, 0)) \
        * inv_norms.double()
    rows_in_query = torch.arange(32)[None] < (
        query_lengths[:, None] if query_lengths is not None else Q3.shape[1])
    offsets = index["offsets"]
    out = torch.empty(B, offsets.numel() - 1, dtype=torch.float64)
    for n in range(offsets.numel() - 1):
        start, end = int(offsets[n]), int(offsets[n + 1])
        best = scores[:, :, start:end].amax(-1) if end > start else torch.full(
            (B, 32), float("-inf"), dtype=torch.float64)
        out[:, n] = torch.where(rows_in_query, best, 0.0).sum(-1)
    return out


@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Lq", [32, 7])
def test_replayed_layouts_score_like_the_reference(nbits, dtype, Lq):
    index = random_index("cpu", 128, nbits)
    inv_norms = norms_of(index, nbits)
    Q = unit_queries(3, Lq, 128, dtype, "cpu")
    query_lengths = torch.tensor([Lq, 1, 0])
    got = replay_kernel(Q, index, nbits, inv_norms, query_lengths)
    want = expected(Q, index, nbits, query_lengths=query_lengths)
    assert torch.isneginf(got[:2, 0]).all() and got[2, 0] == 0  # DOC_LENGTHS[0] == 0
    # The table is fp32 here; the weights are rounded to the query dtype as the kernel's are.
    assert_close(got, want, "maxsim_residual", dtype)


def test_byte_table_holds_the_codec_weights():
    weights = torch.tensor([-0.03, -0.01, 0.01, 0.04])
    table = residual_mma.byte_table(weights, 2, torch.float16)
    assert table.shape == (256, 2) and table.dtype == torch.int32
    # 0b00_01_10_11: fields 0, 1, 2, 3 reversed within each 2-bit field -> buckets 0, 2, 1, 3.
    entry = table[0b00011011].contiguous().view(torch.float16).float()
    torch.testing.assert_close(entry, weights[[0, 2, 1, 3]].half().float())
    table4 = residual_mma.byte_table(torch.arange(16.0) / 100, 4, torch.bfloat16)
    assert table4.shape == (256, 1)
    # 0x1e: fields 1 and 14, bits reversed -> buckets 8 and 7.
    entry4 = table4[0x1E].contiguous().view(torch.bfloat16).float()
    torch.testing.assert_close(entry4, (torch.tensor([8.0, 7.0]) / 100).bfloat16().float())


def test_kernel_source_compiles_for_sm90():
    """NVRTC compiles every variant for the H200 without a GPU."""
    for dtype in residual_mma.ELEMENT_NAMES:
        for nbits in residual_mma.NBITS:
            for table_f32 in (False, True):
                for codes_i64, hints in ((False, False), (True, False), (False, True), (True, True)):
                    cubin = compile_cubin_sm90(
                        residual_mma.SOURCE,
                        residual_mma.defines(dtype, nbits, table_f32, codes_i64, True, hints))
                    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("nbits", NBITS)
def test_default_launches_fit_their_registers_on_sm90(nbits):
    """16 warps of one block per SM leave 128 registers a thread: the fp16 launches the op
    makes (the L2 prefetch, or the L2 policies) compile for sm_90 without a stack, so nothing
    spills (ptxas on the GPU is checked again by the test below)."""
    from experiments.sass_budget import _resource_usage

    for hints in (False, True):
        cubin = compile_cubin_sm90(
            residual_mma.SOURCE,
            residual_mma.defines(torch.float16, nbits, False, False, not hints, hints))
        usage = _resource_usage(cubin)
        assert usage["REG"] * 32 * residual_mma.WARPS <= 65536 and usage["STACK"] == 0, usage


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [32, 7, 1])
def test_permuted_table_reads_the_rows_in_the_kernel_order(device, dtype, rows):
    """One launch reading query rows in table_column_of_row's order equals the table of a copy of
    the query padded and permuted into that order (the same products, bit for bit), from a
    strided view; columns past the chunk are zero."""
    from tilemaxsim_plaid.ops.residual import query_centroid_scores

    g = torch.Generator().manual_seed(7)
    centroids = torch.randn(300, 128, generator=g).half().to(device)
    wide = torch.randn(3, 2 * rows, 128, generator=g).half().to(device)
    Q = wide[:, ::2]  # strided rows
    padded = Q.new_zeros(3, 32, 128)
    padded[:, residual_mma.table_column_of_row(rows).to(device)] = Q
    table = residual_mma.permuted_table(Q, centroids, dtype)
    assert table.shape == (300, 96) and table.dtype == dtype
    assert torch.equal(table, query_centroid_scores(padded, centroids, dtype))
    filled = table.view(300, 3, 32)[:, :, residual_mma.table_column_of_row(rows).to(device)]
    want = torch.einsum("cd,brd->cbr", centroids.double(), Q.double())
    torch.testing.assert_close(filled.double(), want, rtol=2e-3, atol=2e-3)
    assert int((table.view(300, 3, 32) != 0).sum()) == int((filled != 0).sum())
    # A NaN in one query row reaches that row's column only (the NaN policy).
    wide[1, 0, 5] = float("nan")
    nan_table = residual_mma.permuted_table(Q, centroids, dtype).view(300, 3, 32)
    nan_column = residual_mma.table_column_of_row(rows)[0]
    assert nan_table[:, 1, nan_column].isnan().all()
    nan_table[:, 1, nan_column] = table.view(300, 3, 32)[:, 1, nan_column]
    assert torch.equal(nan_table, table.view(300, 3, 32))
    with pytest.raises(ValueError, match="at most 32 query rows"):
        query_centroid_scores(torch.zeros(1, 33, 128, dtype=torch.float16, device=device),
                              centroids, dtype, permuted=True)


def test_l2_hints_from_a_table_size_on_unless_overridden(monkeypatch):
    threshold = residual_mma.L2_HINTS_MIN_TABLE_BYTES
    assert not residual_mma.l2_hints(threshold - 1) and residual_mma.l2_hints(threshold)
    assert not residual_mma.l2_hints((1 << 16) * 32 * 2)  # C = 2^16, one fp16 query
    assert residual_mma.l2_hints((1 << 18) * 32 * 2)  # C = 2^18
    monkeypatch.setattr(residual_mma, "L2_HINTS", False)
    assert not residual_mma.l2_hints(threshold)
    monkeypatch.setattr(residual_mma, "L2_HINTS", True)
    assert residual_mma.l2_hints(0)


def test_reasons_name_what_does_not_apply(device):
    index = random_index(device, 96, 1)
    Q = unit_queries(1, 32, 96, torch.float32, device)
    reasons = residual_mma.reasons_not_to_apply(Q, index["codes"], index["residuals"], 1, None,
                                                index["centroids"])
    text = "; ".join(reasons)
    for words in ("Q dtype", "d = 96", "nbits = 1", "no inv_norms"):
        assert words in text
    assert ("device cpu" in text) == (device.type == "cpu")
    with pytest.raises(ValueError, match="scoring='mma' does not cover"):
        score(Q, index, 1, config=MMA)


def test_scoring_is_a_checked_config_field(device):
    with pytest.raises(ValueError, match="scoring"):
        score(unit_queries(1, 4, 128, torch.float16, device), random_index(device, 128, 2), 2,
              config=ResidualConfig(scoring="wgmma"))


@on_gpu
@pytest.mark.parametrize("nbits,table_f32", [(2, False), (2, True), (4, False)])
def test_kernel_fits_its_registers_without_spills(device, nbits, table_f32):
    """WARPS warps of one block per SM; a spill would put the held query fragments in local
    memory (fp16 queries and tables: the default; an fp32 table at nbits 2)."""
    kernel = residual_mma.kernel(device, torch.float16, nbits, table_f32, False)
    assert kernel.num_regs * 32 * residual_mma.WARPS <= 65536
    assert kernel.local_bytes == 0


@on_gpu
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grab", [1, 3, 4])
@pytest.mark.parametrize("half_table", [None, False])
@pytest.mark.parametrize("prefetch", [True, False])
def test_kernel_matches_reference(device, poisoned_outputs, nbits, dtype, grab, half_table,
                                  prefetch):
    # Lengths around the 8- and 16-token halves and tiles, an empty first document.
    lengths = list(DOC_LENGTHS) + [1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 33, 130, 0]
    index = random_index(device, 128, nbits, lengths=lengths)
    inv_norms = norms_of(index, nbits)
    Q = unit_queries(3, 32, 128, dtype, device)
    query_lengths = torch.tensor([32, 5, 0], device=device)
    config = ResidualConfig(scoring="mma", docs_per_program=grab, half_table=half_table,
                            prefetch=prefetch)
    out = score(Q, index, nbits, inv_norms=inv_norms, query_lengths=query_lengths, config=config)
    assert_close(out, expected(Q, index, nbits, query_lengths=query_lengths), "maxsim_residual",
                 dtype)
    assert torch.isneginf(out[:2, 0]).all() and (out[2] == 0).all()
    assert torch.isneginf(out[:2, -1]).all()


@on_gpu
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("table_f32", [False, True])
def test_l2_hints_score_as_without_them(device, monkeypatch, nbits, table_f32):
    """The L2 cache policies change where lines stay, not what is read: bit for bit, and the
    kernel still fits its registers."""
    lengths = torch.randint(0, 140, (3000,), generator=torch.Generator().manual_seed(5)).tolist()
    index = random_index(device, 128, nbits, lengths=lengths, num_centroids=500)
    inv_norms = norms_of(index, nbits)
    Q = unit_queries(2, 32, 128, torch.float16, device)
    config = ResidualConfig(scoring="mma", half_table=not table_f32)
    monkeypatch.setattr(residual_mma, "L2_HINTS", False)
    plain = score(Q, index, nbits, inv_norms=inv_norms, config=config)
    monkeypatch.setattr(residual_mma, "L2_HINTS", True)
    hinted = score(Q, index, nbits, inv_norms=inv_norms, config=config)
    assert torch.equal(hinted, plain)
    assert_close(hinted, expected(Q, index, nbits), "maxsim_residual", torch.float16)
    kernels = [residual_mma.kernel(device, torch.float16, nbits, table_f32, False, True, hints)
               for hints in (False, True)]
    assert kernels[1].num_regs <= 128 and kernels[1].local_bytes == kernels[0].local_bytes


@on_gpu
@pytest.mark.parametrize("nbits", NBITS)
def test_kernel_pids_long_query_strides_and_int64(device, poisoned_outputs, nbits):
    lengths = torch.randint(0, 140, (5000,)).tolist()
    index = random_index(device, 128, nbits, lengths=lengths, num_centroids=300)
    inv_norms = norms_of(index, nbits)
    pids = torch.randperm(5000, device=device)[:777]
    # Two launches of <= 32 query tokens, from a query with strided rows; int64 codes.
    Q = unit_queries(2, 90, 128, torch.float16, device)[:, ::2]
    index64 = dict(index, codes=index["codes"].long())
    out = score(Q, index64, nbits, pids=pids, inv_norms=inv_norms, config=MMA)
    want = expected(Q, index, nbits)[:, pids.cpu()]
    assert_close(out, want, "maxsim_residual", torch.float16)
    out2d = score(Q[0, :9], index, nbits, inv_norms=inv_norms, config=MMA)
    assert_close(out2d, expected(Q[0, :9], index, nbits), "maxsim_residual", torch.float16)
    # The same documents by the Triton kernel: the same rounding of every weight and entry.
    triton_out = score(Q, index, nbits, pids=pids, inv_norms=inv_norms,
                       config=ResidualConfig(centroid_table=True, half_table=True))
    torch.testing.assert_close(out, triton_out, rtol=1e-4, atol=1e-4)


@on_gpu
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float16])
def test_kernel_takes_a_callers_table(device, poisoned_outputs, nbits, table_dtype):
    from tilemaxsim_plaid.ops.residual import query_centroid_scores

    index = random_index(device, 128, nbits, lengths=DOC_LENGTHS * 20)
    inv_norms = norms_of(index, nbits)
    Q = unit_queries(2, 40, 128, torch.float16, device)
    table = query_centroid_scores(Q, index["centroids"], table_dtype)
    out = score(Q, index, nbits, inv_norms=inv_norms, centroid_scores=table, config=MMA)
    assert_close(out, expected(Q, index, nbits), "maxsim_residual", torch.float16)


@on_gpu
@pytest.mark.parametrize("nbits", NBITS)
def test_kernel_replays_from_a_cuda_graph(device, nbits):
    """A call captured in a CUDA graph (as the plugin and the benchmarks replay calls) copies
    nothing from pageable host memory and replays the eager call's scores, both query chunks."""
    index = random_index(device, 128, nbits, lengths=DOC_LENGTHS * 20)
    inv_norms = norms_of(index, nbits)
    Q = unit_queries(2, 40, 128, torch.float16, device)
    eager = score(Q, index, nbits, inv_norms=inv_norms, config=MMA)
    captured = replayed_from_cuda_graph(
        lambda: score(Q, index, nbits, inv_norms=inv_norms, config=MMA))
    assert torch.equal(captured, eager)


@on_gpu
@pytest.mark.parametrize("nbits", NBITS)
def test_kernel_nan_reaches_exactly_its_scores_and_codes_are_clamped(device, nbits):
    lengths = [3, 20, 0, 9]
    index = random_index(device, 128, nbits, lengths=lengths)
    inv_norms = norms_of(index, nbits)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    clean = score(Q, index, nbits, inv_norms=inv_norms, config=MMA, validate=False)
    # A NaN inverse norm in document 1 (tokens 3..22) reaches only its score.
    poisoned = inv_norms.clone()
    poisoned[10] = float("nan")
    out = score(Q, index, nbits, inv_norms=poisoned, config=MMA, validate=False)
    assert torch.isnan(out[0, 1]) and torch.equal(out[0, [0, 2, 3]], clean[0, [0, 2, 3]])
    # A NaN bucket weight reaches every document holding that bucket: all non-empty ones here.
    weights = index["bucket_weights"].clone()
    weights[1] = float("nan")
    out = score(Q, dict(index, bucket_weights=weights), nbits, inv_norms=inv_norms, config=MMA,
                validate=False)
    assert torch.isnan(out[0, [0, 1, 3]]).all() and torch.isneginf(out[0, 2])
    # Codes out of range are read clamped into [0, C) (validate=True judges them after).
    codes = index["codes"].clone()
    codes[0], codes[1] = -5, 10**6
    clamped = codes.clamp(0, index["centroids"].shape[0] - 1)
    got = score(Q, dict(index, codes=codes), nbits, inv_norms=inv_norms, config=MMA,
                validate=False)
    want = score(Q, dict(index, codes=clamped), nbits, inv_norms=inv_norms, config=MMA,
                 validate=False)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="codes must lie in"):
        score(Q, dict(index, codes=codes), nbits, inv_norms=inv_norms, config=MMA)


def test_launch_start_gives_the_scores_and_a_query_of_aligned_pairs():
    """Both CUDA kernels' host functions start here: fp32 scores [B, N], and Q3 as the kernels
    load it (rows of contiguous 4-byte pairs): kept when it is, copied when a view is not."""
    Q3 = torch.randn(2, 9, 128, dtype=torch.float16)
    out, same = mma_fragments.launch_start(Q3, 5, grab=4)
    assert out.shape == (2, 5) and out.dtype == torch.float32 and same is Q3
    odd = torch.randn(2, 9, 129, dtype=torch.float16)[:, :, 1:]  # rows start at odd elements
    out, copied = mma_fragments.launch_start(odd, 0, grab=1)
    assert out.shape == (2, 0) and copied.is_contiguous() and torch.equal(copied, odd)
    strided = torch.randn(2, 128, 9, dtype=torch.float16).transpose(1, 2)
    assert mma_fragments.launch_start(strided, 3, grab=1)[1].stride(2) == 1
    with pytest.raises(ValueError, match="documents per grab"):
        mma_fragments.launch_start(Q3, 5, grab=0)


@pytest.mark.skipif(ON_GPU, reason="replays the host side with the CUDA launch recorded; the GPU "
                                   "tests above run the launch itself")
@pytest.mark.parametrize("Lq,B", [(32, 1), (9, 2), (40, 2)])
def test_host_side_launches_one_kernel_a_chunk_with_its_own_counters(monkeypatch, Lq, B):
    """The host side of the mma kernel on the CPU, every launch recorded instead of made (the
    Triton table launch a no-op): one launch per chunk of <= 32 query rows, each with the chunk's
    rows in place (no copy of a contiguous query), its row offset, its own zeroed counters of B
    entries, and the index tensors as given."""
    from types import SimpleNamespace

    from tilemaxsim_plaid.ops import nvrtc, residual
    from tilemaxsim_plaid.ops.residual import _query_centroid_scores_kernel

    launches = []

    class Recorder(nvrtc.CudaKernel):
        def __init__(self, *key):
            self.key, self.device, self.name, self.dynamic_shared = key, torch.device("cuda", 0), "r", 0

        def __call__(self, grid, block, args):
            # The counters (argument 17) as they are at the launch, and where they are.
            launches.append((self.key, grid, block, args, args[17].clone(), args[17].data_ptr()))

    monkeypatch.setattr(nvrtc, "available", lambda: True)
    monkeypatch.setattr(nvrtc, "multiprocessors", lambda device: 132)
    monkeypatch.setattr(mma_fragments, "device_reasons", lambda device: [])
    monkeypatch.setattr(residual_mma, "kernel", lambda *key: Recorder(*key))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(type(_query_centroid_scores_kernel), "__getitem__",
                        lambda self, grid: lambda *args, **kwargs: None)
    monkeypatch.setattr(residual, "MANY_DOCS", 4)
    index = random_index("cpu", 128, 2, lengths=[3, 20, 0, 9, 40] * 3)
    Q = unit_queries(B, Lq, 128, torch.float16, "cpu")
    pids = torch.tensor([4, 0, 2, 2])
    out = score(Q, index, 2, pids=pids, inv_norms=norms_of(index, 2))
    assert out.shape == (B, 4)
    chunks = -(-Lq // 32)
    assert len(launches) == chunks
    counters = set()
    for chunk, (key, grid, block, args, counter, counter_at) in enumerate(launches):
        assert key[1:3] == (torch.float16, 2) and grid == (132, B, 1) and block == (512, 1, 1)
        rows = min(32, Lq - 32 * chunk)
        query, start = args[0], args[5].value
        assert start == 32 * chunk and args[3].value == rows and query.shape == (B, rows, 128)
        assert query.data_ptr() == Q.data_ptr() + 32 * chunk * Q.stride(1) * Q.element_size()
        assert args[7] is index["residuals"] and args[8] is index["codes"]
        assert args[13] is index["offsets"] and torch.equal(args[14], pids)
        assert args[10].shape == (index["centroids"].shape[0], B * 32)
        assert args[16].value == out.stride(0) and args[18].value == 4
        assert counter.shape == (B,) and (counter == 0).all()
        counters.add(counter_at)
    assert len(counters) == chunks
