"""kernels/value_range.py, the GPU range check of index tensors, against torch.aminmax and
torch.clamp."""

import pytest
import torch
import triton

from tilemaxsim_plaid.kernels.value_range import INT64_MAX, _value_range_kernel

BLOCK = 64  # several programs on small inputs


def value_range(t: torch.Tensor) -> list[int]:
    out = torch.tensor([INT64_MAX, -INT64_MAX - 1], device=t.device)
    _value_range_kernel[(triton.cdiv(t.numel(), BLOCK),)](t, out, t, t.numel(), 0, 0, BLOCK=BLOCK,
                                                          CLAMP=False)
    return out.tolist()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 300])
def test_min_and_max_over_every_block(device, dtype, n):
    g = torch.Generator().manual_seed(n)
    info = torch.iinfo(dtype)
    t = torch.randint(-1000, 1000, (n,), generator=g).to(dtype)
    t[torch.randint(0, n, (1,), generator=g)] = info.max  # the extremes of the dtype survive
    t[torch.randint(0, n, (1,), generator=g)] = info.min
    lo, hi = torch.aminmax(t)
    assert value_range(t.to(device)) == [int(lo), int(hi)]


def test_the_checks_read_a_strided_view_by_its_strides(device):
    from tilemaxsim_plaid.ops import checks

    t = torch.arange(40, dtype=torch.int64, device=device).reshape(8, 5)[:, 1]  # 1, 6, ..., 36
    assert checks._kernel_range_stats(t).tolist() == [1, 36]
    assert checks._kernel_range_stats(t.to(torch.int32)).tolist() == [1, 36]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 65, 300])
def test_the_clamped_copy_is_torch_clamp(device, dtype, n):
    g = torch.Generator().manual_seed(n)
    t = torch.randint(-50, 150, (n,), generator=g).to(dtype).to(device)
    out = torch.tensor([INT64_MAX, -INT64_MAX - 1], device=device)
    clamped = torch.full_like(t, -7)
    _value_range_kernel[(triton.cdiv(n, BLOCK),)](t, out, clamped, n, 0, 99, BLOCK=BLOCK, CLAMP=True)
    assert torch.equal(clamped, t.clamp(0, 99))
    lo, hi = torch.aminmax(t)
    assert out.tolist() == [int(lo), int(hi)]  # the stats are of t, not of its clamped copy


def test_the_checks_clamp_a_deferred_tensor_in_the_same_pass(device):
    from tilemaxsim_plaid.ops import checks

    t = torch.tensor([3, -2, 9, 4], dtype=torch.int32, device=device)
    stats, clamped = checks._kernel_range_stats(t, clamp=(0, 5))
    assert stats.tolist() == [-2, 9]
    assert clamped.dtype == torch.int32 and clamped.tolist() == [3, 0, 5, 4]


def torch_offsets_stats(off: torch.Tensor) -> list[int]:
    steps = off[1:] - off[:-1]
    return [int(off[0]), int(off[-1]), int((steps < 0).sum()), int(steps.max())]


@pytest.mark.parametrize("n", [2, 3, 64, 65, 300])
def test_offsets_stats_and_clamp_over_every_block(device, n):
    from tilemaxsim_plaid.kernels.value_range import _offsets_stats_kernel

    g = torch.Generator().manual_seed(n)
    off = torch.randint(0, 40, (n,), generator=g).cumsum(0)
    off[torch.randint(0, n, (n // 7,), generator=g)] -= 30  # some decreasing steps
    off = off.to(device)
    out = torch.tensor([0, 0, 0, -INT64_MAX - 1], device=device)
    clamped = torch.full_like(off, -7)
    _offsets_stats_kernel[(triton.cdiv(n, BLOCK),)](off, out, clamped, n, 100, BLOCK=BLOCK,
                                                    CLAMP=True)
    assert out.tolist() == torch_offsets_stats(off.cpu())
    assert torch.equal(clamped, off.clamp(0, 100))


def test_the_checks_offsets_stats_by_kernel(device):
    from tilemaxsim_plaid.ops import checks

    off = torch.tensor([0, 4, 4, 2, 9, 15], device=device)
    stats, clamped = checks._kernel_offsets_stats(off, clamp_hi=10)
    assert stats.tolist() == [0, 15, 1, 7] == checks._offsets_stats(off).tolist()
    assert clamped.tolist() == [0, 4, 4, 2, 9, 10]
    strided = torch.stack([off, off], 1)[:, 0]
    assert checks._offsets_stats(strided).tolist() == [0, 15, 1, 7]
