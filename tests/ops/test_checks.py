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


def test_derived_is_remembered_until_the_tensor_changes(device):
    """A tensor computed from another is made once while that one is unchanged, again after an
    in-place write (its version moves), and on every call for an inference tensor."""
    checks.clear_cache()
    made = []

    def double(t):
        return checks.derived(t, "double", lambda: made.append(1) or t * 2)

    t = torch.arange(4, device=device)
    assert double(t).tolist() == [0, 2, 4, 6]
    assert double(t).tolist() == [0, 2, 4, 6] and len(made) == 1
    t[0] = 5
    assert double(t).tolist() == [10, 2, 4, 6] and len(made) == 2
    assert checks.derived(t, "other", lambda: t + 1).tolist() == [6, 2, 3, 4]  # keyed by what
    with torch.inference_mode():
        u = torch.arange(4, device=device)
    double(u)
    double(u)
    assert len(made) == 4
    checks.clear_cache()


def test_residual_decode_table_follows_bucket_weights_written_in_place(device):
    """The residual op's decode table is remembered per bucket_weights tensor: a write into the
    weights still changes the scores as it changes the float64 reference's."""
    from tests.kernels.test_maxsim_residual import random_index, unit_queries
    from tilemaxsim_plaid import reference
    from tilemaxsim_plaid.ops.residual import maxsim_residual

    checks.clear_cache()
    index = random_index(device, 64, 2, lengths=[3, 5, 1])
    Q = unit_queries(1, 8, 64, torch.float16, device)[0]
    args = (index["codes"], index["residuals"], index["offsets"], index["centroids"])
    for _ in range(2):
        weights = index["bucket_weights"]
        got = maxsim_residual(Q, *args, weights, 2)
        want = reference.maxsim_residual(Q, *args, weights, 2)
        torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=2e-3, atol=2e-3)
        weights.mul_(-1.5)  # the same tensor, new values: the next round must see them
    checks.clear_cache()
