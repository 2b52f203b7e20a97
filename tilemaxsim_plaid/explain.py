"""``tilemaxsim explain``: which path each public op and each PLAID stage takes here, and why.

Every answer is read from the function that makes the decision at call time (the environment
readers, ``backend_for``, the ops' default-config functions, ``resolved_products``, the CUDA
paths' ``reasons_not_to_apply``), evaluated for this machine, its ``TILEMAXSIM_PLAID_*``
variables and, with ``--index``, the centroid count, nbits and dimension of a PLAID index on
disk. Where the code makes a decision inline, with no side-effect-free function to ask, the
report restates the rule and lists it under ``restated``, so a reader knows which answers could
drift from the code.

Exit status 2 with one line on stderr for a bad variable value or a bad argument (``--index``,
``--device``, ``--query-tokens``).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.metadata
import json
import os
import sys
import types

import torch

from tilemaxsim_plaid.plaid import environment, graphs
from tilemaxsim_plaid.plaid.scoring import PROFILER_RANGES

__all__ = ["explain", "format_report", "main", "read_index"]

ENV_PREFIX = "TILEMAXSIM_PLAID_"
# The reader of each variable; the device-dependent one is bound per report.
_READERS = {
    environment.DISABLE_ENV_VAR: lambda device: environment.plugin_disabled(),
    environment.BACKEND_ENV_VAR: environment.backend_for,
    environment.PRODUCTS_ENV_VAR: lambda device: environment.stage_4_products(),
    environment.GRAPHS_ENV_VAR: lambda device: environment.cuda_graphs_allowed(),
}
# Document counts the ops' default configs are shown for: a PLAID search's stage 4 (at most
# ndocs // 4 = 1,024 candidates at the k = 1000 defaults), and a large rerank.
FEW_DOCS, MANY_DOCS = 1024, 1 << 20
# Padded documents are shown at this length when no index gives its longest document.
PADDED_DOC_TOKENS = 128
# Packed documents are shown at this mean length (MS MARCO passages' average) when no index
# gives its own: one query's default over many of them depends on it and on the card.
MEAN_DOC_TOKENS = 70


@dataclasses.dataclass(frozen=True)
class IndexFacts:
    """What the decisions read of a PLAID index on disk (colbert-ai's files)."""

    path: str
    num_centroids: int
    nbits: int
    dim: int
    num_documents: int
    max_doclen: int
    bucket_weights: tuple[float, ...]
    mean_doclen: float | None = None


def read_index(path: str) -> IndexFacts:
    """C, nbits, dim and the document lengths of the colbert-ai index at ``path``.

    Raises:
        ValueError naming --index when a file is missing or unreadable.
    """
    def need(name):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise ValueError(f"--index {path}: no {name} (not a colbert-ai index directory)")
        return file

    try:
        with open(need("metadata.json"), encoding="utf-8") as f:
            config = json.load(f)["config"]
        centroids = torch.load(need("centroids.pt"), map_location="cpu", weights_only=True,
                               mmap=True)
        _, bucket_weights = torch.load(need("buckets.pt"), map_location="cpu", weights_only=True)
        doclens = []
        for file in sorted(glob.glob(os.path.join(path, "doclens.*.json"))):
            with open(file, encoding="utf-8") as f:
                doclens += json.load(f)
        nbits, dim = int(config["nbits"]), int(config["dim"])
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as error:
        if isinstance(error, ValueError) and str(error).startswith("--index"):
            raise
        raise ValueError(f"--index {path}: unreadable ({type(error).__name__}: {error})") from None
    return IndexFacts(path=path, num_centroids=int(centroids.shape[0]), nbits=nbits, dim=dim,
                      num_documents=len(doclens), max_doclen=max(doclens, default=0),
                      bucket_weights=tuple(float(w) for w in bucket_weights.float().tolist()),
                      mean_doclen=sum(doclens) / len(doclens) if doclens else None)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _machine(device: torch.device) -> dict:
    from tilemaxsim_plaid.ops import nvrtc
    from tilemaxsim_plaid.ops.launch import interpreting
    from tilemaxsim_plaid.plaid.registry import SUPPORTED_COLBERT_VERSIONS, colbert_version

    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(), "device": str(device),
             "triton": _version("triton"),
             "triton_interpreter": interpreting(),
             "nvrtc": nvrtc.available(),
             "colbert_ai": colbert_version(),
             "colbert_ai_supported": list(SUPPORTED_COLBERT_VERSIONS),
             "tilemaxsim_plaid": _version("tilemaxsim-plaid")}
    if device.type == "cuda":
        from tilemaxsim_plaid.ops.launch import memory_bandwidth

        major, minor = torch.cuda.get_device_capability(device)
        facts["gpu"] = f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"
        bandwidth = memory_bandwidth(device)
        facts["memory_bandwidth"] = f"{bandwidth / 1e12:.2f} TB/s" if bandwidth else None
    return facts


def _environment(device: torch.device) -> dict:
    """Each variable's raw and validated value; raises ValueError on the first bad one."""
    values = {name: {"set": os.environ.get(name), "value": read(device)}
              for name, read in _READERS.items()}
    unknown = sorted(n for n in os.environ if n.startswith(ENV_PREFIX) and n not in _READERS)
    return {"variables": values, "unknown": unknown}


def _triton_runs(device: torch.device) -> tuple[bool, str]:
    """(the Triton kernels run on ``device``, why)."""
    from tilemaxsim_plaid.ops.launch import interpreting

    from tilemaxsim_plaid.triton_support import triton_problem

    problem = triton_problem()
    if problem is not None:
        return False, problem
    if device.type == "cuda":
        return True, "Triton kernels compiled for this GPU"
    if interpreting():
        return True, ("TRITON_INTERPRET=1: the Triton kernels run in the CPU interpreter "
                      "(exact, for tests; far slower than the torch reference)")
    return False, ("no CUDA GPU and TRITON_INTERPRET is not 1: the Triton kernels need a GPU "
                   "(on the CPU they run only in the interpreter, for tests); "
                   "tilemaxsim_plaid.reference has each op in plain torch")


def _non_defaults(config) -> str:
    """``Name(field=value, ...)`` with only the fields that differ from the class defaults."""
    default = type(config)()
    fields = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
              if getattr(config, f.name) != getattr(default, f.name)]
    return f"{type(config).__name__}({', '.join(fields)})"


def _ops(device: torch.device, lq: int, index: IndexFacts | None, restated: list) -> dict:
    runs, why = _triton_runs(device)
    if not runs:
        return {op: {"path": "unavailable", "why": why}
                for op in ("maxsim_packed", "maxsim_padded", "maxsim_residual", "maxsim_pq")}
    from tilemaxsim_plaid.ops import (dense, launch, nvrtc, pq, pq_lut_shared, pq_mma, residual,
                                      residual_mma)

    dim = index.dim if index else 128
    half, single = 2, 4  # bytes per query element: fp16/bf16, fp32
    ops = {}
    mean = index.mean_doclen if index and index.mean_doclen else MEAN_DOC_TOKENS
    many = f">= {dense.MANY_DOCS:,} docs of {mean:.0f} tokens on average"
    packed = {name: _non_defaults(dense.default_config(
        1, lq, None, dim, variable_lengths=True, num_docs=docs, element_size=size,
        mean_tokens=mean, read_bandwidth=launch.memory_bandwidth(device)))
        for name, docs, size in (("fp16, 1,024 docs", FEW_DOCS, half),
                                 (f"fp16, {many}", MANY_DOCS, half),
                                 (f"fp32, {many}", MANY_DOCS, single))}
    ops["maxsim_packed"] = {"path": "Triton dense kernel over the packed layout", "why": why,
                            "default_config": packed}
    doc_tokens = index.max_doclen if index else PADDED_DOC_TOKENS
    ops["maxsim_padded"] = {
        "path": "Triton dense kernel over padded documents", "why": why,
        "default_config": {f"documents of {doc_tokens} tokens": _non_defaults(dense.default_config(
            1, lq, doc_tokens, dim, num_docs=FEW_DOCS))}}
    configs = {name: _non_defaults(residual.default_residual_config(
        1, lq, split, docs, size, half_table=size == half))
        for name, split, docs, size in (
            ("fp16, 1,024 docs", False, FEW_DOCS, half),
            (f"fp16, >= {residual.MANY_DOCS:,} docs", False, MANY_DOCS, half),
            (f"fp32 split_query, >= {residual.MANY_DOCS:,} docs", True, MANY_DOCS, single),
            ("fp32 (tf32x3)", False, MANY_DOCS, single))}
    # The mma kernel: fp16 queries at the index's d and nbits (else d = 128, nbits = 2), at its C
    # (else the two C the log measures), where at least residual.MANY_DOCS documents are scored.
    nbits = index.nbits if index else 2
    Q3 = torch.empty(1, lq, dim, dtype=torch.float16, device=device)
    rows = torch.empty(1, dim * nbits // 8, dtype=torch.uint8, device=device)
    codes, norms = (torch.empty(1, dtype=t, device=device) for t in (torch.int32, torch.float32))
    mma_reasons = residual_mma.reasons_not_to_apply(
        Q3, codes, rows, nbits, norms, torch.empty(1, dim, device="meta"))
    if nbits in residual_mma.NBITS and nbits not in residual.MMA_NBITS:
        mma_reasons.append(f"nbits in {residual.MMA_NBITS} to be the default")
    if not nvrtc.available():
        mma_reasons.append("NVRTC (it comes with PyTorch's CUDA builds)")
    entry = {"path": "Triton fused residual kernel (decoded in registers)"
                     + (f"; mma from {residual.MANY_DOCS:,} documents" if not mma_reasons else ""),
             "why": why, "default_config": configs,
             "mma": "applies" if not mma_reasons else "needs " + "; ".join(mma_reasons)}
    if not mma_reasons:
        for C in (index.num_centroids,) if index else (1 << 16, 1 << 18):
            hints = residual_mma.takes_l2_hints(Q3, torch.empty(C, dim, device="meta"))
            configs[f"fp16 nbits {nbits}, C = {C:,}, >= {residual.MANY_DOCS:,} docs"] = (
                f"mma (CUDA C++ by NVRTC, {_non_defaults(residual.mma_default(hints))})")
        restated.append("maxsim_residual: config=None takes mma_default from MANY_DOCS documents "
                        "where the mma kernel applies (inline in ops/residual.maxsim_residual)")
    restated.append("maxsim_residual: a default decode='permute' becomes 'pairs' where byte "
                    "permutes do not apply (inline in ops/residual._launch_kernel)")
    ops["maxsim_residual"] = entry
    # maxsim_pq is shown at the one shape its mma kernel serves.
    pq_dim, m, sub_dim = pq_mma.DIM, pq_mma.NUM_SUBQUANTIZERS, pq_mma.SUB_DIM
    Q3 = torch.empty(1, lq, pq_dim, dtype=torch.float16, device=device)
    codes = torch.empty(0, m, dtype=torch.uint8, device=device)
    books = torch.empty(m, pq.CODEBOOK_SIZE, sub_dim, dtype=torch.float16, device=device)
    mma_reasons = pq_mma.reasons_not_to_apply(Q3, codes, books, None, None)
    if not nvrtc.available():
        mma_reasons.append("NVRTC (it comes with PyTorch's CUDA builds)")
    lut_reasons = pq_lut_shared.reasons_not_to_apply(Q3, m, pq.PQConfig().lut_rows)
    restated.append(f"maxsim_pq: config=None takes mma from {pq.MANY_DOCS:,} documents where it "
                    "applies (inline in ops/pq.maxsim_pq)")
    many = (f"mma (CUDA C++ by NVRTC, {_non_defaults(pq.MMA_DEFAULT)})" if not mma_reasons else
            _non_defaults(pq.default_pq_config(1, lq, MANY_DOCS, half, m, sub_dim)))
    ops["maxsim_pq"] = {
        "path": "Triton decode kernel" + (f"; mma from {pq.MANY_DOCS:,} documents"
                                          if not mma_reasons else ""),
        "why": why,
        "default_config": {
            f"fp16, d={pq_dim} as M={m}, 1,024 docs": _non_defaults(
                pq.default_pq_config(1, lq, FEW_DOCS, half, m, sub_dim)),
            f"fp16, d={pq_dim} as M={m}, >= {pq.MANY_DOCS:,} docs": many},
        "mma": "applies" if not mma_reasons else "needs " + "; ".join(mma_reasons),
        "lut_shared": ("applies (scoring='lut')" if not lut_reasons
                       else "needs " + "; ".join(lut_reasons) + ": scoring='lut' reads its "
                       "tables through L1 (Triton)"),
    }
    return ops


def _index_like(device: torch.device, index: IndexFacts, backend: str, restated: list):
    """What ``resolved_products`` and ``capturable`` read of a DeviceIndex, from the files."""
    weights = torch.tensor(index.bucket_weights, dtype=torch.float32)
    restated.append("bucket_weights_in_fp16: colbert-ai's GPU codec holds the weights in fp16; "
                    "else whether each saved weight is an fp16 value (plaid/device_index._build)")
    return types.SimpleNamespace(
        device=device, dim=index.dim, nbits=index.nbits,
        centroids=torch.empty(index.num_centroids, index.dim, device="meta"),
        # The Triton backend always precomputes per-token inverse norms (unsharded index).
        inv_norms=True if backend == "triton" else None,
        bucket_weights_in_fp16=device.type == "cuda" or bool(torch.equal(weights.half().float(),
                                                                          weights)))


def _plaid(device: torch.device, lq: int, index: IndexFacts | None, restated: list) -> dict:
    from tilemaxsim_plaid.plaid import backends

    backend = environment.backend_for(device)
    chosen = os.environ.get(environment.BACKEND_ENV_VAR, "").strip()
    backend_why = (f"{environment.BACKEND_ENV_VAR}={backend}" if chosen
                   else f"default for an index on {device.type}")
    triton = backend == "triton"
    runs, triton_why = _triton_runs(device)
    if triton and not runs:
        backend_why += f"; but {triton_why}: a search would fail"
    stages = {}
    r_centroid, r_candidates, r_interaction, r_exact, r_sort, r_graph, r_transfer = (
        PROFILER_RANGES)
    if device.type == "cuda" and not backends.cublas_fp32_is_exact():
        stages[r_centroid] = {"path": "ops.residual.query_centroid_scores (tf32x3 Triton kernel)",
                              "why": "torch lets cuBLAS multiply fp32 as TF32, which would round "
                                     "every exact score"}
    else:
        stages[r_centroid] = {"path": "centroids @ Q.T in fp32 (torch matmul)",
                              "why": "cuBLAS multiplies fp32 in fp32" if device.type == "cuda"
                              else "CPU BLAS, fp32"}
    restated.append("centroid scores: the TF32 check is inline in plaid/backends.centroid_table")
    stages[r_candidates] = (
        {"path": "ops.ivf.mark_probed_documents (Triton) and a fixed-capacity nonzero",
         "why": f"backend triton ({backend_why})"} if triton else
        {"path": "torch: every probed list padded to the longest, index_fill_ into a bitmap",
         "why": f"backend torch ({backend_why})"})
    sort_rule = ("one Triton program sorts lists of up to ops.sort.MAX_SORTED_IN_ONE_PROGRAM "
                 "slots (ties by pid), torch.sort/topk longer ones")
    stages[r_interaction] = (
        {"path": "ops.centroid.centroid_interaction (fused Triton kernel), twice; cuts: "
                 + sort_rule, "why": f"backend triton ({backend_why})"} if triton else
        {"path": "reference.centroid_interaction in fp32 torch, twice; cuts: torch.topk",
         "why": f"backend torch ({backend_why})"})
    stages[r_exact] = _stage_4(device, lq, index, backend, backend_why, restated)
    stages[r_sort] = ({"path": sort_rule, "why": f"backend triton ({backend_why})"} if triton else
                      {"path": "torch.sort", "why": f"backend torch ({backend_why})"})
    if triton:
        restated.append("sort and cuts: the one-program rule is "
                        "plaid/backends.sorts_in_one_program")
    capturable = graphs.capturable(types.SimpleNamespace(device=device))
    if capturable:
        graph_why = (f"a GPU index on the Triton backend, {environment.GRAPHS_ENV_VAR} not off: "
                     "searches without filter_fn, pids= or sharding replay one graph per "
                     "(settings, query length)")
    elif device.type != "cuda":
        graph_why = "CUDA graphs need a GPU"
    elif not environment.cuda_graphs_allowed():
        graph_why = f"{environment.GRAPHS_ENV_VAR} turns them off"
    else:
        graph_why = "the torch backend runs eagerly"
    stages[r_graph] = {"path": "used" if capturable else "not used", "why": graph_why}
    stages[r_transfer] = (
        {"path": "pinned-memory copies, one stream sync", "why": "the ranked list is on a GPU"}
        if device.type == "cuda" else
        {"path": "numpy views of the CPU tensors, no copy", "why": "the ranked list is on the CPU"})
    stages["colbert_score_packed"] = (
        {"path": "ops.dense.maxsim_packed", "why": f"backend triton ({backend_why})"} if triton else
        {"path": "reference.segment_maxsim over D @ Q.T", "why": f"backend torch ({backend_why})"})
    return {"backend": backend, "backend_why": backend_why, "stages": stages}


def _stage_4(device, lq, index, backend, backend_why, restated) -> dict:
    from tilemaxsim_plaid.plaid import backends, scoring

    if backend == "torch":
        return {"path": "decompress (codec's fp32 add, normalise), fp32 matmul, per-document "
                        f"max, {backends.TOKENS_PER_CHUNK:,} tokens per chunk",
                "products": scoring.DECOMPRESSED_PRODUCTS, "why": f"backend torch ({backend_why})"}
    if backends.fused_residual_op() is None:
        return {"path": "ops.dense.maxsim_padded over decompressed tokens (a counted fallback)",
                "products": scoring.DECOMPRESSED_PRODUCTS,
                "why": "the fused residual kernel failed to import (logged on the "
                       "tilemaxsim_plaid logger)"}
    entry = {"path": "ops.residual.maxsim_residual: fused decode, the candidates read in place",
             "why": f"backend triton ({backend_why})"}
    choice = environment.stage_4_products()
    if index is None:
        entry["products"] = (f"{environment.PRODUCTS_ENV_VAR}={choice}: resolved per index "
                             "(pass --index PATH)")
        return entry
    like = _index_like(device, index, backend, restated)
    products, fell_back = backends.resolved_products(like, lq)
    table = backends.uses_centroid_table(like, lq)
    reasons = [f"{environment.PRODUCTS_ENV_VAR}={choice}"]
    if choice == "auto" and table:
        reasons.append("every bucket weight is an fp16 value" if like.bucket_weights_in_fp16
                       else "the bucket weights are not all fp16 values")
    if not table:
        reasons.append(f"no centroid-score table of the query for C={index.num_centroids} and "
                       f"{lq} query tokens (plaid/backends.uses_centroid_table): tf32x3")
    if fell_back:
        reasons.append("the fp16 modes need that table: falls back to tf32x3 (counted in stats())")
    entry["products"] = products
    entry["products_why"] = "; ".join(reasons)
    return entry


def explain(index: str | None = None, query_tokens: int = 32,
            device: str | torch.device | None = None) -> dict:
    """The report as a dict (what ``--json`` prints).

    Args:
        index: a colbert-ai index directory, or None.
        query_tokens: query length the decisions are evaluated for.
        device: where the index would be scored; default the current CUDA device, else the CPU.

    Raises:
        ValueError: a ``TILEMAXSIM_PLAID_*`` value is not allowed, or ``index`` is unreadable.
    """
    if query_tokens < 1:
        raise ValueError(f"--query-tokens must be >= 1, got {query_tokens}")
    try:
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU here (torch {torch.__version__})")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {device}")
    env = _environment(device)
    facts = read_index(index) if index else None
    restated = []
    report = {
        "machine": _machine(device),
        "environment": env,
        "query_tokens": query_tokens,
        "index": dataclasses.asdict(facts) if facts else None,
        "ops": _ops(device, query_tokens, facts, restated),
        "plaid": _plaid(device, query_tokens, facts, restated),
    }
    report["plugin"] = _plugin(report["machine"], env)
    report["restated"] = restated
    return report


def _plugin(machine: dict, env: dict) -> dict:
    """Whether ``import tilemaxsim_plaid`` patches colbert-ai here (the registry's version guard
    warns as it refuses, so its rule is restated)."""
    if env["variables"][environment.DISABLE_ENV_VAR]["value"]:
        return {"patches_colbert_ai": False, "why": f"{environment.DISABLE_ENV_VAR} is set"}
    version, supported = machine["colbert_ai"], machine["colbert_ai_supported"]
    if version is None:
        return {"patches_colbert_ai": False, "why": "colbert-ai is not installed"}
    if version not in supported:
        return {"patches_colbert_ai": False,
                "why": f"colbert-ai {version} is not a supported version ({', '.join(supported)})"}
    return {"patches_colbert_ai": True,
            "why": f"colbert-ai {version} is supported: patched when it is imported"}


def _lines(mapping: dict, indent: str) -> list[str]:
    width = max((len(str(key)) for key in mapping), default=0)
    lines = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}")
            lines += _lines(value, indent + "    ")
        else:
            lines.append(f"{indent}{str(key):<{width}}  {value}")
    return lines


def format_report(report: dict) -> str:
    """The report as text, one section per part."""
    machine = dict(report["machine"])
    lines = [f"tilemaxsim explain: {machine['device']}, queries of {report['query_tokens']} tokens"]
    lines += ["", "Machine"] + _lines(machine, "  ")
    env = report["environment"]
    lines += ["", "Environment"]
    lines += _lines({name: f"{'unset' if v['set'] is None else repr(v['set'])} -> {v['value']}"
                     for name, v in env["variables"].items()}, "  ")
    for name in env["unknown"]:
        lines.append(f"  {name}  not a variable the plugin reads (misspelt?): ignored")
    plugin = report["plugin"]
    patches = "yes" if plugin["patches_colbert_ai"] else "no"
    lines += ["", "Plugin", f"  patches colbert-ai: {patches} ({plugin['why']})"]
    if report["index"]:
        lines += ["", "Index"] + _lines({k: v for k, v in report["index"].items()
                                          if k != "bucket_weights"}, "  ")
    lines += ["", f"Ops (one query of {report['query_tokens']} tokens on {machine['device']})"]
    lines += _lines(report["ops"], "  ")
    plaid = report["plaid"]
    lines += ["", f"PLAID stages (backend {plaid['backend']}: {plaid['backend_why']})"]
    lines += _lines(plaid["stages"], "  ")
    if report["restated"]:
        lines += ["", "Restated here (decided inline, no side-effect-free function to ask):"]
        lines += [f"  - {rule}" for rule in report["restated"]]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilemaxsim explain",
        description="Which path each op and each PLAID stage takes on this machine, and why.")
    parser.add_argument("--index", metavar="PATH", help="a colbert-ai index directory (C, nbits, "
                        "dim and document lengths are read from its files)")
    parser.add_argument("--query-tokens", type=int, default=32, metavar="N",
                        help="query length the decisions are evaluated for (default 32)")
    parser.add_argument("--device", default=None,
                        help="where the index would be scored (default: cuda if present, else cpu)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = explain(args.index, args.query_tokens, args.device)
    except (ValueError, RuntimeError) as error:
        message = " ".join(str(error).split())
        print(f"tilemaxsim explain: {message}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
