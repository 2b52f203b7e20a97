"""ops/checks.py: what the host functions do to their arguments before a launch."""

import torch

from tilemaxsim_plaid.ops import checks


def test_unit_stride_copies_only_strided_views():
    """Contiguous tensors pass through untouched (no copy on the usual path); a strided view
    becomes one contiguous copy with the same values."""
    t = torch.arange(7)
    assert checks.unit_stride(t) is t
    assert checks.unit_stride(None) is None
    view = torch.stack([t, torch.zeros_like(t)], 1)[:, 0]
    assert view.stride() == (2,)
    copy = checks.unit_stride(view)
    assert copy.is_contiguous() and torch.equal(copy, t)
