"""The tile walk of kernels/mma_walk.cuh (the residual mma kernel's with pipeline_codes=True),
compiled by the host's C++ compiler and run on simulated warps.

The header is plain C++ with the device's calls behind a policy; here the policy's claims are a
shared counter, and warps take tiles in a seeded random interleaving, so grabs land on warps in
every order. Each output's tiles must come out exactly once, in order, with the bounds the
kernel loads by, on one warp; a warp past its stream's end hands out tiles that still name
tokens of the index.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from tilemaxsim_plaid.kernels import __file__ as kernels_init

HEADER = Path(kernels_init).resolve().parent / "mma_walk.cuh"
TILE = 16
COMPILER = shutil.which("g++") or shutil.which("c++")

DRIVER = r"""
#include <cstdio>
#include <vector>
#include "mma_walk.cuh"

// Reads: num_docs, offsets[num_docs + 1], num_out, pids[num_out] (-1 first: none), grab,
// warps, then the interleaving: a warp index per take until a line holding -1.
struct HostWarp {
    int* counter;
    int grab;
    const std::vector<long long>* offsets;
    const std::vector<long long>* pids;
    int claim() { int first = *counter; *counter += grab; return first; }
    int resolve(int pending) { return pending; }
    void bounds(int n, long long& start, int& length) {
        const long long doc = pids->empty() ? n : (*pids)[n];
        start = (*offsets)[doc];
        const long long rows = (*offsets)[doc + 1] - start;
        length = rows > 0 ? (int)rows : 0;
    }
};

int main() {
    int num_docs, num_out, grab, warps;
    scanf("%d", &num_docs);
    std::vector<long long> offsets(num_docs + 1);
    for (auto& o : offsets) scanf("%lld", &o);
    scanf("%d", &num_out);
    long long first_pid;
    scanf("%lld", &first_pid);
    std::vector<long long> pids;
    if (first_pid >= 0) {
        pids.resize(num_out);
        pids[0] = first_pid;
        for (int i = 1; i < num_out; ++i) scanf("%lld", &pids[i]);
    }
    scanf("%d %d", &grab, &warps);
    int counter = 0;
    std::vector<HostWarp> policies(warps);
    std::vector<Walk<HostWarp>*> walks(warps);
    for (int w = 0; w < warps; ++w) {
        policies[w] = HostWarp{&counter, grab, &offsets, &pids};
        walks[w] = new Walk<HostWarp>(policies[w], num_out, grab);
    }
    int w;
    while (scanf("%d", &w) == 1 && w >= 0) {
        const TileRef t = walks[w]->take();
        printf("%d %d %lld %d %d %d\n", w, t.n, t.start, t.first, t.last, t.left);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def walker(tmp_path_factory):
    if COMPILER is None:
        pytest.skip("no C++ compiler on this machine (the GPU tests run the walk in the kernel)")
    folder = tmp_path_factory.mktemp("walk")
    (folder / "driver.cpp").write_text(DRIVER)
    binary = folder / "walk"
    subprocess.run([COMPILER, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{HEADER.parent}",
                    str(folder / "driver.cpp"), "-o", str(binary)], check=True)
    return binary


def walk(binary, lengths, grab, warps, pids=None, seed=0):
    """Every warp's tiles as (warp, n, start, first, last, left), warps taking in a seeded
    random order until each has handed out two tiles past its stream's end."""
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    num_out = len(pids) if pids is not None else len(lengths)
    total_tiles = sum(max(1, -(-length // TILE)) for length in lengths) * (
        1 if pids is None else 2)
    rng = random.Random(seed)
    order = [rng.randrange(warps) for _ in range(total_tiles * 2 + 4 * warps)]
    order += [w for w in range(warps) for _ in range(3)]
    text = "\n".join([
        str(len(lengths)), " ".join(map(str, offsets)), str(num_out),
        " ".join(map(str, pids)) if pids else "-1", f"{grab} {warps}",
        " ".join(map(str, order)), "-1"])
    run = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=True)
    return [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()], offsets


def check(tiles, offsets, lengths, pids, warps):
    num_out = len(pids) if pids is not None else len(lengths)
    total_tokens = offsets[-1]
    seen = {}
    ended = [False] * warps
    for w, n, start, first, last, left in tiles:
        if n < 0:
            ended[w] = True
            # Still tokens of the index, so the kernel may load them unconditionally.
            assert 0 <= start and start + last < max(total_tokens, 1)
            continue
        assert not ended[w], "a warp handed out a tile after its stream ended"
        doc = pids[n] if pids is not None else n
        length = lengths[doc]
        assert start == (offsets[doc] if length else 0)
        assert last == max(length - 1, 0) and left == length - first
        seen.setdefault(n, []).append((w, first))
    assert sorted(seen) == list(range(num_out)), "an output was skipped"
    for n, takes in seen.items():
        length = lengths[pids[n] if pids is not None else n]
        assert {w for w, _ in takes} == {takes[0][0]}, f"output {n} split across warps"
        assert [first for _, first in takes] == list(range(0, max(length, 1), TILE))
    # A warp's outputs come in grabs of consecutive ones, in increasing order.
    for w in range(warps):
        outs = [n for tw, n, *_ in tiles if tw == w and n >= 0]
        firsts = sorted(dict.fromkeys(outs))
        assert outs == sorted(outs) and firsts == list(dict.fromkeys(outs))
    assert all(ended), "a warp never reached the end of its stream"


LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 0, 0, 48, 70, 130, 5, 0, 16, 1]


@pytest.mark.parametrize("grab", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("warps", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_output_once_in_order_on_one_warp(walker, grab, warps, seed):
    lengths = LENGTHS * 3
    tiles, offsets = walk(walker, lengths, grab, warps, seed=seed)
    check(tiles, offsets, lengths, None, warps)


@pytest.mark.parametrize("grab", [1, 2, 5])
def test_pids_in_any_order_with_repeats(walker, grab):
    lengths = LENGTHS
    rng = random.Random(grab)
    pids = [rng.randrange(len(lengths)) for _ in range(37)]
    tiles, offsets = walk(walker, lengths, grab, 4, pids=pids, seed=grab)
    check(tiles, offsets, lengths, pids, 4)


@pytest.mark.parametrize("lengths", [[], [0], [0, 0, 0], [3]])
def test_no_documents_or_only_empty_ones(walker, lengths):
    """No outputs: every tile is past the end and names token 0; empty documents: one tile
    each, with nothing left."""
    tiles, offsets = walk(walker, lengths, 2, 3)
    check(tiles, offsets, lengths, None, 3)
    assert sum(1 for t in tiles if t[1] >= 0) == len(lengths)
