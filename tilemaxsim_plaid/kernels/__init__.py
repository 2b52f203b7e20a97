"""The @triton.jit kernels and the CUDA C++ sources. Importing them needs a triton they build
with (tilemaxsim_plaid.triton_support): an older one raises an ImportError saying so."""

from tilemaxsim_plaid.triton_support import MIN_TRITON, triton_problem, triton_version

if triton_version() is not None and triton_version() < MIN_TRITON:
    raise ImportError(f"tilemaxsim_plaid's kernels cannot be built: {triton_problem()}",
                      name="triton")
