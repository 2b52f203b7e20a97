"""kernels/value_range.py, the GPU range check of index tensors, against torch.aminmax and
torch.clamp: each program's partial result, merged as ops/checks.py merges them, for a check
launched alone and for two checks sharing one launch."""

import pytest
import torch
import triton

from tilemaxsim_plaid.kernels.value_range import OFFSETS, RANGE, _stats_kernel
from tilemaxsim_plaid.ops import checks

BLOCK = 64  # several blocks on small inputs


def value_range(t: torch.Tensor, programs: int, clamp=None,
                wide: bool = False) -> tuple[list[int], torch.Tensor]:
    """(merged [min, max], clamped copy) from ``programs`` programs, indexing in int64 with
    ``wide`` (as for a tensor past 2**31 elements)."""
    out = torch.full((2 * programs,), -7, dtype=torch.int64, device=t.device)  # no start needed
    clamped = torch.full_like(t, -7)
    lo, hi = clamp or (0, 0)
    _stats_kernel[(programs,)](t, out, clamped, t.numel(), lo, hi, programs,
                               t, out, clamped, t.numel(), lo, hi, BLOCK=BLOCK,
                               KIND_A=RANGE, CLAMP_A=clamp is not None, KIND_B=0, CLAMP_B=False,
                               WIDE=wide)
    return checks._merge("range", out.tolist()), clamped


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
@pytest.mark.parametrize("n,programs", [(1, 1), (63, 1), (64, 1), (65, 2), (300, 5), (300, 2)])
def test_min_and_max_over_every_block(device, dtype, n, programs, wide):
    g = torch.Generator().manual_seed(n)
    info = torch.iinfo(dtype)
    t = torch.randint(-1000, 1000, (n,), generator=g).to(dtype)
    t[torch.randint(0, n, (1,), generator=g)] = info.max  # the extremes of the dtype survive
    t[torch.randint(0, n, (1,), generator=g)] = info.min
    lo, hi = torch.aminmax(t)
    assert value_range(t.to(device), programs, wide=wide)[0] == [int(lo), int(hi)]


def test_the_checks_read_a_strided_view_by_its_strides(device):
    t = torch.arange(40, dtype=torch.int64, device=device).reshape(8, 5)[:, 1]  # 1, 6, ..., 36
    for view in (t, t.to(torch.int32)):
        assert checks._merge("range", checks._kernel_stats("range", view, None)[0].tolist()) == [1, 36]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n,programs", [(1, 1), (65, 2), (300, 2), (300, 5)])
def test_the_clamped_copy_is_torch_clamp(device, dtype, n, programs, wide):
    g = torch.Generator().manual_seed(n)
    t = torch.randint(-50, 150, (n,), generator=g).to(dtype).to(device)
    stats, clamped = value_range(t, programs, clamp=(0, 99), wide=wide)
    assert torch.equal(clamped, t.clamp(0, 99))
    lo, hi = torch.aminmax(t)
    assert stats == [int(lo), int(hi)]  # the stats are of t, not of its clamped copy


def test_the_checks_clamp_a_deferred_tensor_in_the_same_pass(device):
    t = torch.tensor([3, -2, 9, 4], dtype=torch.int32, device=device)
    stats, clamped = checks._kernel_stats("range", t, (0, 5))
    assert checks._merge("range", stats.tolist()) == [-2, 9]
    assert clamped.dtype == torch.int32 and clamped.tolist() == [3, 0, 5, 4]


def test_partials_are_written_where_taken(device):
    """The partials land in the slice ``take`` hands out (on the GPU a pinned host buffer, which
    a kernel writes as mapped memory; Triton refuses pageable host memory)."""
    buffer = torch.full((8,), -7, dtype=torch.int64, pin_memory=device.type == "cuda")
    t = torch.tensor([5, 2, 8], device=device)
    stats = checks._range_stats(t, take=lambda size: buffer[3:3 + size])
    assert stats.data_ptr() == buffer[3:].data_ptr()
    if device.type == "cuda":
        torch.cuda.synchronize()  # the kernel writes the mapped buffer asynchronously
    assert checks._merge("range", buffer[3:5].tolist()) == [2, 8]
    assert buffer[:3].tolist() == [-7] * 3 and buffer[5:].tolist() == [-7] * 3


def torch_offsets_stats(off: torch.Tensor) -> list[int]:
    steps = off[1:] - off[:-1]
    return [int(off[0]), int(off[-1]), int((steps < 0).sum()), int(steps.max())]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("n,programs", [(2, 1), (3, 1), (64, 1), (65, 2), (300, 5), (300, 2)])
def test_offsets_stats_and_clamp_over_every_block(device, n, programs, wide):
    g = torch.Generator().manual_seed(n)
    off = torch.randint(0, 40, (n,), generator=g).cumsum(0)
    off[torch.randint(0, n, (n // 7,), generator=g)] -= 30  # some decreasing steps
    off = off.to(device)
    out = torch.full((2 + 2 * programs,), -7, dtype=torch.int64, device=device)
    clamped = torch.full_like(off, -7)
    _stats_kernel[(programs,)](off, out, clamped, n, 0, 100, programs,
                               off, out, clamped, n, 0, 100, BLOCK=BLOCK,
                               KIND_A=OFFSETS, CLAMP_A=True, KIND_B=0, CLAMP_B=False,
                               WIDE=wide)
    assert checks._merge("offsets", out.tolist()) == torch_offsets_stats(off.cpu())
    assert torch.equal(clamped, off.clamp(0, 100))


def test_the_checks_offsets_stats_by_kernel(device):
    off = torch.tensor([0, 4, 4, 2, 9, 15], device=device)
    stats, clamped = checks._kernel_stats("offsets", off, 10)
    assert (checks._merge("offsets", stats.tolist()) == [0, 15, 1, 7]
            == checks._merge("offsets", checks._offsets_stats(off).tolist()))
    assert clamped.tolist() == [0, 4, 4, 2, 9, 10]
    strided = torch.stack([off, off], 1)[:, 0]
    assert checks._merge("offsets", checks._offsets_stats(strided).tolist()) == [0, 15, 1, 7]


def test_indices_are_int64_only_where_a_block_start_can_pass_int32():
    limit = 2**31 - checks.RANGE_BLOCK * checks.RANGE_PROGRAMS
    assert not checks._wide(7_000_000) and not checks._wide(limit - 1)
    assert checks._wide(limit) and checks._wide(2**31)


def test_programs_walk_every_block():
    """Past RANGE_PROGRAMS blocks a program reads several; never more programs than blocks."""
    assert checks._programs(1) == 1
    assert checks._programs(checks.RANGE_BLOCK + 1) == 2
    assert checks._programs(10**9) == checks.RANGE_PROGRAMS


@pytest.mark.parametrize("programs_a,programs_b", [(1, 1), (2, 5), (5, 2)])
@pytest.mark.parametrize("clamp_b", [False, True])
def test_two_checks_in_one_launch(device, programs_a, programs_b, clamp_b):
    """Slot A (offsets, clamped) over the first programs, slot B (a range) over the rest: each
    as it would be alone, neither writing past its own partials or copy."""
    g = torch.Generator().manual_seed(programs_a * 10 + programs_b)
    off = torch.randint(0, 40, (300,), generator=g).cumsum(0)
    off[::9] -= 50
    codes = torch.randint(-20, 500, (257,), generator=g).to(torch.int32)
    off, codes = off.to(device), codes.to(device)
    out = torch.full((2 + 2 * programs_a + 2 * programs_b + 1,), -7, dtype=torch.int64,
                     device=device)
    out_a, out_b = out[:2 + 2 * programs_a], out[2 + 2 * programs_a:-1]
    clamped_a, clamped_b = torch.full_like(off, -7), torch.full_like(codes, -7)
    _stats_kernel[(programs_a + programs_b,)](
        off, out_a, clamped_a, off.numel(), 0, 100, programs_a,
        codes, out_b, clamped_b, codes.numel(), 0, 255, BLOCK=BLOCK,
        KIND_A=OFFSETS, CLAMP_A=True, KIND_B=RANGE, CLAMP_B=clamp_b)
    assert checks._merge("offsets", out_a.tolist()) == torch_offsets_stats(off.cpu())
    lo, hi = torch.aminmax(codes)
    assert checks._merge("range", out_b.tolist()) == [int(lo), int(hi)]
    assert out[-1].item() == -7
    assert torch.equal(clamped_a, off.clamp(0, 100))
    if clamp_b:
        assert torch.equal(clamped_b, codes.clamp(0, 255))
    else:
        assert (clamped_b == -7).all()


@pytest.fixture
def stats_launches(monkeypatch):
    """The grid size of every _stats_kernel launch, in order."""
    from tilemaxsim_plaid.kernels import value_range

    grids, real = [], value_range._stats_kernel

    class Counting:
        def __getitem__(self, grid):
            grids.append(grid[0])
            return real[grid]

    monkeypatch.setattr(value_range, "_stats_kernel", Counting())
    return grids


def test_checks_gathered_as_slots_go_two_to_a_launch(device, stats_launches):
    """checks._kernel_stats with ``slots`` launches nothing; checks._launch_stats then launches
    them two to a launch, each check with its own partials and clamped copy."""
    first = torch.tensor([0, 2, 9, 1], device=device)
    offsets = torch.tensor([0, 4, 4, 7], device=device)
    last = torch.tensor([5, -1], dtype=torch.int32, device=device)
    slots = []
    got = [checks._kernel_stats("range", first, (0, 3), slots=slots),
           checks._kernel_stats("offsets", offsets, 6, slots=slots),
           checks._kernel_stats("range", last, None, slots=slots)]
    assert stats_launches == []
    checks._launch_stats(slots)
    assert stats_launches == [2, 1]  # one program a check here
    (s0, c0), (s1, c1), (s2, c2) = got
    assert checks._merge("range", s0.tolist()) == [0, 9] and c0.tolist() == [0, 2, 3, 1]
    assert checks._merge("offsets", s1.tolist()) == [0, 7, 0, 4] and c1.tolist() == [0, 4, 4, 6]
    assert checks._merge("range", s2.tolist()) == [-1, 5] and c2 is last


def test_a_calls_deferred_checks_share_launches(device, stats_launches):
    """Three checks judged after a launch: two stats launches, not three (GPU tensors; the CPU
    reads them with torch)."""
    if device.type != "cuda":
        pytest.skip("the stats kernels serve GPU tensors")
    batch = checks.DataChecks()
    for name in ("pids", "query_lengths", "codes"):
        batch.in_range(name, torch.tensor([0, 2, 1], device=device), 0, 3, defer=True)
    batch.run()
    batch.finish()
    assert len(stats_launches) == 2
