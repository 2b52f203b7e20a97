"""experiments/profile_kernels.py: every op it times or profiles on the GPU passes its own output
check on a small index (CPU, interpreter), and a wrong output fails that check."""

import pytest

from experiments import profile_kernels


@pytest.mark.parametrize("make, sizes", [
    pytest.param(profile_kernels.dense_ops, {}, id="dense"),
    pytest.param(profile_kernels.wide_ops, {}, id="wide"),
    pytest.param(profile_kernels.residual_ops, {"num_centroids": 256}, id="residual"),
    pytest.param(profile_kernels.pq_ops, {"subquantizers": (16,)}, id="pq"),
])
def test_ops_pass_their_checks(make, sizes):
    ops = make(num_docs=12, device="cpu", **sizes)
    assert ops
    for name, (run, check) in ops.items():
        out = run()
        check(out)
        with pytest.raises(AssertionError):
            check(out * 1.01 + 1.0)  # 1 % and one unit off: the check must catch it
