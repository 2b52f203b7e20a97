"""One tolerance per (op, input dtype): (rtol, atol) against the float64 reference.

Scores are sums of up to Lq maxima of dot products of length d, so the error grows with both;
the entries below hold for the test shapes (Lq <= 64, d <= 768, |x| ~ N(0, 1/d) inputs).
"""

import torch

TOLERANCES = {
    # fp32 inputs go through three tf32 tensor-core products (input_precision="tf32x3"): about
    # 1e-6 relative per product, the order of fp32 summation itself.
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

TOLERANCES.update({
    # The kernel rounds each decoded embedding (or, with the centroid table, each residual weight)
    # to fp16 before the tensor cores, like colbert-ai's fp16 decompression: 2**-11 relative per
    # element, so a few 1e-4 on sums of 32 maxima.
    ("maxsim_residual", torch.float16): (1e-3, 1e-3),
    # Same with bf16's 2**-8: about 8x the fp16 error.
    ("maxsim_residual", torch.bfloat16): (1e-2, 2e-2),
    # fp32 products as three tf32 products (tf32x3): about 1e-6 relative, like summation order.
    ("maxsim_residual", torch.float32): (1e-5, 1e-5),
    # split_query: fp32 query as fp16 head + tail against fp16 residual weights; the centroid part
    # is exact fp32. Rounding the weights to fp16 is one fixed error per bucket, so it adds up with
    # the same sign over a document's tokens: about 1e-5 per query token and, over 3,000 seeded
    # draws of the test's shapes (Lq = 33), at most 1.4e-4 * (1 + |score|) per score.
    ("maxsim_residual_split", torch.float32): (5e-4, 5e-4),
    # Codebook entries (fp32 in the codec) are rounded to the query dtype for the tensor cores.
    ("maxsim_pq", torch.float16): (1e-3, 1e-3),
    ("maxsim_pq", torch.bfloat16): (1e-2, 2e-2),
    ("maxsim_pq", torch.float32): (1e-5, 1e-5),
})

TOLERANCES.update({
    # Centroid interaction only gathers, takes maxima and sums Lq of them in fp32: summation order
    # is the only difference, with the fp16 inputs widened exactly before the sum.
    ("centroid_interaction", torch.float32): (1e-5, 1e-5),
    ("centroid_interaction", torch.float16): (1e-5, 1e-5),
    # The plugin's exact scores (PLAID decompression in fp32, then MaxSim over Lq = 32 tokens)
    # against the float64 reference over the same decompressed embeddings: rounding of the
    # normalisation and of fp32 dot products of length 128.
    ("plaid_exact", torch.float32): (1e-5, 1e-4),
})

TOLERANCES.update({
    # The centroid table: one dot product of length d per entry. Built from an fp32 query's fp16
    # head and tail against fp16 centroids, every product is exact in fp32 and the tail's own
    # rounding is ~2**-22 of each query element: the error of an fp32 dot product.
    ("centroid_table", torch.float32): (1e-6, 1e-6),
})


# (rtol, atol) per result dtype for an integration (PyLate, RAGatouille) whose scores we compute
# in fp32 and round once to the library's result dtype, against the library in float64: the
# rounding, u = 2**-11 (fp16) or 2**-8 (bf16) relative, dominates.
ROUNDED_ONCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2.0**-11, 1e-5),
    torch.bfloat16: (2.0**-8, 1e-4),
}
