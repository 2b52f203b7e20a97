"""Dense MaxSim benchmark: our kernels against torch, colbert-ai's packed scorer and public kernels.

    tilemaxsim bench [--quick] [--sweep] [--out results/bench]

One run measures the ceilings (read and copy bandwidth, bf16 matmul), checks every provider
against the float64 reference on a slice of each shape, times them with CUDA events, prints a
table, and writes JSON/CSV with provenance. Plots are drawn from those files by
``experiments/plots_bench.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math

import torch

from . import harness, packed_read
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.dense import MaxSimConfig, default_config, maxsim_packed, maxsim_padded
from tilemaxsim_plaid.ops.launch import memory_bandwidth

# Progress and checks go to stderr through logging; the result table goes to stdout.
log = logging.getLogger(__name__)

SUITE = "dense"
OURS = "tilemaxsim"
# Not MaxSim providers: floors of one program per document on a packed shape
# (experiments/packed_read.py): reading alone, reading plus a query load, a bare MaxSim.
READ_PER_DOCUMENT = "read_per_document"
READ_AND_QUERY_PER_DOCUMENT = "read_and_query_per_document"
BARE_MAXSIM_PER_DOCUMENT = "bare_maxsim_per_document"
PER_DOCUMENT_FLOORS = (READ_PER_DOCUMENT, READ_AND_QUERY_PER_DOCUMENT, BARE_MAXSIM_PER_DOCUMENT)
# MS MARCO passages under ColBERTv2's tokenizer average ~70 tokens with a long right tail, capped
# at doc_maxlen = 180: a clipped log-normal with these parameters has mean ~70.
LENGTH_MEDIAN, LENGTH_SIGMA, LENGTH_MIN, LENGTH_MAX = 66.0, 0.35, 8, 180
# Sweep size for the per-length table: ~1 GB of documents per point, far beyond L2.
SWEEP_BYTES = 1 << 30


@dataclasses.dataclass
class Case:
    name: str
    B: int
    Lq: int
    N: int
    Ld: int
    d: int
    packed: bool = False
    sweep: str = "main"


def msmarco_like_lengths(n: int, generator: torch.Generator) -> torch.Tensor:
    normal = torch.randn(n, generator=generator, dtype=torch.float64)
    lengths = torch.exp(math.log(LENGTH_MEDIAN) + LENGTH_SIGMA * normal).round()
    return lengths.clamp(LENGTH_MIN, LENGTH_MAX).to(torch.int64)


def main_cases(quick: bool) -> list[Case]:
    n = 10_000 if quick else 100_000
    n_wide = 2_000 if quick else 20_000
    return [
        Case("1q N=100k Ld=128 d=128", 1, 32, n, 128, 128),
        Case("32q share N=100k Ld=128 d=128", 32, 32, n, 128, 128),
        Case("1q packed N=100k mean70 d=128", 1, 32, n, LENGTH_MAX, 128, packed=True),
        Case("32q packed N=100k mean70 d=128", 32, 32, n, LENGTH_MAX, 128, packed=True),
        Case("1q N=20k Ld=300 d=128", 1, 32, n_wide, 300, 128),
        Case("1q N=20k Ld=128 d=384", 1, 32, n_wide, 128, 384),
        Case("1q N=20k Ld=128 d=768", 1, 32, n_wide, 128, 768),
        Case("1q N=20k Ld=128 d=96", 1, 32, n_wide, 128, 96),
    ]


def sweep_cases(quick: bool) -> list[Case]:
    cases = []
    for lq in (8, 16, 32, 64):
        for ld in (32, 64, 128, 256, 512):
            n = max(1000, SWEEP_BYTES // (ld * 128 * 2) // (8 if quick else 1))
            cases.append(Case(f"1q Lq={lq} Ld={ld} N={n}", 1, lq, n, ld, 128, sweep="length"))
    for n in (1_000, 10_000, 100_000, 1_000_000):
        if not quick or n <= 100_000:
            cases.append(Case(f"1q N={n} Ld=128", 1, 32, n, 128, 128, sweep="num_docs"))
    for d in (64, 96, 128, 256, 384, 512, 768):
        cases.append(Case(f"1q d={d} N=20k Ld=128", 1, 32, 2_000 if quick else 20_000, 128, d,
                          sweep="dim"))
    return cases


@dataclasses.dataclass
class Inputs:
    Q: torch.Tensor
    D: torch.Tensor | None = None  # padded [N, Ld, d]
    D_packed: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    lengths: torch.Tensor | None = None

    @property
    def doc_bytes(self) -> int:
        t = self.D if self.D is not None else self.D_packed
        return t.numel() * t.element_size()


def make_inputs(case: Case, dtype=torch.float16, device="cuda", seed=0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    # Unit-norm rows as ColBERT produces them; random, never zeros (zeros hide unwritten outputs).
    Q = torch.nn.functional.normalize(torch.randn(case.B, case.Lq, case.d, device=device), dim=-1)
    Q = Q.to(dtype)
    if not case.packed:
        D = torch.randn(case.N, case.Ld, case.d, device=device, dtype=dtype)
        D /= math.sqrt(case.d)
        return Inputs(Q=Q, D=D)
    lengths = msmarco_like_lengths(case.N, g).to(device)
    offsets = torch.zeros(case.N + 1, dtype=torch.int64, device=device)
    offsets[1:] = lengths.cumsum(0)
    D_packed = torch.randn(int(offsets[-1]), case.d, device=device, dtype=dtype) / math.sqrt(case.d)
    return Inputs(Q=Q, D_packed=D_packed, offsets=offsets, lengths=lengths)


# ---- providers: each returns a callable producing [B, N] (or [N]) scores, or None if n/a ----

def provider_ours(case: Case, x: Inputs, config: MaxSimConfig | None = None):
    Q = x.Q[0] if case.B == 1 else x.Q
    if case.packed:
        max_len = int(x.lengths.max())
        return lambda: maxsim_packed(Q, x.D_packed, x.offsets, max_doc_len=max_len,
                                     config=config, validate=False)
    return lambda: maxsim_padded(Q, x.D, config=config, validate=False)


def _einsum_scores(Q3, D, chunk):
    out = torch.empty(Q3.shape[0], D.shape[0], device=D.device, dtype=torch.float32)
    for s in range(0, D.shape[0], chunk):
        sim = torch.einsum("bid,njd->bnij", Q3, D[s:s + chunk])
        out[:, s:s + chunk] = sim.amax(-1).float().sum(-1)
    return out


def _einsum_chunk(case: Case) -> int:
    # Keep the materialised similarity block near 2 GB: that is what a user of einsum must do.
    per_doc = case.B * case.Lq * case.Ld * 2
    return max(1, min(case.N, (2 << 30) // per_doc))


def provider_einsum(case: Case, x: Inputs):
    if case.packed:
        return None
    chunk = _einsum_chunk(case)
    return lambda: _einsum_scores(x.Q, x.D, chunk)


def provider_compile(case: Case, x: Inputs):
    if case.packed or case.B != 1:
        return None
    compiled = torch.compile(lambda q, d: torch.einsum("id,njd->nij", q, d).amax(-1).float().sum(-1))
    chunk = _einsum_chunk(case)

    def run():
        out = torch.empty(case.N, device=x.D.device)
        for s in range(0, case.N, chunk):
            out[s:s + chunk] = compiled(x.Q[0], x.D[s:s + chunk])
        return out

    return run


def colbert_score_packed_transliterated(Q2: torch.Tensor, D_packed: torch.Tensor,
                                        offsets: torch.Tensor, lengths: torch.Tensor,
                                        max_len: int) -> torch.Tensor:
    """colbert-ai 0.2.22's GPU colbert_score_packed, re-expressed: token scores D @ Q^T, pad
    every document to the longest with -9999, max over doc tokens, sum over query tokens (fp16)."""
    scores = D_packed @ Q2.T  # [T, Lq]
    positions = torch.arange(max_len, device=D_packed.device)
    rows = (offsets[:-1, None] + positions[None, :]).clamp(max=scores.shape[0] - 1)
    padded = scores[rows]  # [N, max_len, Lq]
    padded[~(positions[None, :] < lengths[:, None])] = -9999
    return padded.max(1).values.sum(-1)


def provider_colbert(case: Case, x: Inputs):
    if not case.packed or case.B != 1:
        return None
    max_len = int(x.lengths.max())
    return lambda: colbert_score_packed_transliterated(x.Q[0], x.D_packed, x.offsets, x.lengths,
                                                       max_len)


def provider_flash_maxsim(case: Case, x: Inputs):
    try:
        import flash_maxsim
    except ImportError:
        return None
    if case.packed:
        if case.B != 1:
            return None
        cu = x.offsets.to(torch.int32)
        max_len = int(x.lengths.max())
        return lambda: flash_maxsim.flash_maxsim_packed(x.Q[0], x.D_packed, cu, max_seqlen_d=max_len)
    if case.B == 1:
        return lambda: flash_maxsim.flash_maxsim(x.Q[0], x.D)
    return lambda: flash_maxsim.flash_maxsim_batched(x.Q, x.D, shared_docs=True)


def provider_lik(case: Case, x: Inputs):
    try:
        import late_interaction_kernels as lik
    except ImportError:
        return None
    if case.packed:
        if case.B != 1:
            return None
        cu_d = x.offsets.to(torch.int32)
        cu_q = torch.tensor([0, case.Lq], dtype=torch.int32, device=x.Q.device)
        q_packed = x.Q[0].contiguous()
        max_len = int(x.lengths.max())
        return lambda: lik.maxsim_varlen(q_packed, x.D_packed, cu_q, cu_d, case.Lq, max_len)
    return lambda: lik.maxsim(x.Q, x.D)


PROVIDERS = {
    OURS: provider_ours,
    "torch_einsum": provider_einsum,
    "torch_compile": provider_compile,
    "colbert_packed": provider_colbert,
    "flash_maxsim": provider_flash_maxsim,
    "late_interaction_kernels": provider_lik,
}

# Reference check on a slice: enough documents to cover every program shape, cheap in float64.
CHECK_DOCS = 512


def reference_slice(case: Case, x: Inputs) -> torch.Tensor:
    if case.packed:
        pids = torch.arange(min(CHECK_DOCS, case.N))
        return reference.maxsim_packed(x.Q.cpu(), x.D_packed.cpu(), x.offsets.cpu(), pids)
    return reference.maxsim_padded(x.Q.cpu(), x.D[:CHECK_DOCS].cpu())


def max_relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |got - ref| / max(|ref|, 1) (scores near 0 are compared absolutely)."""
    got, ref = got.double().cpu(), ref.double().cpu()
    return float(((got - ref).abs() / ref.abs().clamp_min(1.0)).max())


def check_output(name: str, case: Case, out: torch.Tensor, ref: torch.Tensor) -> float:
    got = out.reshape(case.B, -1)[:, :ref.shape[1]].double().cpu()
    err = max_relative_error(got, ref)
    # colbert-ai rounds its sum to fp16 and public kernels may too: allow fp16 rounding of the
    # score for others, demand fp32-accumulation accuracy of ours.
    limit = 1e-3 if name.startswith(OURS) else 2e-2
    status = "ok" if err <= limit and not torch.isnan(got).any() else "WRONG"
    (log.info if status == "ok" else log.warning)("  check %-26s max rel err %.2e [%s]", name, err, status)
    return err if status == "ok" else float("nan")


def bytes_and_flops(case: Case, x: Inputs) -> tuple[int, float]:
    q_bytes = x.Q.numel() * x.Q.element_size()
    tokens = x.D.shape[0] * x.D.shape[1] if x.D is not None else x.D_packed.shape[0]
    flops = 2.0 * case.B * case.Lq * tokens * case.d
    return x.doc_bytes + q_bytes, flops


def run_case(case: Case, ceilings: dict, providers: list[str]) -> list[dict]:
    x = make_inputs(case)
    nbytes, flops = bytes_and_flops(case, x)
    ref = reference_slice(case, x)
    rows = []
    log.info("[%s] B=%d Lq=%d N=%d Ld=%d d=%d packed=%s doc bytes=%.2f GB", case.name, case.B,
             case.Lq, case.N, case.Ld, case.d, case.packed, x.doc_bytes / 1e9)
    for name in providers:
        fn = PROVIDERS[name](case, x)
        if fn is None:
            continue
        try:
            err = check_output(name, case, fn(), ref)
            timing = harness.time_ms(fn)
        except Exception as exc:  # a public kernel that cannot take a shape is reported, not fatal
            log.warning("  %s failed: %s: %s", name, type(exc).__name__, str(exc)[:200])
            continue
        rows.append(harness.make_row(SUITE, case.name, name, timing, num_docs=case.B * case.N,
                                     nbytes=nbytes, flops=flops, ceilings=ceilings,
                                     sweep=case.sweep, B=case.B, Lq=case.Lq, N=case.N, Ld=case.Ld,
                                     d=case.d, packed=case.packed, max_rel_err=err))
    if case.packed and case.B == 1:
        for variant in PER_DOCUMENT_FLOORS:
            rows.append(_per_document_read_row(case, x, nbytes, ceilings, variant))
    del x
    torch.cuda.empty_cache()
    return rows


def _per_document_read_row(case: Case, x: Inputs, nbytes: int, ceilings: dict,
                           variant: str = READ_PER_DOCUMENT) -> dict:
    """The fastest configuration of one experiments/packed_read.py variant on this packed corpus:
    reading alone (the read ceiling of one program per document), reading plus one query load per
    program, or a bare MaxSim (one query, no query lengths, one d tile). Each is checked first."""
    Q = x.Q[0].contiguous()
    query = None if variant == READ_PER_DOCUMENT else Q
    product = variant == BARE_MAXSIM_PER_DOCUMENT
    if product:
        # Our packed kernel, itself checked against the float64 reference in run_case.
        expected = maxsim_packed(Q, x.D_packed, x.offsets)
    else:
        expected = packed_read.expected_read(x.D_packed, x.offsets, query)
    timing, (block_t, warps, stages) = harness.fastest(
        packed_read.CONFIGS,
        lambda c: packed_read.per_document_read(x.D_packed, x.offsets, *c, query=query, product=product),
        lambda out: torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-2))
    config = {"block_t": block_t, "num_warps": warps, "num_stages": stages}
    log.info("  %s best %.4f ms with %s", variant, timing[0], config)
    return harness.make_row(SUITE, case.name, variant, timing, num_docs=case.N, nbytes=nbytes,
                            flops=0.0, ceilings=ceilings, sweep=case.sweep, B=case.B, Lq=case.Lq,
                            N=case.N, Ld=case.Ld, d=case.d, packed=case.packed, config=config)


def config_candidates(case: Case, max_len: int) -> list[MaxSimConfig]:
    """The configurations the heuristic chooses among, timed side by side by --sweep."""
    lq = 1 << max(0, (case.Lq - 1).bit_length())
    single_ok = max_len <= 256 and case.d <= 128
    stages_list = (2, 3, 4)
    out = []
    if case.packed:
        qpb = 1 if case.B == 1 else max(1, 128 // lq)
        for slot, docs in ((16, 8), (32, 2), (32, 4), (32, 8), (64, 2), (64, 4)):
            for warps in (4, 8):
                for stages in (2, 3):
                    out.append(MaxSimConfig(slot, qpb, 1, docs, False, warps, stages, slots=True))
        for block_t in (32, 64):
            for warps in (2, 4):
                for stages in (1, 2, 3):
                    out.append(MaxSimConfig(block_t, qpb, 1, 1, False, warps, stages))
        if case.B == 1 and case.d <= 128:
            # Several documents per program with the query tile held across them: loading the
            # query once per document costs ~10 % of the read roof.
            for block_t in (32, 64):
                for warps in (2, 4):
                    for docs in (2, 4, 8):
                        for stages in (2, 3):
                            if block_t == 64 and warps == 2 and docs == 8:
                                continue  # past 200 registers (sm_90, triton 3.6)
                            out.append(MaxSimConfig(block_t, 1, 1, docs, False, warps, stages,
                                                    hold_query=True))
        return out
    if case.B == 1:
        for block_t in (64, 128) if case.d > 128 else (64, 128, 256):
            for dpp in (1, 4) if case.d <= 128 else (1,):
                for warps in (4, 8):
                    for stages in stages_list:
                        for single in ((False, True) if single_ok and block_t >= max_len else (False,)):
                            if block_t < 256 or single:
                                out.append(MaxSimConfig(block_t, 1, 1, dpp, single, warps, stages))
        return out
    for qpb in (max(1, 64 // lq), max(1, 128 // lq)):
        for block_t in (64, 128, 256):
            for warps in (4, 8):
                for stages in (2, 3):
                    if block_t < 256:
                        out.append(MaxSimConfig(block_t, qpb, 1, 1, False, warps, stages))
                    if single_ok and block_t >= max_len:
                        for q_blocks in (2, 8):
                            out.append(MaxSimConfig(block_t, qpb, q_blocks, 1, True, warps, stages))
    return out


def run_sweep(cases: list[Case], ceilings: dict) -> list[dict]:
    rows = []
    for case in cases:
        x = make_inputs(case)
        nbytes, flops = bytes_and_flops(case, x)
        max_len = int(x.lengths.max()) if case.packed else case.Ld
        ref = reference_slice(case, x)
        log.info("[sweep %s]", case.name)
        for cfg in config_candidates(case, max_len):
            fn = provider_ours(case, x, cfg)
            try:
                out = fn()
                got = out.reshape(case.B, -1)[:, :ref.shape[1]].double().cpu()
                if not torch.allclose(got, ref, rtol=1e-3, atol=1e-3):
                    log.warning("  WRONG %s", cfg)
                    continue
                timing = harness.time_ms(fn, rep_ms=60)
            except Exception as exc:
                log.warning("  failed %s: %s: %s", cfg, type(exc).__name__, str(exc)[:120])
                continue
            rows.append(harness.make_row("dense_config_sweep", case.name, OURS, timing,
                                         num_docs=case.B * case.N, nbytes=nbytes, flops=flops,
                                         ceilings=ceilings, config=dataclasses.asdict(cfg)))
        mine = sorted((r for r in rows if r["shape"] == case.name), key=lambda r: r["ms"])[:5]
        default = default_config(case.B, case.Lq, max_len, case.d, variable_lengths=case.packed,
                                 num_docs=case.N,
                                 mean_tokens=x.D_packed.shape[0] / case.N if case.packed else None,
                                 read_bandwidth=memory_bandwidth(x.Q.device))
        log.info("  default %s", default)
        for r in mine:
            log.info("  %.4f ms %.1f%% BW %.0f TF %s", r["ms"], r["pct_read_bw"], r["tflops"], r["config"])
        del x
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="tilemaxsim bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10x smaller shapes")
    parser.add_argument("--sweep", action="store_true", help="time every kernel config on the main shapes")
    parser.add_argument("--sweep-shapes", default="", help="';'-separated main shape names to sweep")
    parser.add_argument("--no-sweeps", action="store_true", help="skip the length/N/d sweeps")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--out", default="results/bench")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:  # a caller that configured logging keeps its own
        logging.basicConfig(format="%(message)s")
    log.setLevel(logging.INFO)
    if not torch.cuda.is_available():
        raise SystemExit("tilemaxsim bench times GPU kernels and needs a CUDA device")
    providers = [p for p in args.providers.split(",") if p]
    unknown = set(providers) - set(PROVIDERS)
    if unknown:
        raise SystemExit(f"unknown providers {sorted(unknown)}; known: {sorted(PROVIDERS)}")

    ceilings = harness.measure_ceilings()
    log.info("ceilings: %s", {k: round(v, 1) for k, v in ceilings.items()})
    prov = harness.provenance()
    log.info("provenance: %s", prov)
    rows: list[dict] = []
    if args.sweep:
        swept = ([c for c in main_cases(args.quick) if c.name in args.sweep_shapes.split(";")]
                 if args.sweep_shapes else main_cases(args.quick))
        sweep_rows: list[dict] = []
        for case in swept:
            sweep_rows += run_sweep([case], ceilings)
            # Written after every shape, so a run stopped at its time limit keeps what it measured.
            harness.write_results(sweep_rows, args.out, "dense_config_sweep", ceilings=ceilings)
    cases = [(case, providers) for case in main_cases(args.quick)]
    if not args.no_sweeps:
        cases += [(case, [OURS, "flash_maxsim"]) for case in sweep_cases(args.quick)]
    for case, case_providers in cases:
        rows += run_case(case, ceilings, case_providers)
        # Written after every shape, so a run stopped at its time limit keeps what it measured.
        harness.add_speedups(rows, OURS)
        path = harness.write_results(rows, args.out, "dense", ceilings=ceilings)
    print(f"wrote {path}")
    print()
    print(f"GPU {prov.get('gpu')} | torch {prov['torch']} | triton {prov['triton']} | "
          f"CUDA {prov['cuda']} | commit {prov['commit'][:10]} | read ceiling "
          f"{ceilings['read_gbps']:.0f} GB/s | bf16 {ceilings['bf16_tflops']:.0f} TFLOP/s")
    harness.print_table([r for r in rows if r.get("sweep") == "main"])


if __name__ == "__main__":
    main()
