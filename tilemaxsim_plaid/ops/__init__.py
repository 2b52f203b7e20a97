"""Host functions: check inputs, allocate outputs, launch the Triton kernels."""
