"""One tolerance per (op, input dtype): (rtol, atol) against the float64 reference.

Scores are sums of up to Lq maxima of dot products of length d, so the error grows with both;
the entries below hold for the test shapes (Lq <= 64, d <= 768, |x| ~ N(0, 1/d) inputs).
"""

import torch

TOLERANCES = {
    # fp32 inputs are multiplied in full fp32 (input_precision="ieee"): only summation order differs.
    ("maxsim_dense", torch.float32): (1e-5, 1e-5),
    # fp16 inputs are exact products accumulated in fp32: only accumulation order differs.
    ("maxsim_dense", torch.float16): (1e-4, 1e-4),
    # bf16 likewise; the inputs are rounded before the reference sees them, so no bf16 rounding here.
    ("maxsim_dense", torch.bfloat16): (1e-4, 1e-4),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, op: str, dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCES[(op, dtype)]
    assert not torch.isnan(actual).any(), "output has NaN: an element was not written"
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=rtol, atol=atol)
