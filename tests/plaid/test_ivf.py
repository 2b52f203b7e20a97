"""Stage 1's probe kernel (every document of the probed inverted lists) against the torch path."""

from __future__ import annotations

import types

import pytest
import torch

from tilemaxsim_plaid.ops.ivf import BLOCK, mark_probed_documents
from tilemaxsim_plaid.plaid import backends


def _ivf(lengths, num_docs, seed, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    # A document may sit in several lists, as in PLAID's IVF (one entry per distinct centroid).
    pids = torch.randint(0, num_docs, (int(offsets[-1]),), generator=generator, dtype=torch.int32)
    return types.SimpleNamespace(device=torch.device(device), num_docs=num_docs, ivf_offsets=offsets.to(device),
                                 ivf_lengths=lengths.to(device), ivf_pids=pids.to(device),
                                 max_ivf_length=int(lengths.max()))


@pytest.mark.parametrize("cells", [[3], [0, 5, 5, 2], [4], [1, 6]], ids=["one", "repeated", "empty-list", "long-lists"])
def test_kernel_marks_exactly_the_listed_documents(cells, monkeypatch, device):
    index = _ivf([5, 2 * BLOCK + 3, 17, 40, 0, 9, BLOCK], num_docs=3000, seed=len(cells), device=device)
    cells = torch.tensor(cells, dtype=torch.int64, device=device)
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "torch")
    expected = backends.mark_probed_documents(index, cells)
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, "triton")
    got = backends.mark_probed_documents(index, cells)
    listed = {int(d) for c in cells.tolist()
              for d in index.ivf_pids[int(index.ivf_offsets[c]) : int(index.ivf_offsets[c + 1])].tolist()}
    assert set(torch.nonzero(got[: index.num_docs]).flatten().tolist()) == listed
    assert torch.equal(got[: index.num_docs], expected[: index.num_docs])


def test_marks_add_to_the_bitmap_and_bad_bitmaps_are_refused(device):
    index = _ivf([4, 6], num_docs=50, seed=0, device=device)
    bitmap = torch.zeros(50, dtype=torch.bool, device=device)
    bitmap[49] = True
    cell = torch.tensor([1], device=device)
    mark_probed_documents(bitmap, cell, index.ivf_offsets, index.ivf_lengths, index.ivf_pids, 6)
    assert bitmap[49] and int(bitmap.sum()) == 1 + len(set(index.ivf_pids[4:10].tolist()) - {49})
    with pytest.raises(TypeError, match="bitmap"):
        mark_probed_documents(bitmap.to(torch.uint8), cell, index.ivf_offsets,
                              index.ivf_lengths, index.ivf_pids, 6)
