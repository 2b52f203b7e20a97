"""A static instruction budget for the residual and dense MaxSim kernels on sm_90a (issue 25).

    python -m experiments.sass_budget [--nbits 1 2 4] [--num-docs 100000] [--decode NAME]
        [--set FIELD=VALUE ...] [--out DIR]

Runs on a CPU: no kernel is executed. For the benchmark shape of
``experiments/bench_residual_scale.py`` (100k documents of MS MARCO-like lengths from
``bench.msmarco_like_lengths`` with ``bench_compressed.make_index``'s seed, one 32-token fp16
query, d = 128, C = 65,536):

1. Captures the exact launch each op makes: ``maxsim_residual`` as the benchmark calls it (fp16
   query, ``inv_norms``: the centroid-table path with the fp16 table the op builds) and
   ``maxsim_packed`` on fp16 documents with ``max_doc_len``, both with ``validate=False``
   (validation reads values on the host and changes no launch choice). The ops run in a process
   without TRITON_INTERPRET, so host code takes its GPU choices, on CPU tensors whose 100,001
   offsets are the benchmark's (the configs depend on the number of documents) and whose
   per-token tensors are tiny (no op reads them on the host with validate=False). The kernel's
   ``run`` is replaced by a recorder that stops the call; the centroid-table build the residual op
   launches first is recorded and skipped.
2. Compiles each launch for sm_90a by the JIT itself (``JITFunction.run(..., warmup=True)``: its
   binder and specialization, pointers and ints divisible by 16 marked as on the GPU, ints equal
   to 1 made constants) against a stand-in driver whose target is ``GPUTarget("cuda", 90, 32)``
   (triton 3.2 to 3.9); on a machine with a GPU, ``JITFunction.warmup`` for the current target
   instead. Registers, shared memory and local memory from ``cuobjdump -res-usage``,
   spills from ``ptxas -v`` on the same PTX.
3. Counts SASS (``cuobjdump -sass``): loops are backward branches; the hot loops are the innermost
   loops holding tensor-core instructions (the token-tile loops: the residual kernel's main tiles
   of BLOCK_T and tail tiles of BLOCK_T_TAIL, the dense kernel's tiles of BLOCK_T); the document
   loop is the innermost loop around all of them (one document per iteration). Each loop's warp
   instructions per iteration are classed (tensor, memory, int, fp, control, other) and divided
   into per token, per decoded element and per query-token x document-token product.
4. Turns counts into bounds for the documents' tile walk (issue: every warp instruction takes one
   of 4 schedulers' issue slots of each of 132 SMs; tensor: HMMA throughput per SM; bytes: what
   the kernel must read from HBM over the read roof), beside the measured times of
   results/PERFORMANCE_LOG.md, run 89, and the issue's targets (nbits 2 >= 1.3x, nbits 4 >= 1.1x
   the dense kernel's docs/s).

Caveats. The measured times were taken with triton 3.6; this counts what the installed triton
(and the ptxas it bundles) emits, and code generation differs between versions: run it in an
environment with triton 3.6 (``pip install triton==3.6.0`` beside a CPU torch is enough) to count
the GPU's code. Checked: the launches are the host code's own choices, each counted loop holds the
HMMA.16816 count of one tile of its shape, one document per iteration of the document loop. Counts are
static: every instruction of a loop body counts once per iteration, whichever branch it sits on;
cache misses, dependency and memory stalls are not modelled, so the issue bound is a lower
bound, not a prediction. Per-document instructions are
the document loop's body outside the hot loops, all paths counted; the persistent loop's
per-chunk atomics and the centroid-table build launch are not counted.

Writes ``DIR/sass_budget.json`` (provenance, assumptions, launches, counts, bounds),
``DIR/<kernel>_loops.sass`` (the counted loops) and ``DIR/README.md``; prints a markdown table
last.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

from tilemaxsim_plaid.ops import checks

from . import harness
from .bench import msmarco_like_lengths
from .bench_residual_scale import op_default

__all__ = ["Launch", "Loop", "benchmark_launches", "bounds", "capture_launch", "class_counts",
           "classify", "compile_launch", "config_override", "document_loop", "find_loops", "hot_loops", "loop_budget",
           "main", "parse_sass", "targets", "tile_walk"]

DIM, QUERY_LEN, NUM_CENTROIDS, NUM_DOCS = 128, 32, 65_536, 100_000
# bench_compressed.make_index draws the lengths first from Generator().manual_seed(0).
LENGTH_SEED = 0
# Per-token tensors of the capture: the ops check their shapes, never their values
# (validate=False), and the launch's arguments depend only on row widths and strides.
CAPTURE_TOKENS = 64

# H200 (assumptions, not measured here): 132 SMs, 4 warp schedulers per SM, each issuing at
# most one warp instruction per cycle, at the 1.98 GHz boost clock.
H200_SMS = 132
SCHEDULERS_PER_SM = 4
BOOST_CLOCK_HZ = 1.98e9
# mma.sync m16n8k16 (HMMA.16816, 4096 FLOP) per SM per cycle, an assumption: A100's per-SM
# dense fp16 rate (2048 FLOP per cycle), half of the ~1 per cycle of Hopper's dense fp16 peak
# (989 TFLOP/s over 132 SMs), which only wgmma reaches (arXiv 2501.12084 benchmarks both). The
# tensor bound is reported at this rate; at twice it, it is halved.
HMMA_16816_PER_SM_PER_CYCLE = 0.5
HMMA_16816_MACS = 16 * 8 * 16
# HBM read roof when no result file has a measured ceiling: the H200's nominal 4.8 TB/s.
NOMINAL_READ_GBPS = 4800.0
# The triton version the measured times below were taken with.
MEASURED_TRITON = "3.6.0"
# Measured on the H200 (torch 2.11, triton 3.6), 100k documents, C = 65,536, defaults: see
# results/PERFORMANCE_LOG.md, run 89.
MEASURED_MS = {"dense": 0.450, 1: 0.565, 2: 0.431, 4: 0.639}
# Issue 25's targets: residual docs/s at least this multiple of the dense kernel's.
TARGET_SPEEDUP = {2: 1.3, 4: 1.1}

# SASS opcodes (without modifiers; U-prefixed uniform-datapath twins included) by class.
CLASSES = {
    "tensor": {"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "BMMA", "DMMA"},
    "memory": {"LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LD", "ST", "LDL", "STL",
               "ATOM", "ATOMG", "ATOMS", "RED", "REDG", "LDC", "ULDC", "CCTL", "LDGDEPBAR",
               "DEPBAR", "UBLKCP", "UTMALDG", "UTMASTG", "SYNCS"},
    "int": {"LOP3", "ULOP3", "SHF", "USHF", "PRMT", "UPRMT", "IMAD", "UIMAD", "IADD3", "UIADD3",
            "VIADD", "LEA", "ULEA", "ISETP", "UISETP", "SEL", "USEL", "MOV", "UMOV", "IMNMX",
            "VIMNMX", "IABS", "POPC", "FLO", "BREV", "UBREV", "BMSK", "SGXT", "IDP", "CS2R",
            "S2R", "S2UR", "R2UR", "PLOP3", "UPLOP3", "P2R", "R2P", "SHL", "SHR", "IMUL",
            "I2IP", "LOP", "IADD", "ISCADD"},
    "fp": {"FMNMX", "FADD", "FMUL", "FFMA", "FSEL", "FSETP", "FSET", "FCHK", "MUFU", "HADD2",
           "HMUL2", "HFMA2", "HMNMX2", "HSETP2", "HSET2", "F2F", "F2FP", "F2I", "I2F", "I2FP",
           "FRND", "DADD", "DMUL", "DFMA", "FMNMX3"},
    "control": {"BRA", "BRX", "JMP", "EXIT", "RET", "CALL", "BSSY", "BSYNC", "WARPSYNC", "BAR",
                "YIELD", "BPT", "BREAK", "KILL", "ELECT", "WARPGROUP", "ACQBULK", "NANOSLEEP"},
}
CLASS_ORDER = ("tensor", "memory", "int", "fp", "control", "other")

_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"(0x[0-9a-f]+)")


# ----------------------------------------------------------------------------------------------
# 1. Launch capture


@dataclasses.dataclass
class Launch:
    """One kernel launch as the op made it: positional arguments, keyword arguments (constexprs
    and launch options: num_warps, num_stages, maxnreg) and grid."""

    name: str
    kernel: object
    args: tuple
    kwargs: dict
    grid: tuple

    @property
    def constexprs(self) -> dict:
        return {k: v for k, v in self.kwargs.items() if k not in LAUNCH_OPTIONS}

    @property
    def options(self) -> dict:
        return {k: v for k, v in self.kwargs.items() if k in LAUNCH_OPTIONS}


LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg", "num_ctas")


class _Captured(Exception):
    """Raised by the recorder to stop the op at its kernel launch."""


def _check_compiled_mode(kernel) -> None:
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):
        raise RuntimeError(
            f"{kernel!r} is not a JITFunction (TRITON_INTERPRET=1?): launches must be captured in "
            f"a process without TRITON_INTERPRET, so that host code takes its GPU choices")


def capture_launch(kernel, call, name: str, skip=()) -> Launch:
    """The first launch of ``kernel`` that ``call()`` makes, recorded and not run. Kernels in
    ``skip`` (launched before it, e.g. a table build) are recorded nowhere and not run."""
    _check_compiled_mode(kernel)
    recorded = []

    def record(*args, grid, warmup, **kwargs):
        recorded.append(Launch(name, kernel, args, dict(kwargs), tuple(grid)))
        raise _Captured

    def no_op(*args, grid, warmup, **kwargs):
        return None

    patched = [(kernel, record)] + [(k, no_op) for k in skip]
    for k, fn in patched:
        k.run = fn  # an instance attribute shadows JITFunction.run; __getitem__ calls self.run
    try:
        # No kernel runs: the ops take the CPU tensors as they would the GPU's.
        with mock.patch.object(checks, "runs_here", lambda Q: True):
            call()
    except _Captured:
        pass
    finally:
        for k, _ in patched:
            del k.run
    if not recorded:
        raise RuntimeError(f"{name}: the call returned without launching {kernel!r}")
    return recorded[0]


def benchmark_offsets(num_docs: int = NUM_DOCS) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths, offsets) of the benchmark's documents (bench_compressed.make_index's draw)."""
    lengths = msmarco_like_lengths(num_docs, torch.Generator().manual_seed(LENGTH_SEED))
    offsets = torch.zeros(num_docs + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return lengths, offsets


def packed_rows(offsets: torch.Tensor, dim: int) -> torch.Tensor:
    """fp16 [offsets[-1], dim] zeros held in one row (an expanded view): packed document rows
    of the benchmark's count, which the dense op's rules read (rows per document), for a launch
    that is captured, never run."""
    return torch.zeros(1, dim, dtype=torch.float16).expand(int(offsets[-1]), dim)


def benchmark_launches(nbits_list=(1, 2, 4), num_docs: int = NUM_DOCS,
                       overrides: dict | None = None) -> dict[str, Launch]:
    """{"dense": ..., "residual nbits=k": ...}: the launches bench_residual_scale's calls make;
    ``overrides``: ResidualConfig fields the residual ones take in place of their default's
    (``{"decode": "permute"}``, say)."""
    from tilemaxsim_plaid.kernels.maxsim_dense import _maxsim_dense_kernel
    from tilemaxsim_plaid.kernels.maxsim_residual import (_maxsim_residual_kernel,
                                                          _query_centroid_scores_kernel)
    from tilemaxsim_plaid.ops.dense import maxsim_packed
    from tilemaxsim_plaid.ops.residual import maxsim_residual

    lengths, offsets = benchmark_offsets(num_docs)
    g = torch.Generator().manual_seed(1)
    Q = torch.nn.functional.normalize(torch.randn(QUERY_LEN, DIM, generator=g), dim=-1).half()
    T = CAPTURE_TOKENS
    launches = {}
    D16 = packed_rows(offsets, DIM)
    launches["dense"] = capture_launch(
        _maxsim_dense_kernel,
        lambda: maxsim_packed(Q, D16, offsets, max_doc_len=int(lengths.max()), validate=False),
        "dense")
    centroids = torch.nn.functional.normalize(torch.randn(NUM_CENTROIDS, DIM, generator=g),
                                              dim=-1).half()
    for nbits in nbits_list:
        codes = torch.zeros(T, dtype=torch.int32)
        residuals = torch.zeros(T, DIM * nbits // 8, dtype=torch.uint8)
        weights = torch.sort(torch.randn(1 << nbits, generator=g) * 0.03).values
        inv_norms = torch.ones(T)
        name = f"residual nbits={nbits}" + "".join(f" {k}={v}" for k, v in
                                                    (overrides or {}).items())
        # The op's launch for this shape (bench_residual_scale.op_default), with the fields
        # asked for replaced.
        config = None if not overrides else dataclasses.replace(
            op_default(nbits, len(lengths), 2), **overrides)
        launches[name] = capture_launch(
            _maxsim_residual_kernel,
            lambda: maxsim_residual(Q, codes, residuals, offsets, centroids, weights, nbits,
                                    inv_norms=inv_norms, config=config, validate=False),
            name, skip=(_query_centroid_scores_kernel,))
    return launches


# ----------------------------------------------------------------------------------------------
# 2. Compile for sm_90a


@dataclasses.dataclass
class Compiled:
    cubin: bytes
    ptx: str
    registers: int
    shared_bytes: int
    local_bytes: int
    spill_stores: int
    spill_loads: int
    target: str


def _bin(tool: str) -> str:
    """A CUDA tool bundled with triton's NVIDIA backend (else from PATH)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    if path.exists():
        return str(path)
    found = shutil.which(tool)
    if found is None:
        raise FileNotFoundError(f"{tool} is neither in triton's backends/nvidia/bin nor on PATH")
    return found


class _StandInDriver:
    """What ``JITFunction.run`` asks of triton's active driver before it compiles, for a GPU that
    is not there: device 0, stream 0 and the target. With ``warmup=True`` run then binds,
    specializes and compiles exactly as on a GPU and returns the kernel without loading or
    launching it (triton 3.2 to 3.9: the same cubin as the JIT's own binder gives, checked on 3.6
    and 3.9)."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def compile_launch(launch: Launch, capability: int = 90) -> Compiled:
    """The launch compiled as the JIT would compile it for an sm_<capability> GPU."""
    from triton.backends.compiler import GPUTarget

    kernel, kwargs = launch.kernel, dict(launch.kwargs)
    if torch.cuda.is_available():
        compiled = kernel.warmup(*launch.args, grid=launch.grid, **kwargs)
        major, minor = torch.cuda.get_device_capability()
        capability = 10 * major + minor
        target_name = f"sm_{capability} (this GPU, JITFunction.warmup)"
    else:
        from triton.runtime import driver

        driver.set_active(_StandInDriver(GPUTarget("cuda", capability, 32)))
        try:
            compiled = kernel.run(*launch.args, grid=launch.grid, warmup=True, **kwargs)
        finally:
            try:
                driver.reset_active()
            except RuntimeError:  # triton 3.4 on builds the real driver here: none without a GPU
                pass
        target_name = f"sm_{capability}a (a stand-in driver, no GPU)"
    cubin, ptx = compiled.asm["cubin"], compiled.asm["ptx"]
    resources = _resource_usage(cubin)
    spills = _ptxas_spills(ptx, capability)
    target_name += f", ptxas {_ptxas(capability).version}"
    return Compiled(cubin, ptx, resources["REG"], int(compiled.metadata.shared),
                    resources["LOCAL"], *spills, target_name)


def _resource_usage(cubin: bytes) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([_bin("cuobjdump"), "-res-usage", str(path)], check=True,
                              capture_output=True, text=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}


Tool = collections.namedtuple("Tool", "path version")


def _ptxas(capability: int) -> Tool:
    """The ptxas triton itself compiles with for this capability: knobs.NvidiaTool from triton
    3.4 on, a (path, version) pair before."""
    from triton.backends.nvidia import compiler

    try:
        tool = compiler.get_ptxas(capability)
    except TypeError:  # triton releases whose get_ptxas takes no capability
        tool = compiler.get_ptxas()
    return Tool(tool.path, tool.version) if hasattr(tool, "path") else Tool(*tool)


def ptxas_available() -> bool:
    """Whether triton's bundled ptxas is there to compile for sm_90a (no NVIDIA backend in some
    triton builds)."""
    try:
        return Path(_ptxas(90).path).exists()
    except Exception:
        return False


def run_compiled_mode(code: str, out: Path, timeout: int) -> dict:
    """Runs the Python ``code`` (it writes JSON to the path in ``sys.argv[1]``) in a subprocess
    at the repository root without TRITON_INTERPRET, so @triton.jit builds JITFunctions and host
    code takes its GPU choices; returns the JSON it wrote."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=Path(__file__).resolve().parents[1],
                   env=env, check=True, timeout=timeout)
    return json.loads(Path(out).read_text())


def _ptxas_spills(ptx: str, capability: int) -> tuple[int, int]:
    """(spill store bytes, spill load bytes) from ptxas -v on the PTX (its .maxnreg included)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        log = subprocess.run([_ptxas(capability).path, "-v", "--regAllocOptLevel=2",
                              f"--gpu-name=sm_{capability}a", str(src), "-o", str(src) + ".o"],
                             check=True, capture_output=True, text=True).stderr
    found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def sass_text(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([_bin("cuobjdump"), "-sass", str(path)], check=True,
                              capture_output=True, text=True).stdout


# ----------------------------------------------------------------------------------------------
# 3. SASS counts


@dataclasses.dataclass(frozen=True)
class Instr:
    addr: int
    opcode: str
    text: str

    @property
    def branch_target(self) -> int | None:
        if self.opcode not in ("BRA", "JMP"):
            return None
        found = _BRANCH_TARGET.search(self.text.split(self.opcode, 1)[1])
        return int(found.group(1), 16) if found else None


@dataclasses.dataclass(frozen=True)
class Loop:
    """Instructions start .. end (the backward branch), inclusive."""

    start: int
    end: int

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and self != other

    def body(self, instrs: list[Instr]) -> list[Instr]:
        return [i for i in instrs if self.start <= i.addr <= self.end]


def parse_sass(text: str) -> list[Instr]:
    """Instructions of ``cuobjdump -sass`` output (branch targets as addresses, not nvdisasm's
    labels), in address order."""
    instrs = []
    for line in text.splitlines():
        found = _SASS_LINE.search(line)
        if found:
            instrs.append(Instr(int(found.group(1), 16), found.group(2),
                                found.group(0).split("*/", 1)[1].strip()))
    return instrs


def classify(opcode: str) -> str:
    for name, opcodes in CLASSES.items():
        if opcode in opcodes:
            return name
    return "other"


def find_loops(instrs: list[Instr]) -> list[Loop]:
    """One loop per backward branch (its target at or before it; a branch to itself, the
    padding after EXIT, is none), in address order."""
    loops = {Loop(i.branch_target, i.addr) for i in instrs
             if i.branch_target is not None and i.branch_target < i.addr}
    return sorted(loops, key=lambda loop: (loop.start, loop.end))


def hot_loops(instrs: list[Instr]) -> list[Loop]:
    """Innermost loops holding tensor-core instructions: no loop inside holds any."""
    with_tensor = [loop for loop in find_loops(instrs)
                   if any(classify(i.opcode) == "tensor" for i in loop.body(instrs))]
    return [loop for loop in with_tensor
            if not any(loop.contains(inner) for inner in with_tensor)]


def document_loop(instrs: list[Instr], hot: list[Loop]) -> Loop | None:
    """The innermost loop around every hot loop (None if there is none)."""
    around = [loop for loop in find_loops(instrs)
              if all(loop.contains(h) for h in hot)]
    return min(around, key=lambda loop: loop.end - loop.start) if around else None


def class_counts(instrs: list[Instr]) -> dict[str, int]:
    counts = collections.Counter(classify(i.opcode) for i in instrs)
    return {name: counts.get(name, 0) for name in CLASS_ORDER}


def loop_budget(instrs: list[Instr], num_warps: int, tokens: int, dim: int,
                query_rows: int) -> dict:
    """Warp instructions per iteration of a loop body (all warps of a program), by class, and
    per token, per decoded element (token x dimension) and per query-token x document-token
    product, for ``tokens`` document tokens per iteration."""
    counts = {k: v * num_warps for k, v in class_counts(instrs).items()}
    total = sum(counts.values())
    opcodes = collections.Counter(i.opcode for i in instrs)
    return {
        "warp_instructions": total,
        "by_class": counts,
        "by_opcode": dict(opcodes.most_common()),
        "tokens": tokens,
        "per_token": total / tokens,
        "per_element": total / (tokens * dim),
        "per_product": total / (tokens * query_rows),
        "tensor_per_token": counts["tensor"] / tokens,
    }


def kernel_budget(name: str, launch: Launch, compiled: Compiled) -> tuple[dict, str]:
    """The loop counts of one compiled launch, and the SASS of its counted loops."""
    instrs = parse_sass(sass_text(compiled.cubin))
    c = launch.constexprs
    num_warps = launch.options.get("num_warps", 4)
    query_rows = c["QUERIES_PER_BLOCK"] * c["LQ"]
    block_d = c["BLOCK_D"]
    chunks = c.get("NUM_D_BLOCKS", c.get("NUM_D_TILES", 1))
    products = 2 if c.get("SPLIT_Q") else 1
    hot = hot_loops(instrs)
    # The kernels' token-tile loops, in source (= address) order.
    roles = ("main", "tail") if "BLOCK_T_TAIL" in c else ("main",)
    tokens = {"main": c["BLOCK_T"], "tail": c.get("BLOCK_T_TAIL")}
    if len(hot) != len(roles) or chunks != 1:
        raise RuntimeError(
            f"{name}: {len(hot)} innermost tensor-core loops for {len(roles)} token-tile loops "
            f"with {chunks} d-chunk(s); this analysis reads one d chunk, one loop per tile kind")
    loops = {}
    excerpts = []
    for role, loop in zip(roles, hot):
        body = loop.body(instrs)
        budget = loop_budget(body, num_warps, tokens[role], DIM, query_rows)
        # HMMA.16816 per tile from the tile shape: a check that one iteration is one tile.
        expected = tokens[role] * query_rows * block_d * products // HMMA_16816_MACS
        budget.update(range=[hex(loop.start), hex(loop.end)], tensor_expected=expected)
        if budget["by_class"]["tensor"] != expected:
            raise RuntimeError(f"{name}: {budget['by_class']['tensor']} tensor instructions in the "
                               f"{role} loop, {expected} expected for a {tokens[role]}-token tile")
        loops[role] = budget
        excerpts.append(f"// {name}: {role} loop {hex(loop.start)}..{hex(loop.end)}\n"
                        + "\n".join(f"/*{i.addr:04x}*/ {i.text}" for i in body))
    doc = document_loop(instrs, hot)
    per_doc = None
    if doc is not None:
        inside = {i.addr for h in hot for i in h.body(instrs)}
        outside = [i for i in doc.body(instrs) if i.addr not in inside]
        per_doc = {"range": [hex(doc.start), hex(doc.end)],
                   "warp_instructions": len(outside) * num_warps,
                   "by_class": {k: v * num_warps for k, v in class_counts(outside).items()}}
    return {"loops": loops, "per_document": per_doc}, "\n\n".join(excerpts)


# ----------------------------------------------------------------------------------------------
# 4. Bounds


def tile_walk(lengths: torch.Tensor, block_t: int, block_t_tail: int | None) -> dict[str, int]:
    """Tiles the kernels walk: main tiles of block_t (the residual kernel's full ones: L //
    block_t), then the remainder in tail tiles of block_t_tail; without block_t_tail (the dense
    kernel) ceil(L / block_t) tiles of block_t, the last one masked."""
    lengths = lengths.to(torch.int64)
    if block_t_tail is None:
        return {"main": int(((lengths + block_t - 1) // block_t).sum()), "tail": 0}
    rest = lengths % block_t
    return {"main": int((lengths // block_t).sum()),
            "tail": int(((rest + block_t_tail - 1) // block_t_tail).sum())}


def bounds(loop_instructions: dict[str, int], tiles: dict[str, int],
           tensor_per_tile: dict[str, int], per_document: int, num_docs: int,
           hbm_bytes: float, read_gbps: float, sms: int = H200_SMS,
           schedulers: int = SCHEDULERS_PER_SM, clock_hz: float = BOOST_CLOCK_HZ,
           hmma_per_sm_cycle: float = HMMA_16816_PER_SM_PER_CYCLE) -> dict:
    """Lower bounds in microseconds for one launch over the documents.

    issue: every warp instruction (loops x tiles + per-document x documents) takes one issue
    slot of one of ``schedulers`` per SM, one per cycle; tensor: HMMA.16816 at
    ``hmma_per_sm_cycle`` per SM; bytes: ``hbm_bytes`` at ``read_gbps``."""
    warp_instructions = (sum(loop_instructions[k] * tiles[k] for k in tiles)
                         + per_document * num_docs)
    hmma = sum(tensor_per_tile[k] * tiles[k] for k in tiles)
    issue_us = warp_instructions / (sms * schedulers * clock_hz) * 1e6
    tensor_us = hmma / (sms * hmma_per_sm_cycle * clock_hz) * 1e6
    bytes_us = hbm_bytes / (read_gbps * 1e9) * 1e6
    named = {"issue": issue_us, "tensor": tensor_us, "bytes": bytes_us}
    return {"warp_instructions": warp_instructions, "hmma": hmma, "issue_us": issue_us,
            "tensor_us": tensor_us, "bytes_us": bytes_us, "dominant": max(named, key=named.get),
            "floor_us": max(named.values())}


def targets(dense_ms: float, floors_us: dict[int, float], speedups=None) -> dict[int, dict]:
    """Per nbits: the time the issue's docs/s target needs (dense time / speedup) against the
    nbits kernel's floor: reachable when the floor is below it, ``margin`` = needed / floor."""
    speedups = speedups or TARGET_SPEEDUP
    out = {}
    for nbits, speedup in speedups.items():
        if nbits not in floors_us:
            continue
        needed_us = dense_ms * 1e3 / speedup
        out[nbits] = {"speedup": speedup, "needed_us": needed_us, "floor_us": floors_us[nbits],
                      "reachable": floors_us[nbits] <= needed_us,
                      "margin": needed_us / floors_us[nbits]}
    return out


def hbm_bytes(name: str, launch: Launch, total_tokens: int, num_docs: int) -> float:
    """What the kernel must read from HBM once: per-token streams and the offsets; the residual
    kernel also the centroid-score table once (it then sits in L2)."""
    offsets = 8 * (num_docs + 1)
    if name == "dense":
        return total_tokens * DIM * 2 + offsets
    c = launch.constexprs
    per_token = 4 + DIM * c["NBITS"] // 8 + (4 if c["PRECOMPUTED_NORMS"] else 0)
    table = (NUM_CENTROIDS * QUERY_LEN * (2 if _half_table(launch) else 4)
             if c["CENTROID_TABLE"] else 0)
    return total_tokens * per_token + offsets + table


def _half_table(launch: Launch) -> bool:
    return str(launch.args[9].dtype) == "torch.float16"


def read_roof() -> tuple[float, str]:
    """(GB/s, source): the newest measured read ceiling in results/, else the nominal one."""
    best = None
    root = Path(__file__).resolve().parent.parent / "results"
    for path in root.glob("**/*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if not isinstance(doc, dict):
            continue
        gbps = (doc.get("ceilings") or {}).get("read_gbps")
        date = (doc.get("provenance") or {}).get("date", "")
        if gbps and "H200" in str((doc.get("provenance") or {}).get("gpu", "")):
            if best is None or date > best[0]:
                best = (date, float(gbps), str(path.relative_to(root.parent)))
    if best is None:
        return NOMINAL_READ_GBPS, "nominal H200 HBM3e (4.8 TB/s), no measured ceiling found"
    return best[1], f"measured, {best[2]} ({best[0]})"


# ----------------------------------------------------------------------------------------------
# Report


def analyse(nbits_list, num_docs: int, out_dir: Path | None,
            overrides: dict | None = None) -> dict:
    lengths, _ = benchmark_offsets(num_docs)
    total_tokens = int(lengths.sum())
    roof_gbps, roof_source = read_roof()
    launches = benchmark_launches(nbits_list, num_docs, overrides)
    kernels = {}
    excerpts = {}
    for name, launch in launches.items():
        compiled = compile_launch(launch)
        budget, excerpt = kernel_budget(name, launch, compiled)
        c = launch.constexprs
        tiles = tile_walk(lengths, c["BLOCK_T"], c.get("BLOCK_T_TAIL"))
        loops = budget["loops"]
        per_doc = budget["per_document"]["warp_instructions"] if budget["per_document"] else 0
        b = bounds({k: loops[k]["warp_instructions"] for k in loops if tiles.get(k)},
                   {k: v for k, v in tiles.items() if v},
                   {k: loops[k]["by_class"]["tensor"] for k in loops},
                   per_doc, num_docs, hbm_bytes(name, launch, total_tokens, num_docs), roof_gbps)
        measured = MEASURED_MS["dense" if name == "dense" else c["NBITS"]]
        kernels[name] = {
            "kernel": launch.kernel.fn.__name__,
            "constexprs": {k: v for k, v in c.items()},
            "options": launch.options,
            "compile": {"target": compiled.target, "registers": compiled.registers,
                        "shared_bytes": compiled.shared_bytes, "local_bytes": compiled.local_bytes,
                        "spill_store_bytes": compiled.spill_stores,
                        "spill_load_bytes": compiled.spill_loads},
            **budget,
            "tiles": tiles,
            "bounds": b,
            "measured_us": measured * 1e3,
            "measured_over_issue": measured * 1e3 / b["issue_us"],
            "measured_over_floor": measured * 1e3 / b["floor_us"],
        }
        excerpts[name] = excerpt
    floors = {launches[n].constexprs["NBITS"]: k["bounds"]["floor_us"]
              for n, k in kernels.items() if n != "dense"}
    doc = {
        "provenance": harness.provenance(),
        "shape": {"num_docs": num_docs, "total_tokens": total_tokens,
                  "mean_tokens": total_tokens / num_docs, "max_tokens": int(lengths.max()),
                  "query_len": QUERY_LEN, "dim": DIM, "num_centroids": NUM_CENTROIDS},
        "assumptions": {"sms": H200_SMS, "schedulers_per_sm": SCHEDULERS_PER_SM,
                        "boost_clock_hz": BOOST_CLOCK_HZ,
                        "hmma_16816_per_sm_per_cycle": HMMA_16816_PER_SM_PER_CYCLE,
                        "read_gbps": roof_gbps, "read_roof_source": roof_source,
                        "measured_source": "results/PERFORMANCE_LOG.md, run 89 (H200, triton 3.6)"},
        "kernels": kernels,
        "targets_vs_floor": {str(k): v for k, v in
                                   targets(MEASURED_MS["dense"], floors).items()},
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "sass_budget.json").write_text(json.dumps(doc, indent=1) + "\n")
        for name, excerpt in excerpts.items():
            (out_dir / f"{name.replace(' ', '_').replace('=', '')}_loops.sass").write_text(
                excerpt + "\n")
    return doc


def markdown_table(doc: dict) -> str:
    lines = ["| kernel | loop | warp instr / tile | per token | per element | per product | "
             "tensor / mem / int / fp / ctrl / other | regs | tiles | issue µs | tensor µs | "
             "bytes µs | dominant | measured µs | measured / issue |",
             "|" + "---|" * 16]
    for name, k in doc["kernels"].items():
        b = k["bounds"]
        for i, (role, loop) in enumerate(k["loops"].items()):
            classes = " / ".join(str(loop["by_class"][c]) for c in CLASS_ORDER)
            head = [name, role] if i == 0 else ["", role]
            tail = ([str(k["compile"]["registers"]), f"{k['tiles'].get(role, 0)}",
                     f"{b['issue_us']:.1f}", f"{b['tensor_us']:.1f}", f"{b['bytes_us']:.1f}",
                     b["dominant"], f"{k['measured_us']:.0f}", f"{k['measured_over_issue']:.2f}"]
                    if i == 0 else ["", f"{k['tiles'].get(role, 0)}"] + [""] * 6)
            lines.append("| " + " | ".join(head + [
                str(loop["warp_instructions"]), f"{loop['per_token']:.1f}",
                f"{loop['per_element']:.3f}", f"{loop['per_product']:.3f}", classes] + tail) + " |")
        if k["per_document"]:
            pd = k["per_document"]
            lines.append(f"| | per document | {pd['warp_instructions']} | | | | "
                         + " / ".join(str(pd["by_class"][c]) for c in CLASS_ORDER)
                         + " | | | | | | | | |")
    lines.append("")
    lines.append("| nbits | target | needed µs | floor µs (largest bound) | reachable | "
                 "needed / floor |")
    lines.append("|---|---|---|---|---|---|")
    for nbits, t in doc["targets_vs_floor"].items():
        lines.append(f"| {nbits} | {t['speedup']}x dense | {t['needed_us']:.0f} | "
                     f"{t['floor_us']:.0f} | {'yes' if t['reachable'] else 'no'} | "
                     f"{t['margin']:.2f} |")
    return "\n".join(lines)


def _readme(doc: dict, command: str) -> str:
    a = doc["assumptions"]
    return "\n".join([
        "# Static instruction budget: residual and dense MaxSim kernels on sm_90a (issue 25)",
        "",
        f"Command (CPU, no GPU): `{command}`",
        "",
        f"Provenance: {harness.provenance_line(doc['provenance'], {})}",
        "",
        f"Shape: {doc['shape']['num_docs']} documents, {doc['shape']['total_tokens']} tokens "
        f"(mean {doc['shape']['mean_tokens']:.1f}, max {doc['shape']['max_tokens']}), one "
        f"{QUERY_LEN}-token fp16 query, d = {DIM}, C = {NUM_CENTROIDS}.",
        "",
        f"Assumptions: {a['sms']} SMs x {a['schedulers_per_sm']} schedulers x 1 warp instruction "
        f"per cycle at {a['boost_clock_hz'] / 1e9:.2f} GHz; HMMA.16816 at "
        f"{a['hmma_16816_per_sm_per_cycle']} per SM per cycle; read roof {a['read_gbps']:.0f} GB/s "
        f"({a['read_roof_source']}); measured times from {a['measured_source']}.",
        "",
        markdown_table(doc),
        "",
        "Per tile: warp instructions of one iteration of the loop, all warps of a program; per "
        "element: per token x dimension decoded (d = 128); per product: per query-token x "
        "document-token pair (32 query rows). Issue µs counts every tile the kernel walks plus "
        "the per-document instructions; needed µs is the dense kernel's measured time over the "
        "target speedup, the floor the largest of the nbits kernel's three bounds.",
        "",
        f"Caveats: the measured times are triton {MEASURED_TRITON}'s code; these counts are "
        f"triton {doc['provenance']['triton']}'s (and its bundled ptxas's)"
        + (", the same version." if doc['provenance']['triton'] == MEASURED_TRITON else
           ", which may differ (rerun with triton " + MEASURED_TRITON + ": on the GPU machine, or "
           "on a CPU in an environment with that triton, since no GPU is needed).") +
        " Checked here: the launches are the host code's "
        "own choices at this commit (configs, constexprs, warps, maxnreg), every counted loop "
        "holds the HMMA.16816 count its tile shape implies (one iteration is one tile), and the "
        "document loop is the innermost loop around the tile loops. "
        "Counts are static: every instruction of a loop body once per iteration, "
        "whichever branch it sits on; cache misses and dependency stalls are not modelled, so "
        "the issue bound is a lower bound. Not counted: the centroid-table build launch and the "
        "persistent loop's per-chunk atomics.",
        "",
        "Files: `sass_budget.json` (launch constexprs and options, compile resources, counts by "
        "class and by opcode, tiles, bounds, targets), `*_loops.sass` (the counted loops).",
        "",
    ])


def config_override(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` -> (field, value) for a ResidualConfig field; VALUE a Python literal."""
    from tilemaxsim_plaid.ops.residual import ResidualConfig
    field, sep, value = text.partition("=")
    names = [f.name for f in dataclasses.fields(ResidualConfig)]
    if not sep or field not in names:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD one of {names}, got "
                                         f"{text!r}")
    try:
        return field, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{field}: {value!r} is not a Python literal") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.sass_budget",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--nbits", type=int, nargs="+", default=[1, 2, 4], choices=(1, 2, 4))
    parser.add_argument("--num-docs", type=int, default=NUM_DOCS)
    parser.add_argument("--decode", default=None, choices=("pairs", "select", "permute"),
                        help="the residual launches with this decoder instead of their default's")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        type=config_override,
                        help="a ResidualConfig field the residual launches take instead of their "
                             "default's (a Python literal: --set pipeline_codes=True); repeatable")
    parser.add_argument("--out", default=None,
                        help="default: results/sass_budget/sm90-triton<version>-<commit7>")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        # Host code must take its GPU choices and @triton.jit must build JITFunctions.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.run([sys.executable, "-m", "experiments.sass_budget", *argv],
                              env=env, check=False).returncode
    import triton

    out = Path(args.out) if args.out else Path("results/sass_budget") / (
        f"sm90-triton{'.'.join(triton.__version__.split('.')[:2])}-"
        f"{harness.provenance()['commit'][:7]}")
    overrides = dict(args.set)
    if args.decode:
        overrides["decode"] = args.decode
    doc = analyse(args.nbits, args.num_docs, out, overrides)
    command = "python -m experiments.sass_budget " + " ".join(
        sys.argv[1:] if argv is None else argv)
    table = markdown_table(doc)
    (out / "README.md").write_text(_readme(doc, command.strip()))
    for name, k in doc["kernels"].items():
        print(f"{name}: {k['kernel']} {k['options']} regs {k['compile']['registers']}, shared "
              f"{k['compile']['shared_bytes']} B, spills {k['compile']['spill_store_bytes']}/"
              f"{k['compile']['spill_load_bytes']} B; constexprs {k['constexprs']}")
    print(f"wrote {out}")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
