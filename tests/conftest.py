"""Test setup shared by every module.

Without a CUDA device the Triton kernels run under the interpreter, which must be switched on
before triton is imported anywhere; this file is imported by pytest before any test module.
"""

import os
import zlib

import pytest


def _cuda_available() -> bool:
    # torch is imported only after the environment is settled, so triton cannot slip in first.
    import torch

    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

# Hypothesis profiles: its built-in "ci" (derandomized: the same examples every run) is the
# default of tests/kernels/test_properties.py; HYPOTHESIS_PROFILE=thorough draws more examples
# there, fresh each run (print_blob: a failure prints how to replay it), and, set, applies to
# every property test.
settings.register_profile("thorough", settings.get_profile("ci"), derandomize=False)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])

pytest_plugins = ["tests.fixtures_plaid"]

ON_GPU = torch.cuda.is_available()


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """A seed of each test's own (derived from its id with a stable hash, not Python's per-process
    salted one, so a failure reproduces in the next run)."""
    value = zlib.crc32(request.node.nodeid.encode()) % (2**31)
    torch.manual_seed(value)
    return value


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that any element a kernel forgets to write fails the comparison."""
    return t.fill_(float("nan"))


def rows_in_order(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For offsets out of order (a document whose end is before its start is empty): the row
    index of each document's rows in turn and the non-decreasing offsets of that packing, so the
    reference scores the same documents (``index[rows]`` with the second as offsets)."""
    bounds = offsets.tolist()
    rows = [torch.arange(start, max(start, end)) for start, end in zip(bounds, bounds[1:])]
    ordered = torch.zeros(len(rows) + 1, dtype=torch.int64)
    ordered[1:] = torch.tensor([len(r) for r in rows]).cumsum(0)
    return torch.cat(rows).to(offsets.device), ordered.to(offsets.device)


def compile_cubin_sm90(source_path, defines: dict) -> bytes:
    """``source_path`` (a kernels/*.cu file) compiled by NVRTC for sm_90 with ``defines``, its
    includes given by name; fails the test, saying how to install NVRTC, where it is missing."""
    from tilemaxsim_plaid.ops import nvrtc

    try:
        nvrtc.nvrtc_library()
    except nvrtc.NvrtcError as error:
        pytest.fail(f"{error} (the dev extras install nvidia-cuda-nvrtc)")
    cubin, _ = nvrtc.compile_cubin(source_path.read_text(), source_path.name, "sm_90", defines,
                                   headers=nvrtc.local_headers(source_path))
    return cubin


def replayed_from_cuda_graph(call) -> torch.Tensor:
    """``call()``'s output as a CUDA graph replays it: warmed up on a side stream, captured, the
    captured output poisoned with NaN, then replayed (a call that copies from pageable host
    memory, or keeps a tensor the graph does not, fails or scores wrong here)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return captured


def property_examples(on_cpu: int) -> int:
    """Hypothesis examples for a property test that draws launch shapes or configurations: on a
    GPU each new combination is a kernel compile (seconds), so the GPU run draws fewer of them."""
    return max(6, on_cpu // 4) if ON_GPU else on_cpu


def compiled_mode_json(code: str, tmp_path_factory, timeout: int) -> dict:
    """The JSON ``code`` writes when run by experiments.sass_budget.run_compiled_mode (a
    subprocess without TRITON_INTERPRET that compiles for sm_90a); skips without triton's
    bundled ptxas."""
    from experiments import sass_budget

    if not sass_budget.ptxas_available():
        pytest.skip("triton's bundled ptxas is not available")
    return sass_budget.run_compiled_mode(code, tmp_path_factory.mktemp("sm90") / "out.json",
                                         timeout)
