"""GPU suites: named lists of bounded commands, each suite one call of the GPU machine.

    python -m experiments.gpu_suite --list
    python -m experiments.gpu_suite --dry-run NAME [--before DIR]
    python -m experiments.gpu_suite NAME [--out DIR] [--budget S] [--only GLOB,...]
    python -m experiments.gpu_suite before-after --before .before [--rounds N]

A step is one command (argv) with its own time limit. The runner installs the wheels in ``.whl/``
(the packages the GPU image lacks) into ``/tmp/site``, runs every step even after one fails,
tees each step's output into ``<step>.log``, kills a step at its limit (status 124), skips the
steps left once the total budget is spent, and writes ``commands.txt``, ``provenance.json`` and
``steps.txt`` beside the logs. Everything is bundled into ``<out>/gpu-<suite>.tar.gz``, one file,
because the device tool returns few files; the exit status is 0 only if every step passed.

``before-after`` times the headline rows of the dense, compressed and PLAID benchmarks for two
source trees, an older checkout unpacked at ``--before`` and this one, alternating
(before, after) per benchmark and round, and prints a table of before ms, after ms and ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
SITE = "/tmp/site"
PY = sys.executable
PYTEST = (PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not colbert")
TIMEOUT_RC = 124  # what coreutils' timeout returns, so a killed step reads as it did in shell
# The device machine runs one command for at most 600 s; the rest is left for start-up and the bundle.
DEFAULT_BUDGET_S = 570
MIN_STEP_S = 5  # a step with less time left than this is skipped, not started
# NVLink multicast stays off on the shared hosts (see the device's KINDS.md); no network there.
BASE_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "GIT_PYTHON_REFRESH": "quiet",
            "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
# Bundles prepared on a CPU machine and carried with the call, and the command that makes each.
PREPARED = {
    "runs/plaid_bench": "python -m experiments.bench_plaid prepare --out runs/plaid_bench",
    "runs/wvgpu": "python -m experiments.reproduce configs/wiki-vital-h200.yaml --steps prepare --out runs/wvgpu",
    "runs/wv384gpu": "python -m experiments.reproduce configs/wiki-vital-h200-d384.yaml --steps prepare "
                     "--out runs/wv384gpu (without the checkpoint and collection text)",
}
PLAID_SYNTHETIC = "runs/plaid_bench_synthetic/synthetic.nbits2"  # written on the GPU host, reused
# The targets suite's full grid, in parts: a warm machine keeps this folder between device calls
# (as SITE's wheels), so a later call's grid-rest times the cells an earlier call's budget left,
# on the same card at the same commit (bench_grid refuses a part of another commit).
GRID_PARTS = Path(tempfile.gettempdir()) / "gpu_suite-grid-parts"


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    timeout: float
    cwd: Path = ROOT  # the source tree it runs from: before-after runs two


@dataclasses.dataclass(frozen=True)
class Suite:
    what: str
    build: Callable[[Path, argparse.Namespace], list[Step]]  # (work folder, options) -> steps
    needs: tuple[str, ...] = ()  # paths under ROOT that must be carried ({before}: --before)
    # paths under ROOT (or absolute ones) added to the bundle after the steps
    collect: tuple[str, ...] = ()
    report: Callable[[Path, argparse.Namespace], str] | None = None


def module(name: str, *args: str) -> tuple[str, ...]:
    return (PY, "-m", name, *args)


# --------------------------------------------------------------------------- headline commands
def bench_dense(out: Path, providers: str | None = None) -> tuple[str, ...]:
    """The dense benchmark's main shapes (no length/N/d sweeps)."""
    return module("experiments.bench", "--no-sweeps", *(("--providers", providers) if providers else ()),
                  "--out", str(out))


def bench_compressed(out: Path) -> tuple[str, ...]:
    """The residual and PQ main rows and floors, default configs."""
    return module("experiments.bench_compressed", "--out", str(out))


def bench_plaid(out: Path, encoders: bool = True) -> tuple[str, ...]:
    """End-to-end PLAID on the carried bundle and a 1M-passage synthetic index, rerank of 100k and
    1M candidates. Absolute paths: before-after runs it from another tree on the same index."""
    return module("experiments.bench_plaid", "run", "--bundle", str(ROOT / "runs/plaid_bench"),
                  "--out", str(out), "--synthetic-dir", str(ROOT / PLAID_SYNTHETIC),
                  "--num-queries", "32", "--equivalence-queries", "500",
                  *(() if encoders else ("--encoder-shapes",)),
                  "--rerank-sizes", "100000", "1000000", "--stock-rerank-max", "100000")


def reproduce(config: str, steps: str, out: str, conditions: str | None = None) -> tuple[str, ...]:
    return module("experiments.reproduce", f"configs/{config}.yaml", "--steps", steps, "--out", out,
                  *(("--conditions", conditions) if conditions else ()))


# --------------------------------------------------------------------------- suites
def kernels(work: Path, opts) -> list[Step]:
    return [Step("dense-tests", (*PYTEST, "tests/kernels/test_maxsim_dense.py"), 240),
            Step("bench-dense", bench_dense(work / "bench"), 240)]


def compressed(work: Path, opts) -> list[Step]:
    # The PQ config-space property test compiles hundreds of configs: the CPU suite runs it.
    tests = ("tests/kernels/test_maxsim_residual.py", "tests/kernels/test_maxsim_pq.py",
             "tests/kernels/test_maxsim_pq_mma.py", "tests/kernels/test_maxsim_pq_lut_shared.py",
             "tests/codecs", "tests/ops")
    return [Step("compressed-tests", (*PYTEST, *tests, "-k", "not any_config"), 330),
            Step("bench-compressed", bench_compressed(work / "compressed"), 200)]


def plaid(work: Path, opts) -> list[Step]:
    tests = ("tests/plaid/test_centroid.py", "tests/plaid/test_ivf.py", "tests/plaid/test_sort.py")
    return [Step("plaid-kernel-tests", (*PYTEST, *tests), 120),
            Step("bench-plaid", bench_plaid(work / "plaid"), 420)]


def reproduce_gpu(work: Path, opts) -> list[Step]:
    conditions = "rerank,rerank-1m,plaid-k10,plaid-k100,plaid-k1000"  # "rerank": every point of its sweep
    return [Step("reproduce-wiki", reproduce("wiki-vital-h200", "search", "runs/wvgpu"), 220),
            Step("reproduce-synthetic",
                 reproduce("synthetic-scale", "prepare,search", "runs/syngpu", conditions), 330)]


# colbert-ai's own indexer is timed by its own step (engines-build-times), not inside the others.
ENGINES_FAST = ("--latency-queries", "100", "--exact-queries", "100", "--colbert-build-max", "0",
                "--work", "/tmp/engines")


# What the engines suites need in .whl beyond the GPU image (python 3.12 wheels): colbert-ai
# 0.2.22 with ujson, bitarray, GitPython, gitdb and smmap (its imports; faiss only for its own
# indexer), fast-plaid 1.7.0.2110 with fastkmeans 0.5.0, usearch and numkong.


def engines(work: Path, opts) -> list[Step]:
    """The three engines at 100k and 1M passages (about 4 minutes on the H200, 3 on an H100)."""
    return [Step("bench-engines", module("experiments.bench_engines", "--passages", "100000", "1000000",
                                         "--fairness", "--fast-plaid-create-max", "100000",
                                         "--stock-queries", "30", *ENGINES_FAST,
                                         "--out", str(work / "engines")), 560)]


def engines_extra(work: Path, opts) -> list[Step]:
    """Index build times at 100k passages (colbert-ai's CollectionIndexer, fast-plaid's create(),
    the shared writer), then the three engines on wiki-vital embeddings encoded on the GPU from
    the carried bundle (python -m experiments.wiki_vital_bundle pack --out .wiki_bundle)."""
    fast = tuple(a for a in ENGINES_FAST if a not in ("--colbert-build-max", "0"))
    return [Step("engines-build-times", module(
                "experiments.bench_engines", "--passages", "100000", "--build-only",
                "--colbert-build-max", "100000", "--fast-plaid-create-max", "100000", *fast,
                "--out", str(work / "engines-build-times")), 300),
            Step("wiki-vital-encode", module("experiments.wiki_vital_bundle", "encode", ".wiki_bundle",
                                             "--out", "/tmp/wiki-vital-emb", "--device", "cuda"), 200),
            Step("bench-engines-wiki-vital", module(
                "experiments.bench_engines", "--embeddings", "/tmp/wiki-vital-emb", "--fairness",
                "--stock-queries", "30", "--colbert-build-max", "100000", *fast,
                "--out", str(work / "engines-wiki-vital")), 300)]


def engines_msmarco(work: Path, opts) -> list[Step]:
    """MS MARCO's size, 8.8M passages: the index and ground truth (about 8 minutes), then the
    engines (about 4), each step within one device command's 10 minutes."""
    size = ("--passages", "8841823")
    return [Step("engines-build", module("experiments.bench_engines", *size, "--build-only", *ENGINES_FAST,
                                         "--out", str(work / "engines-build")), 590),
            Step("bench-engines", module("experiments.bench_engines", *size, "--fairness",
                                         "--stock-queries", "20", *ENGINES_FAST,
                                         "--out", str(work / "engines")), 560),
            Step("profile-search", module("experiments.profile_search", "--index",
                                          "/tmp/engines/engines-8841823/colbert",
                                          "--out", str(work / "profile-search")), 300)]


def profile_search(work: Path, opts) -> list[Step]:
    """The plugin's search graph kernel by kernel on random indexes of MS MARCO's size and of
    100k passages (about 3 minutes, most of it generating the large one)."""
    return [Step("profile-search-8.8m", module("experiments.profile_search", "--passages", "8841823",
                                               "--out", str(work / "profile-search-8.8m")), 400),
            Step("profile-search-100k", module("experiments.profile_search", "--passages", "100000",
                                               "--centroids", "32768", "--k", "10",
                                               "--out", str(work / "profile-search-100k")), 150)]


def residual_caps(work: Path, opts) -> list[Step]:
    """The residual op's default launch under other register caps, nbits 1, 2 and 4, beside dense
    scoring of the decoded documents (issue 25's residual targets; about 4 minutes)."""
    return [Step("residual-caps", module("experiments.bench_residual_scale", "--centroids", "65536",
                                         "--caps", "0", "104", "112", "128",
                                         "--out", str(work / "residual-caps")), 420)]


def variants(work: Path, opts) -> list[Step]:
    """The dense default beside its row-offset variants and the peers in alternated rounds, then
    residual codes at C = 2^16 and 2^18, nbits 1, 2 and 4, beside dense on the decoded documents
    (about 3 minutes)."""
    from experiments.bench_dense_variants import ROW_OFFSET_CELLS

    return [Step("dense-variants", module("experiments.bench_dense_variants", "--cells",
                                          *ROW_OFFSET_CELLS, "--variants", "int64 rows",
                                          "int32 rows", "--out", str(work / "dense-variants")),
                 240),
            Step("residual-scale", module("experiments.bench_residual_scale",
                                          "--out", str(work / "residual-scale")), 240)]


def validate(work: Path, opts) -> list[Step]:
    """The GPU tests of the host checks and the ops, then validate=True against validate=False
    for every op at 100k documents, with a new pid list each call and with inference tensors,
    then each way's host time at 2,000 documents by Python function (about 7 minutes)."""
    tests = ("tests/ops/test_validation.py", "tests/ops/test_dense.py", "tests/ops/test_residual.py",
             "tests/ops/test_pq.py", "tests/kernels/test_value_range.py")
    return [Step("validate-tests", (*PYTEST, *parallel_workers(), *tests), 150),
            Step("bench-validate", module("experiments.bench_validate",
                                          "--out", str(work / "validate")), 300),
            # At 2,000 documents the GPU idles between calls, so a loop's time per call is the
            # host's: cProfile's table of each way says which Python and torch calls it is.
            Step("host-profile", module("experiments.bench_validate", "--num-docs", "2000",
                                        "--rounds", "1", "--nbits", "2", "--host-profile",
                                        "--out", str(work / "validate-host")), 120)]


def new_offsets(work: Path, opts) -> list[Step]:
    """The GPU tests of offsets judged after the launch (the checks, every dense, residual and
    PQ kernel path with an end before its start, the mma kernels' shared document bounds), then
    maxsim_packed's and maxsim_pq's validate=True against validate=False for --before and this
    tree, 3 rounds each (a new batch each call among the ways; about 6 minutes)."""
    tests = ("tests/ops/test_validation.py", "tests/kernels/test_maxsim_residual_mma.py",
             "tests/kernels/test_maxsim_pq_mma.py")
    steps = [Step("offsets-tests", (*PYTEST, *parallel_workers(), *tests), 150),
             Step("kernel-tests", (*PYTEST, *parallel_workers(), "tests/kernels/test_maxsim_dense.py",
                                   "tests/kernels/test_maxsim_residual.py",
                                   "tests/kernels/test_maxsim_pq.py",
                                   "tests/kernels/test_maxsim_pq_mma.py",
                                   "-k", "end_before or every_config or flat or matches_reference"),
                   100)]
    for tree, root in (("before", (ROOT / opts.before).resolve()), ("after", ROOT)):
        steps.append(Step(f"validate-{tree}", module("experiments.bench_validate", "--ops",
                                                     "packed", "pq", "--rounds", "3",
                                                     "--out", str(work / tree)),
                          180, cwd=root))
    return steps


def parallel_workers() -> tuple[str, ...]:
    """pytest-xdist's workers where it is installed (it ships as a wheel in .whl)."""
    import importlib.util

    return ("-n", "8") if importlib.util.find_spec("xdist") else ()


def residual_decoders(work: Path, opts) -> list[Step]:
    """The GPU tests of the byte-permute decoder, codes a tile ahead, the dense running max and
    PQ decode, then the residual op's default launch with each decoder that applies (pairs,
    permute), each also with codes a tile ahead flipped, nbits 1, 2 and 4 at C = 2^16, beside
    dense scoring of the decoded documents (about 6 minutes)."""
    tests = ("tests/kernels/test_maxsim_residual.py", "tests/kernels/test_maxsim_dense.py",
             "tests/kernels/test_nan_policy.py")
    return [Step("decoder-tests", (*PYTEST, *parallel_workers(), *tests, "-k",
                                   "permute or running or ptx or pipelined"), 150),
            Step("pq-tests", (*PYTEST, *parallel_workers(), "tests/kernels/test_maxsim_pq.py"),
                 150),
            Step("residual-decoders", module("experiments.bench_residual_scale", "--centroids",
                                             "65536", "--decoders", "pairs", "permute",
                                             "--pipeline-codes",
                                             "--out", str(work / "residual-decoders")), 360)]


def residual_mma(work: Path, opts) -> list[Step]:
    """The GPU tests of the residual kernels (the mma kernel's own, the op's defaults, the Triton
    kernel's, the NaN policy) and of the PQ mma kernel, then the residual op's default launch
    beside its other kernel (the Triton kernel's launch and the mma kernel, bench_residual_scale),
    the mma kernel at 4 and 8 documents per grab and with its prefetch flipped, and dense scoring
    of the decoded documents, nbits 2 and 4 (where the mma kernel applies) at C = 2^16 and 2^18;
    then the centroid-score table's build by tile (bench_centroid_table; about 7 minutes)."""
    tests = ("tests/kernels/test_maxsim_residual_mma.py", "tests/kernels/test_maxsim_pq_mma.py",
             "tests/ops/test_residual.py", "tests/kernels/test_maxsim_residual.py",
             "tests/kernels/test_nan_policy.py", "tests/experiments/test_bench_centroid_table.py")
    return [Step("residual-tests", (*PYTEST, *parallel_workers(), *tests), 200),
            Step("residual-mma", module("experiments.bench_residual_scale", "--centroids",
                                        "65536", "262144", "--nbits", "2", "4", "--repeats", "2",
                                        "--mma-grabs", "4", "8",
                                        "--out", str(work / "residual-mma")), 330),
            Step("centroid-table", module("experiments.bench_centroid_table",
                                          "--out", str(work / "centroid-table")), 90)]


def residual_ncu(work: Path, opts) -> list[Step]:
    """Nsight Compute on the residual op's two kernels (the Triton default and the mma kernel),
    one fp16 query over 100k documents, C = 2^16, nbits 2 and 4: which unit each saturates and
    the SASS instructions their warps wait on, with why (profile_kernels ncu: stalls.txt)."""
    return [Step("residual-ncu", module("experiments.profile_kernels", "ncu", "--ops", "residual",
                                        "--only", "=residual,=residual nbits4,residual decode",
                                        "--out", str(work / "residual-ncu")), 300)]


def dense_rows(work: Path, opts) -> list[Step]:
    """The GPU tests of the dense kernels and the NaN policy (rows past a document's end repeated
    and masked bit for bit among them), then the dense default beside the same launches with
    those rows masked and repeated and with documents walked as one loop, and the peers, on the
    several-query cells, one query of 48-64 tokens, short documents, d = 64-96 and the headline,
    3 alternated rounds (about 5 minutes)."""
    from experiments.bench_dense_variants import NARROW_ROW_CELLS, TILE_WALK_CELLS

    tests = ("tests/kernels/test_maxsim_dense.py", "tests/kernels/test_nan_policy.py",
             "tests/ops/test_dense.py")
    return [Step("dense-tests", (*PYTEST, *parallel_workers(), *tests), 150),
            Step("dense-rows", module("experiments.bench_dense_variants", "--cells",
                                      *TILE_WALK_CELLS, *NARROW_ROW_CELLS, "--variants",
                                      "masked rows", "repeated rows", "flat documents",
                                      "loop per document", "--rounds", "3",
                                      "--out", str(work / "dense-rows")), 400)]


# One query's cells whose default holds the query across several documents a program.
PER_DOCUMENT_CELLS = ("headline", "d64", "d64-lognormal-30", "d128-lognormal-30",
                      "d256-lognormal-70", "d96", "d144", "d160", "Lq64", "d64-lognormal-150")
# One query over packed documents at d in whole 128-column chunks past one (the cells a peer
# led on an H100 in run 208), where such a card takes per-document tiles over those chunks.
WIDE_PER_DOCUMENT_CELLS = ("d256-lognormal-70", "d256-lognormal-150", "d256-uniform",
                           "d256-heavy-512", "d384-lognormal-30", "d384-lognormal-70", "d512",
                           "d512-lognormal-150", "d512-uniform", "d512-heavy-512",
                           "d768-lognormal-30", "d768-Lq31")


def peer_roof(work: Path, opts) -> list[Step]:
    """The read-roof cells where a peer was faster on an H100 (runs 201 and 208): one query's
    default beside its per-document tiles and its held query, at d in one chunk and in whole
    128-column chunks past one, then the default beside its validate=False launch and the
    peers, each in 5 alternated rounds, then the dense sweep of launch configs over them
    (sweep_configs' eighth set; about 11 minutes: two device calls with --only)."""
    return [Step("per-document", module("experiments.bench_dense_variants", "--cells",
                                        *PER_DOCUMENT_CELLS, "--variants", "per document",
                                        "held query", "--rounds", "5",
                                        "--out", str(work / "per-document")),
                 240),
            Step("wide-per-document", module("experiments.bench_dense_variants", "--cells",
                                             *WIDE_PER_DOCUMENT_CELLS, "--variants", "held query",
                                             "slower card", "--rounds", "5",
                                             "--out", str(work / "wide-per-document")),
                 300),
            Step("peer-roof", module("experiments.bench_dense_variants", "--cells", "headline",
                                     "d512-lognormal-150", "d160-padded", "--variants",
                                     "default", "--rounds", "5",
                                     "--out", str(work / "peer-roof")), 150),
            Step("sweep-eighth", module("experiments.sweep_configs", "--cells", "eighth",
                                        "--budget", "150", "--out", str(work / "sweep-eighth")),
                 180)]


def dense_flat(work: Path, opts) -> list[Step]:
    """The GPU tests of the flat walk (one loop over a program's documents), then the dense
    default beside the same launches with documents walked as one loop and a loop per
    document, on one query's short documents (lognormal-30, d = 64-256), the headline and d = 64
    at lognormal-70 and heavy-512, 5 alternated rounds (about 2 minutes)."""
    from experiments.bench_dense_variants import SHORT_DOC_CELLS

    tests = ("tests/kernels/test_maxsim_dense.py", "tests/kernels/test_nan_policy.py")
    return [Step("flat-tests", (*PYTEST, *parallel_workers(), "-k", "flat", *tests), 100),
            Step("dense-flat", module("experiments.bench_dense_variants", "--cells",
                                      *SHORT_DOC_CELLS, "headline", "d64", "d64-heavy-512",
                                      "--variants", "flat documents", "loop per document",
                                      "--rounds", "5", "--out", str(work / "dense-flat")), 300)]


def remainder_chunk(work: Path, opts) -> list[Step]:
    """The GPU tests of the dense kernels (d's remainder chunk among them), then one query's
    default at a d past its whole chunks by a power of two beside the same launch with that
    remainder masked in a whole chunk and with the query held in the widest chunks, and the
    peers, 3 alternated rounds (about 4 minutes)."""
    from experiments.bench_dense_variants import REMAINDER_CELLS

    tests = ("tests/kernels/test_maxsim_dense.py", "tests/ops/test_dense.py")
    return [Step("dense-tests", (*PYTEST, *parallel_workers(), *tests), 150),
            Step("remainder-chunk", module("experiments.bench_dense_variants", "--cells",
                                           *REMAINDER_CELLS, "--variants", "masked remainder",
                                           "widest chunks", "--rounds", "3",
                                           "--out", str(work / "remainder-chunk")), 400)]


def slots_length(work: Path, opts) -> list[Step]:
    """The GPU tests of the slots kernel (its documents in order of length among them), then the
    dense default beside its slots in order of length or in the order given, 8 x 16 slots for
    every several-query launch, and the held query block, on the B >= 4 packed cells,
    3 alternated rounds (about 4 minutes)."""
    from experiments.bench_dense_variants import SEVERAL_QUERY_CELLS

    return [Step("slots-tests", (*PYTEST, *parallel_workers(), "tests/kernels/test_maxsim_dense.py",
                                 "-k", "slots or length or any_config"), 100),
            Step("slots-length", module("experiments.bench_dense_variants", "--cells",
                                        *SEVERAL_QUERY_CELLS, "--variants", "length order",
                                        "order given", "slots 8x16 by length",
                                        "held block",
                                        "--rounds", "3",
                                        "--out", str(work / "slots-length")), 420)]


def joined_tail(work: Path, opts) -> list[Step]:
    """The GPU tests of split queries and full query blocks, then the dense default beside a
    split query's tail in a launch of its own and beside the held block, on several queries of
    48 tokens (a 32-token head holding its 16-token tail), 3 alternated rounds; then the shape
    grid's B x Lq packed cells with the peers (about 6 minutes)."""
    from experiments.bench_dense_variants import JOINED_TAIL_CELLS

    return [Step("split-tests", (*PYTEST, *parallel_workers(), "tests/kernels/test_maxsim_dense.py",
                                 "-k", "split or tail or full_query_blocks"), 100),
            Step("joined-tail", module("experiments.bench_dense_variants", "--cells",
                                       *JOINED_TAIL_CELLS, "--variants", "tail apart",
                                       "held block", "--rounds", "3",
                                       "--out", str(work / "joined-tail")), 200),
            Step("grid-B-Lq", module("experiments.bench_grid", "--cells", "full", "--groups",
                                     "grid_B_Lq", "--budget", "200", "--no-plots",
                                     "--out", str(work / "grid-B-Lq")), 240)]


def stage4_table(work: Path, opts) -> list[Step]:
    """One query's centroid-score table past the budget: the op's default beside the budget
    alone (split by query rows, or centroid rows gathered) and, for a user's fp16 / bf16 / fp32
    query, beside its gathered rows; C = 2^18, 2^19 and 2^20, 32- and 64-token queries, the
    plugin's stage 4 in a search and a rerank, 2,000 / 12,000 / 100,000 candidates, 3 alternated
    rounds (about 6 minutes), after the GPU tests of the tables' rules and of stage 4."""
    return [Step("table-tests", (*PYTEST, *parallel_workers(), "tests/ops/test_residual.py",
                                 "tests/plaid/test_stage4_tables.py",
                                 "tests/experiments/test_bench_stage4_table.py"), 120),
            Step("stage4-table", module("experiments.bench_stage4_table", "--centroids",
                                        "262144", "524288", "1048576", "--query-lens", "32", "64",
                                        "--candidates", "2000", "12000", "100000",
                                        "--out", str(work / "stage4-table")), 400)]


def dense_ncu(work: Path, opts) -> list[Step]:
    """Nsight Compute on the dense op's default launches where the grid is below its targets
    beside the headline: one query of 64 tokens and 4 queries of 32 sharing the documents, the
    headline one query of 32 by the default and by flash-maxsim's packed kernel
    (profile_kernels ncu)."""
    return [Step("dense-ncu", module("experiments.profile_kernels", "ncu", "--ops", "dense,wide",
                                     "--only", "=packed,=flash_maxsim_packed,"
                                     "=packed B1 Lq64,=packed B4 Lq32",
                                     "--out", str(work / "dense-ncu")), 300)]


def grid_full(out: Path) -> Step:
    """The full shape grid with the peers, in one device call's budget, without plots (drawn
    on the CPU from the file)."""
    return Step("grid-full", module("experiments.bench_grid", "--cells", "full", "--budget", "535",
                                    "--no-plots", "--out", str(out)), 565)


def grid(work: Path, opts) -> list[Step]:
    """The dense sweeps over the cells below target in the last full grid (the sixth set), one
    query of 33-64 tokens and several queries, then the full shape grid with the peers
    (flash-maxsim and late-interaction-kernels as wheels; about 10 minutes, two device calls'
    worth: run the steps with --only)."""
    return [*(Step(f"sweep-{cells}", module("experiments.sweep_configs", "--cells", cells,
                                            "--budget", "120", "--out", str(work / f"sweep-{cells}")),
                   150) for cells in ("sixth", "wide", "multi")),
            grid_full(work / "grid-full")]


def predictions(work: Path, opts) -> list[Step]:
    """The open predictions of results/PERFORMANCE_LOG.md that one device call can check: the
    residual op's default beside its other kernel and dense on the decoded documents at
    C = 2^16 and 2^18 and the table's build (residual-mma, whose tests ran on an sm_90 card at
    the same commit's sources), and the flat walk's short-document cells (dense-flat, without
    its tests); about 4 minutes."""
    return [*(s for s in residual_mma(work, opts) if s.name != "residual-tests"),
            *(s for s in dense_flat(work, opts) if s.name != "flat-tests")]


def targets(work: Path, opts) -> list[Step]:
    """Issue 25's GPU targets in one run: the full shape grid with the peers, residual codes at
    C = 2^16 and 2^18 beside dense on the decoded documents, the plugin's stage 4 over 100k
    candidates at C = 2^18, and validate=True against validate=False for every op. Two device
    calls on one warm machine with --only: grid-full, then the other steps, grid-rest last
    (the grid's cells the first call's budget left: many on a slow host, run 215). Then
    ``python -m experiments.targets`` over the second bundle unpacked reads the table of
    targets, the grid's two parts merged."""
    return [grid_full(GRID_PARTS / "grid-full"),
            # These three fit one call's budget (results/targets/h100-5826ecd/steps.txt).
            Step("residual-scale", module("experiments.bench_residual_scale",
                                          "--out", str(work / "residual-scale")), 170),
            Step("rerank-c18", module("experiments.profile_rerank", "--sizes", "100000",
                                       "--num-docs", "1000000", "--num-centroids", "262144"), 150),
            Step("bench-validate", module("experiments.bench_validate",
                                          "--out", str(work / "validate")), 240),
            Step("grid-rest", module("experiments.bench_grid", "--cells", "full", "--budget",
                                     "280", "--no-plots", "--skip-done",
                                     str(GRID_PARTS / "grid-full"),
                                     "--out", str(GRID_PARTS / "grid-rest")), 300)]


# The last full shape grid: profile-batched takes its lowest B >= 4 cells.
BATCHED_GRID = "results/grid/h100-f460491-full/grid.json"


def profile_batched(work: Path, opts) -> list[Step]:
    """The B >= 4 packed cells lowest by % of their roof in the last full grid: their FLOPs and
    bytes against the ceilings measured in the run, then Nsight Compute on each cell's scoring
    launches (kernel replay, the scoring kernels only) and the units each one saturates."""
    out = work / "profile-batched"
    cells = ("--grid", BATCHED_GRID)
    return [Step("batched-time", module("experiments.profile_batched", "time", *cells,
                                        "--out", str(out)), 80),
            Step("batched-ncu", module("experiments.profile_batched", "ncu", *cells,
                                       "--out", str(out)), 130),
            Step("batched-summary", module("experiments.profile_batched", "summarize",
                                           str(out / "ncu.csv"), "--launches",
                                           str(out / "profile_launches.json"),
                                           "--out", str(out)), 20)]


def json_rows(filename: str, keep: Callable[[dict], bool]) -> Callable[[Path, Path], list[dict]]:
    """Reader of a benchmark's result file: the rows that ``keep`` selects."""
    def read(out: Path, log: Path) -> list[dict]:
        path = out / filename
        return [row for row in json.loads(path.read_text())["rows"] if keep(row)] if path.exists() else []
    return read


def rerank_rows(out: Path, log: Path) -> list[dict]:
    """profile_rerank's first line per size: ``== N candidates, products P: X ms from Python, ...``."""
    text = log.read_text() if log.exists() else ""
    return [{"shape": f"rerank {size} candidates ({products})", "provider": "tilemaxsim", "ms": float(ms)}
            for size, products, ms in re.findall(r"^== (\d+) candidates, products (\S+): ([\d.]+) ms", text, re.M)]


# Headline rows per benchmark of before-after: its command and how its rows are read. The PLAID
# row is the plugin's stage 4 (``backends.exact_scores``, what ``rank(pids=...)`` runs) on a random
# 1M-document index: it needs neither colbert-ai nor a prepared bundle on the GPU machine.
HEADLINES = {
    "dense": (lambda out: bench_dense(out, providers="tilemaxsim"),
              json_rows("dense.json", lambda row: row["provider"] == "tilemaxsim"
                        and row.get("sweep", "main") == "main")),
    "compressed": (bench_compressed,
                   json_rows("bench_compressed.json", lambda row: row["suite"] == "compressed"
                             and row["provider"].startswith("tilemaxsim"))),
    "rerank": (lambda out: module("experiments.profile_rerank", "--sizes", "100000", "--num-docs", "1000000"),
               rerank_rows),
}
# Caps per run, above what each took on an H200; the suite's --budget bounds the six together.
HEADLINE_LIMITS = {"dense": 90, "compressed": 120, "rerank": 120}
TOLERANCE = 0.03  # before and after must agree within 3 % (issue 24)


def before_after(work: Path, opts) -> list[Step]:
    trees = {"before": (ROOT / opts.before).resolve(), "after": ROOT}
    steps = []
    for r in range(1, opts.rounds + 1):
        for bench, (command, _) in HEADLINES.items():
            for tree, root in trees.items():
                steps.append(Step(f"{bench}-{tree}-{r}", command(work / tree / f"{bench}{r}"),
                                  HEADLINE_LIMITS[bench], cwd=root))
    return steps


def compare(work: Path, opts) -> str:
    """before ms, after ms (medians over rounds) and after/before for every headline row."""
    times: dict[tuple, dict[str, list[float]]] = {}
    for bench, (_, read) in HEADLINES.items():
        for tree in ("before", "after"):
            for r in range(1, opts.rounds + 1):
                for row in read(work / tree / f"{bench}{r}", work / f"{bench}-{tree}-{r}.log"):
                    if isinstance(row.get("ms"), (int, float)):
                        key = (bench, row["shape"], row["provider"])
                        times.setdefault(key, {}).setdefault(tree, []).append(row["ms"])
    lines = [f"{'bench':<11} {'row':<52} {'before ms':>10} {'after ms':>10} {'ratio':>7}"]
    for (bench, shape, provider), by_tree in times.items():
        before = statistics.median(by_tree["before"]) if "before" in by_tree else None
        after = statistics.median(by_tree["after"]) if "after" in by_tree else None
        cells = [f"{v:>10.4f}" if v is not None else f"{'-':>10}" for v in (before, after)]
        ratio = after / before if before and after else None
        flag = "  > 3 %" if ratio and abs(ratio - 1) > TOLERANCE else ""
        lines.append(f"{bench:<11} {(shape + ' ' + provider)[:52]:<52} {cells[0]} {cells[1]} "
                     + (f"{ratio:>7.3f}{flag}" if ratio else f"{'-':>7}"))
    return "\n".join(lines) if times else "no headline rows were written"


SUITES = {
    "kernels": Suite("dense kernel tests, dense benchmark main shapes", kernels),
    "compressed": Suite("residual/PQ kernel and codec tests, bench_compressed main rows", compressed),
    "plaid": Suite("search-path kernel tests, end-to-end PLAID (stock vs patched, rerank, "
                   "equivalence)", plaid, needs=("runs/plaid_bench",)),
    "reproduce": Suite("reproduction runner: wiki-vital-h200 search, synthetic-scale main conditions",
                       reproduce_gpu, needs=("runs/wvgpu",),
                       collect=("runs/wvgpu/wiki-vital-h200/results", "runs/syngpu/synthetic-scale/results")),
    "reproduce-d384": Suite("reproduction runner: wiki-vital-h200-d384 search", lambda work, opts: [
        Step("reproduce-d384", reproduce("wiki-vital-h200-d384", "search", "runs/wv384gpu"), 540)],
        needs=("runs/wv384gpu",), collect=("runs/wv384gpu/wiki-vital-h200-d384/results",)),
    "reproduce-lengths": Suite("reproduction runner: synthetic-scale length-32/64/128", lambda work, opts: [
        Step("reproduce-lengths", reproduce("synthetic-scale", "prepare,search", "runs/synlen",
                                            "length-32,length-64,length-128"), 540)],
        collect=("runs/synlen/synthetic-scale/results",)),
    "equivalence": Suite("per-query candidates and top-k, fused kernels vs colbert-ai (wiki-vital-h200)",
                         lambda work, opts: [Step("equivalence", module(
                             "experiments.equivalence", "configs/wiki-vital-h200.yaml", "--condition",
                             "d128-k10", "--ks", "10", "100", "1000", "--runs", "runs/wvgpu",
                             "--out", str(work / "equivalence"), "--device", "cuda"), 540)],
                         needs=("runs/wvgpu",)),
    "distributed": Suite("sharded search from 1 GPU to all of them (run on 2+ GPUs)", lambda work, opts: [
        Step("bench-distributed", (PY, "-m", "torch.distributed.run", "--nproc-per-node=gpu",
                                   "-m", "experiments.bench_distributed", "--residual-size", "8GiB",
                                   "--out", str(work / "distributed")), 400)]),
    "engines": Suite("stock colbert-ai, the plugin and fast-plaid on one index, 100k and 1M passages "
                     "(fast-plaid and its needs as wheels)", engines),
    "engines-extra": Suite("index build times at 100k passages, and the three engines on wiki-vital "
                           "embeddings encoded on the GPU (carry .wiki_bundle; the encode step and "
                           "the wheels may need separate calls on one warm machine: use --only)",
                           engines_extra),
    "engines-msmarco": Suite("the three engines at MS MARCO's size, 8.8M passages (two device calls' "
                             "worth: run the steps with --only in two calls on one warm machine)",
                             engines_msmarco),
    "residual-caps": Suite("the residual op's default launch under register caps 104 / 112 / 128 and "
                           "none, nbits 1 / 2 / 4, beside dense on the decoded documents",
                           residual_caps),
    "residual-decoders": Suite("GPU tests of the permute decoder, codes a tile ahead, the "
                               "running max and PQ decode; the residual op's default launch with "
                               "the pair and permute decoders, each with and without codes a tile "
                               "ahead, nbits 1 / 2 / 4, beside dense on the decoded documents",
                               residual_decoders),
    "residual-mma": Suite("GPU tests of the residual kernels; the residual op's default beside its "
                          "other kernel (Triton launch, mma kernel) and dense on the decoded "
                          "documents, C = 2^16 and 2^18, nbits 2 / 4; the centroid-score "
                          "table's build by tile", residual_mma),
    "residual-ncu": Suite("Nsight Compute on the residual op's Triton default and mma kernel, "
                          "nbits 2 / 4: units, stall reasons, the SASS instructions warps wait on",
                          residual_ncu),
    "dense-ncu": Suite("Nsight Compute on the dense default at one query of 32 and 64 tokens "
                       "and 4 queries, beside flash-maxsim: units, stall reasons, SASS waits",
                       dense_ncu),
    "dense-rows": Suite("GPU tests of the dense kernels; the dense default beside the same "
                        "launches with rows past a document's end masked and repeated and with "
                        "documents walked as one loop, alternated", dense_rows),
    "dense-flat": Suite("GPU tests of the flat walk; the dense default beside documents walked "
                        "as one loop and a loop per document, short documents", dense_flat),
    "peer-roof": Suite("the read-roof cells where a peer was faster on an H100: the dense "
                       "config sweep over them, then the default beside the peers in 5 "
                       "alternated rounds", peer_roof),
    "remainder-chunk": Suite("GPU tests of the dense kernels; one query's default at d past its "
                             "whole chunks by a power of two beside that remainder masked and "
                             "the widest chunks, and the peers, 3 alternated rounds",
                             remainder_chunk),
    "slots-length": Suite("GPU tests of the slots kernel; the dense default beside its slots in "
                          "order of length or not, 8 x 16 slots and the held block, "
                          "B >= 4 packed", slots_length),
    "joined-tail": Suite("GPU tests of split queries; the dense default beside a split query's "
                         "tail in its own launch and the held block, B >= 4, Lq = 48; the grid's "
                         "B x Lq packed cells", joined_tail),
    "stage4-table": Suite("one query's centroid-score table past the budget, whole (the "
                          "default) beside split by query rows or gathered, C = 2^18-2^20, "
                          "2k-100k candidates",
                          stage4_table),
    "predictions": Suite("the log's open predictions in one call: residual-mma and dense-flat "
                         "without their tests", predictions),
    "variants": Suite("the dense default beside its row-offset variants and the peers, alternated; "
                      "residual codes at C = 2^16 and 2^18", variants),
    "validate": Suite("GPU tests of the ops' host checks; validate=True against validate=False for "
                      "every op at 100k documents, alternated", validate),
    "new-offsets": Suite("GPU tests of offsets judged after the launch; maxsim_packed's and "
                         "maxsim_pq's validate=True against validate=False for --before and "
                         "this tree",
                         new_offsets, needs=("{before}/tilemaxsim_plaid", "{before}/experiments")),
    "grid": Suite("dense sweeps over the last grid's cells below target, then the full shape "
                  "grid with the peers", grid),
    "profile-search": Suite("the plugin's search graph kernel by kernel, random indexes of 8.8M and "
                            "100k passages", profile_search),
    "targets": Suite("issue 25's GPU targets in one run (grid, residual C = 2^16 / 2^18, the "
                     "plugin's 2^18 rerank, validate); two calls with --only on one machine, "
                     "then experiments.targets over the second bundle",
                     targets, collect=(str(GRID_PARTS),)),
    "profile-batched": Suite("the last grid's lowest B >= 4 packed cells on the roofline, then "
                             "Nsight Compute on their scoring launches: which unit each saturates",
                             profile_batched),
    "before-after": Suite("headline rows of dense, compressed and the plugin's rerank for --before and "
                          "this tree, alternated", before_after, report=compare,
                          needs=("{before}/tilemaxsim_plaid", "{before}/experiments")),
}


# --------------------------------------------------------------------------- runner
def tree_commit(root: Path) -> str:
    """The commit a tree was copied from: its .device_commit (the device's .git may be older than
    the tree it runs), else git's HEAD, else 'unknown'."""
    marker = root / ".device_commit"
    if marker.exists():
        return marker.read_text().strip()
    if not (root / ".git").exists():  # a tree unpacked inside another checkout has no history of its own
        return "unknown"
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def wheel_step(root: Path = ROOT) -> list[Step]:
    wheels = sorted(str(p) for p in (root / ".whl").glob("*.whl"))
    if not wheels:
        return []
    return [Step("wheels", (PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--upgrade", "--target", SITE, *wheels), 120)]


def step_env(step: Step, site: bool) -> dict[str, str]:
    """The variables a step runs with beyond the runner's own: its tree first on the path, and
    that tree's commit for the benchmarks' provenance (experiments/harness.py reads it)."""
    path = f"{SITE}:{step.cwd}" if site else str(step.cwd)
    return {**BASE_ENV, "PYTHONPATH": path, "TILEMAXSIM_COMMIT": tree_commit(step.cwd)}


def command_text(steps: list[Step], site: bool) -> str:
    lines = ["# " + " ".join(f"{k}={v}" for k, v in BASE_ENV.items())]
    for step in steps:
        extra = {k: v for k, v in step_env(step, site).items() if k not in BASE_ENV}
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
        lines += [f"# {step.name} (limit {step.timeout:.0f} s)",
                  f"cd {shlex.quote(str(step.cwd))} && {env} {shlex.join(step.argv)}"]
    return "\n".join(lines) + "\n"


# Run in a child with the steps' environment, so that the runner holds no CUDA context itself.
PROBE = ("import json, torch, triton; print(json.dumps({'torch': torch.__version__, "
         "'triton': triton.__version__, 'cuda': torch.version.cuda, 'gpu_count': torch.cuda.device_count(), "
         "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (CPU)'}))")


def provenance(suite: str, steps: list[Step], site: bool) -> dict:
    trees = sorted({s.cwd for s in steps} | {ROOT})
    info = {"suite": suite, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv, "python": sys.version.split()[0],
            "commit": tree_commit(ROOT), "commits": {str(root): tree_commit(root) for root in trees}}
    env = {**os.environ, **step_env(Step("probe", (), 0), site)}
    try:
        probe = subprocess.run([PY, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
        info.update(json.loads(probe.stdout) if probe.returncode == 0 else {"probe_error": probe.stderr[-2000:]})
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:  # provenance never stops a suite
        info["probe_error"] = f"{type(exc).__name__}: {exc}"
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip().splitlines()
    return info


def kill_group(proc: subprocess.Popen) -> None:
    """End the step's process group (only what the step started): TERM, 10 s, then KILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_step(step: Step, log: Path, limit: float, env: dict[str, str]) -> int:
    """Run one step in its own process group, teeing its output to ``log`` and stdout; kill the
    group at ``limit`` seconds and return TIMEOUT_RC then."""
    with open(log, "w") as fh:
        try:
            proc = subprocess.Popen(step.argv, cwd=step.cwd, env={**os.environ, **env}, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace",
                                    start_new_session=True)
        except OSError as exc:
            fh.write(f"could not start: {exc}\n")
            return 127

        def pump():
            for line in proc.stdout:
                fh.write(line)
                sys.stdout.write(f"[{step.name}] {line}")
                sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = TIMEOUT_RC
        kill_group(proc)  # at the limit, and any background process a finished step left behind
        reader.join(timeout=10)
        if rc == TIMEOUT_RC:
            fh.write(f"\nkilled at its {limit:.0f} s limit\n")
    return rc


def run_suite(suite: str, steps: list[Step], work: Path, bundle: Path, *, budget: float = DEFAULT_BUDGET_S,
              collect: tuple[str, ...] = (), report=None) -> int:
    """Run ``steps`` into ``work`` within ``budget`` seconds, bundle ``work`` (and ``collect``) into
    ``bundle``; return 0 if every step exited 0, else 1."""
    start = time.monotonic()
    asked = sum(step.timeout for step in steps)
    if asked > budget:
        print(f"the steps' limits add up to {asked:.0f} s; the {budget:.0f} s budget may cut the "
              f"later ones short", flush=True)
    work.mkdir(parents=True, exist_ok=True)
    site = any(s.name == "wheels" for s in steps)
    (work / "commands.txt").write_text(command_text(steps, site))
    (work / "provenance.json").write_text(json.dumps(provenance(suite, steps, site), indent=1))
    results = []
    for step in steps:
        left = budget - (time.monotonic() - start)
        if left < MIN_STEP_S:
            print(f"{step.name}: skipped, the suite's {budget:.0f} s budget is spent", flush=True)
            results.append((step.name, "skipped", None, 0.0, step.timeout))
            continue
        limit = min(step.timeout, left)
        t0 = time.monotonic()
        rc = run_step(step, work / f"{step.name}.log", limit, step_env(step, site))
        status = "ok" if rc == 0 else "timeout" if rc == TIMEOUT_RC else "failed"
        results.append((step.name, status, rc, time.monotonic() - t0, limit))
    lines = [f"{name:<24} {status:<8} rc={rc} {secs:.0f} s (limit {limit:.0f} s)"
             for name, status, rc, secs, limit in results]
    text = "\n".join(lines)
    if report is not None:
        text += "\n\n" + report(work)
    (work / "steps.txt").write_text(text + "\n")
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(work, arcname=suite)
        for path in collect:
            if (ROOT / path).exists():
                name = Path(path).name if Path(path).is_absolute() else path
                tar.add(ROOT / path, arcname=f"{suite}/collected/{name}")
    print(f"\n{text}\nbundle: {bundle}", flush=True)
    return 0 if all(status == "ok" for _, status, *_ in results) else 1


def suite_steps(name: str, work: Path, opts) -> list[Step]:
    steps = wheel_step() + SUITES[name].build(work, opts)
    if opts.only:
        patterns = opts.only.split(",")
        steps = [s for s in steps if s.name == "wheels" or any(fnmatch.fnmatch(s.name, p) for p in patterns)]
    return steps


def suite_needs(name: str, opts) -> list[str]:
    return [path.format(before=opts.before) for path in SUITES[name].needs]


def list_suites() -> str:
    opts = argparse.Namespace(before=".before", rounds=1, only=None)
    lines = [f"{'suite':<18} {'limits':>7}  what it measures (a call stops at --budget, "
             f"default {DEFAULT_BUDGET_S} s)"]
    for name, suite in SUITES.items():
        steps = suite.build(Path("$WORK"), opts)
        needs = suite_needs(name, opts)
        lines.append(f"{name:<18} {sum(s.timeout for s in steps):>5.0f} s  {suite.what}"
                     + (f"\n{'':<27}carry: {' '.join(needs)}" if needs else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu_suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", choices=sorted(SUITES))
    parser.add_argument("--list", action="store_true", help="print the suites and what they measure")
    parser.add_argument("--dry-run", action="store_true", help="print the suite's commands, run nothing")
    parser.add_argument("--out", default=os.environ.get("OUT", "results/gpu"),
                        help="where the bundle goes (default: $OUT, else results/gpu)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all steps")
    parser.add_argument("--only", help="comma-separated glob patterns of step names to keep")
    parser.add_argument("--before", default=".before", help="before-after: the older tree")
    parser.add_argument("--rounds", type=int, default=1, help="before-after: (before, after) rounds")
    opts = parser.parse_args(argv)
    if opts.list:
        print(list_suites())
        return 0
    if opts.name is None:
        parser.error("name a suite, or --list")
    if opts.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {opts.rounds}")
    suite = SUITES[opts.name]
    needs = suite_needs(opts.name, opts)
    if opts.dry_run:
        steps = suite_steps(opts.name, Path("$WORK"), opts)
        print(command_text(steps, any(s.name == "wheels" for s in steps)), end="")
        return 0
    before = (ROOT / opts.before).resolve()
    if not any(s.cwd == before for s in suite_steps(opts.name, Path("$WORK"), opts)):
        # The steps kept by --only run in this tree alone: the older one need not be carried.
        needs = [path for path in needs if not (ROOT / path).resolve().is_relative_to(before)]
    missing = [path for path in needs if not (ROOT / path).exists()]
    if missing:
        for path in missing:
            print(f"missing {path}: make it on a CPU machine and carry it with the call"
                  + (f" ({PREPARED[path]})" if path in PREPARED else ""), file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix=f"gpu_suite-{opts.name}-"))
    steps = suite_steps(opts.name, work, opts)
    report = (lambda w: suite.report(w, opts)) if suite.report else None
    try:
        return run_suite(opts.name, steps, work, Path(opts.out) / f"gpu-{opts.name}.tar.gz",
                         budget=opts.budget, collect=suite.collect, report=report)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the bundle holds all of it


if __name__ == "__main__":
    sys.exit(main())
