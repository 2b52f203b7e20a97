"""experiments/profile_kernels.py: every variant it times or profiles on the GPU passes its own
output check on a small index (CPU, interpreter), and a wrong output fails that check."""

import pytest
import torch

from experiments import profile_kernels


@pytest.mark.parametrize("make, sizes", [
    pytest.param(profile_kernels.packed_variants, {}, id="packed"),
    pytest.param(profile_kernels.residual_variants, {"num_centroids": 256}, id="residual"),
    pytest.param(profile_kernels.pq_variants, {"subquantizers": (16,)}, id="pq"),
])
def test_variants_pass_their_checks(make, sizes):
    variants = make(num_docs=12, device="cpu", **sizes)
    assert len(variants) >= 2
    for name, (run, check) in variants.items():
        out = run()
        check(out)
        with pytest.raises(AssertionError):
            check(out * 1.01 + 1.0)  # 1 % and one unit off: the check must catch it
