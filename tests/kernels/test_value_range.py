"""kernels/value_range.py, the GPU range check of index tensors, against torch.aminmax and
torch.clamp: each program's partial result, merged as ops/checks.py merges them."""

import pytest
import torch
import triton

from tilemaxsim_plaid.kernels.value_range import _offsets_stats_kernel, _value_range_kernel
from tilemaxsim_plaid.ops import checks

BLOCK = 64  # several blocks on small inputs


def value_range(t: torch.Tensor, programs: int, clamp=None) -> tuple[list[int], torch.Tensor]:
    """(merged [min, max], clamped copy) from ``programs`` programs."""
    out = torch.full((2 * programs,), -7, dtype=torch.int64, device=t.device)  # no start needed
    clamped = torch.full_like(t, -7)
    lo, hi = clamp or (0, 0)
    _value_range_kernel[(programs,)](t, out, clamped, t.numel(), lo, hi, BLOCK=BLOCK,
                                     CLAMP=clamp is not None)
    return checks._merge("range", out.tolist()), clamped


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,programs", [(1, 1), (63, 1), (64, 1), (65, 2), (300, 5), (300, 2)])
def test_min_and_max_over_every_block(device, dtype, n, programs):
    g = torch.Generator().manual_seed(n)
    info = torch.iinfo(dtype)
    t = torch.randint(-1000, 1000, (n,), generator=g).to(dtype)
    t[torch.randint(0, n, (1,), generator=g)] = info.max  # the extremes of the dtype survive
    t[torch.randint(0, n, (1,), generator=g)] = info.min
    lo, hi = torch.aminmax(t)
    assert value_range(t.to(device), programs)[0] == [int(lo), int(hi)]


def test_the_checks_read_a_strided_view_by_its_strides(device):
    t = torch.arange(40, dtype=torch.int64, device=device).reshape(8, 5)[:, 1]  # 1, 6, ..., 36
    for view in (t, t.to(torch.int32)):
        assert checks._merge("range", checks._kernel_range_stats(view).tolist()) == [1, 36]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,programs", [(1, 1), (65, 2), (300, 2), (300, 5)])
def test_the_clamped_copy_is_torch_clamp(device, dtype, n, programs):
    g = torch.Generator().manual_seed(n)
    t = torch.randint(-50, 150, (n,), generator=g).to(dtype).to(device)
    stats, clamped = value_range(t, programs, clamp=(0, 99))
    assert torch.equal(clamped, t.clamp(0, 99))
    lo, hi = torch.aminmax(t)
    assert stats == [int(lo), int(hi)]  # the stats are of t, not of its clamped copy


def test_the_checks_clamp_a_deferred_tensor_in_the_same_pass(device):
    t = torch.tensor([3, -2, 9, 4], dtype=torch.int32, device=device)
    stats, clamped = checks._kernel_range_stats(t, clamp=(0, 5))
    assert checks._merge("range", stats.tolist()) == [-2, 9]
    assert clamped.dtype == torch.int32 and clamped.tolist() == [3, 0, 5, 4]


def test_partials_are_written_where_taken(device):
    """The partials land in the slice ``take`` hands out (on the GPU a pinned host buffer, which
    a kernel writes as mapped memory; Triton refuses pageable host memory)."""
    buffer = torch.full((8,), -7, dtype=torch.int64, pin_memory=device.type == "cuda")
    t = torch.tensor([5, 2, 8], device=device)
    stats = checks._range_stats(t, take=lambda size: buffer[3:3 + size])
    assert stats.data_ptr() == buffer[3:].data_ptr()
    assert checks._merge("range", buffer[3:5].tolist()) == [2, 8]
    assert buffer[:3].tolist() == [-7] * 3 and buffer[5:].tolist() == [-7] * 3


def torch_offsets_stats(off: torch.Tensor) -> list[int]:
    steps = off[1:] - off[:-1]
    return [int(off[0]), int(off[-1]), int((steps < 0).sum()), int(steps.max())]


@pytest.mark.parametrize("n,programs", [(2, 1), (3, 1), (64, 1), (65, 2), (300, 5), (300, 2)])
def test_offsets_stats_and_clamp_over_every_block(device, n, programs):
    g = torch.Generator().manual_seed(n)
    off = torch.randint(0, 40, (n,), generator=g).cumsum(0)
    off[torch.randint(0, n, (n // 7,), generator=g)] -= 30  # some decreasing steps
    off = off.to(device)
    out = torch.full((2 + 2 * programs,), -7, dtype=torch.int64, device=device)
    clamped = torch.full_like(off, -7)
    _offsets_stats_kernel[(programs,)](off, out, clamped, n, 100, BLOCK=BLOCK, CLAMP=True)
    assert checks._merge("offsets", out.tolist()) == torch_offsets_stats(off.cpu())
    assert torch.equal(clamped, off.clamp(0, 100))


def test_the_checks_offsets_stats_by_kernel(device):
    off = torch.tensor([0, 4, 4, 2, 9, 15], device=device)
    stats, clamped = checks._kernel_offsets_stats(off, clamp_hi=10)
    assert (checks._merge("offsets", stats.tolist()) == [0, 15, 1, 7]
            == checks._merge("offsets", checks._offsets_stats(off).tolist()))
    assert clamped.tolist() == [0, 4, 4, 2, 9, 10]
    strided = torch.stack([off, off], 1)[:, 0]
    assert checks._merge("offsets", checks._offsets_stats(strided).tolist()) == [0, 15, 1, 7]


def test_programs_walk_every_block():
    """Past RANGE_PROGRAMS blocks a program reads several; never more programs than blocks."""
    assert checks._programs(1) == 1
    assert checks._programs(checks.RANGE_BLOCK + 1) == 2
    assert checks._programs(10**9) == checks.RANGE_PROGRAMS
