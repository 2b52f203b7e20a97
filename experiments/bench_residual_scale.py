"""Residual codes at colbert-ai's centroid counts and bit widths, as a user calls them.

``python -m experiments.bench_residual_scale [--num-docs 100000] [--out DIR]`` (GPU)

For C in {2^16, 2^18} (MS MARCO's full index) and nbits in {1, 2, 4}, on the random index of
``bench_compressed.make_index`` (MS MARCO-like lengths, one 32-token fp16 query):
``maxsim_residual`` with its defaults (``validate=True``) and with ``validate=False``, beside our
dense kernel on the same documents decoded to fp16 (``maxsim_packed``, the "decode, then score"
alternative); and ``maxsim_pq`` (M = 16) with and without validation. The two residual calls
are timed in alternating order ``--repeats`` times (each row keeps the median of its repeats and
every repeat's median), so that the order of measurement cannot pass for the cost of validation;
``graph_ms`` is the same call replayed from a CUDA graph, its GPU time without the host's work.
With ``--caps R ...`` the default launch is also timed, in the same alternation, under each
register cap R (ptxas .maxnreg; 0: none) instead of its own, each first checked to score exactly
as the default: whether a cap that spills (nbits 4 under 96) or one that costs occupancy wins.
With ``--decoders NAME ...`` the default launch is timed the same way with each other decoder
(``ResidualConfig.decode`` where it applies at that nbits), each first checked against the
default's scores (bit for bit where it decodes with the same decoder).
With ``--pipeline-codes`` the default launch and each decoder's are timed a second time with
``ResidualConfig.pipeline_codes`` (each tile's codes loaded a tile ahead) the other way round,
checked the same way. Where the mma kernel applies (``scoring="mma"``: nbits 2 and 4) the op's
other kernel is timed beside its default (``ops/residual.mma_default`` where the default is the Triton
kernel's launch, that launch where it is the mma kernel's: ``MMA_NBITS``), and the options above
vary the Triton launch; the mma kernel is also timed with its L2 prefetch flipped, with its L2
cache policies the other way (``ops/residual_mma.l2_hints``) and, with ``--mma-grabs G ...``, with G
documents per grab; and the mma kernel's centroid-score table is timed alone (its share of a
call, which grows with C).
Rows go to ``OUT/residual_scale.json`` (harness format).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import torch

from . import harness
from .bench_compressed import DIM, QUERY_LEN, make_index, queries

__all__ = ["main"]

SUITE = "residual_scale"


def cap_variants(config, caps):
    """(provider, config) for the default launch ``config`` under each register cap of ``caps``
    (0 or None: uncapped) other than its own."""
    variants = []
    for cap in dict.fromkeys(cap or None for cap in caps):
        if cap != config.maxnreg:
            variants.append((f"maxsim_residual validate=False maxnreg={cap or 'none'}",
                             dataclasses.replace(config, maxnreg=cap)))
    return variants


def decoder_variants(config, decoders, nbits):
    """(provider, config) for the default launch ``config`` with each decoder of ``decoders``
    other than its own that applies at ``nbits`` (byte permutes: nbits = 2 and 4)."""
    from tilemaxsim_plaid.ops.residual import PERMUTE_NBITS
    return [(f"maxsim_residual validate=False decode={decode}",
             dataclasses.replace(config, decode=decode))
            for decode in dict.fromkeys(decoders)
            if decode != config.decode and (decode != "permute" or nbits in PERMUTE_NBITS)]


def pipelined_variants(default, variants):
    """(provider, config) twins of the default launch and of each of ``variants`` with
    pipeline_codes (each main tile's codes loaded a tile ahead) the other way round."""
    base = [("maxsim_residual validate=False", default)] + list(variants)
    return [(f"{provider} pipeline_codes={not config.pipeline_codes}",
             dataclasses.replace(config, pipeline_codes=not config.pipeline_codes))
            for provider, config in base]


def scores_as_default(config, default, got, want) -> bool:
    """Whether a variant's scores are the default's: bit for bit with the same decoder (register
    caps, codes a tile ahead), else within fp16 rounding (permute's column order changes the
    products' summation order)."""
    if config.decode == default.decode:
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=1e-3, atol=1e-3)


def op_default(nbits: int, num_docs: int, element_size: int):
    """The Triton kernel's launch the op makes for one fp16 query of QUERY_LEN tokens on the
    table path (byte permutes where they serve, the pair table at nbits = 1): the op's default
    where scoring="mma" does not apply, its twin where it does."""
    from tilemaxsim_plaid.ops.residual import default_residual_config
    return default_residual_config(1, QUERY_LEN, False, num_docs, element_size, half_table=True,
                                   nbits=nbits)


def mma_variants(grabs, default):
    """(provider, config) for the mma kernel's launch ``default`` (ops/residual.mma_default)
    with each number of documents per grab of ``grabs`` other than its own, and with its L2
    prefetch flipped."""
    return [(f"maxsim_residual validate=False scoring=mma grab={grab}",
             dataclasses.replace(default, docs_per_program=grab))
            for grab in dict.fromkeys(grabs) if grab != default.docs_per_program] + [
        (f"maxsim_residual validate=False scoring=mma prefetch={not default.prefetch}",
         dataclasses.replace(default, prefetch=not default.prefetch))]


def with_l2_hints(call, hints: bool):
    """``call`` made with ops/residual_mma.L2_HINTS set to ``hints`` (restored after it)."""
    from tilemaxsim_plaid.ops import residual_mma

    def hinted():
        before, residual_mma.L2_HINTS = residual_mma.L2_HINTS, hints
        try:
            return call()
        finally:
            residual_mma.L2_HINTS = before
    return hinted


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_residual_scale",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--num-docs", type=int, default=100_000)
    parser.add_argument("--centroids", type=int, nargs="+", default=[1 << 16, 1 << 18])
    parser.add_argument("--nbits", type=int, nargs="+", default=[1, 2, 4], choices=(1, 2, 4))
    parser.add_argument("--repeats", type=int, default=3,
                        help="alternating timings of the residual op with and without validation")
    parser.add_argument("--caps", type=int, nargs="*", default=[],
                        help="register caps (0: none) to time the default launch under")
    parser.add_argument("--decoders", nargs="*", default=[],
                        choices=("pairs", "select", "permute"),
                        help="decoders to time the default launch with")
    parser.add_argument("--pipeline-codes", action="store_true",
                        help="also time the default and each decoder with pipeline_codes flipped")
    parser.add_argument("--mma-grabs", type=int, nargs="*", default=[],
                        help="documents per grab to time the mma kernel with, where it is the "
                             "default")
    parser.add_argument("--out", default="results/residual_scale")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_residual_scale times GPU kernels and needs a CUDA device")
    from tilemaxsim_plaid import maxsim_packed, maxsim_pq, maxsim_residual
    from tilemaxsim_plaid.codecs.pq import PQCodec
    from tilemaxsim_plaid.codecs.residual import decompress_residuals
    from tilemaxsim_plaid.ops import nvrtc, residual_mma
    from tilemaxsim_plaid.ops.residual import MMA_NBITS, mma_default

    device = torch.device("cuda")
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    rows = []

    def timed(shape, provider, fn, **extra):
        median, p20, p80 = harness.time_ms(fn)
        rows.append({"suite": SUITE, "shape": shape, "provider": provider, "ms": median,
                     "p20_ms": p20, "p80_ms": p80, "docs_per_s": args.num_docs / median * 1e3, **extra})
        print(f"{shape:<44} {provider:<34} {median:8.4f} ms", flush=True)

    def timed_alternating(shape, variants):
        """(provider, fn) pairs timed in turn, ``args.repeats`` rounds; one row each."""
        medians = harness.rounds_ms(dict(variants), args.repeats)
        for provider, fn in variants:
            median = statistics.median(medians[provider])
            rows.append({"suite": SUITE, "shape": shape, "provider": provider, "ms": median,
                         "repeat_ms": medians[provider], "graph_ms": harness.graph_replay_ms(fn),
                         "docs_per_s": args.num_docs / median * 1e3})
            print(f"{shape:<44} {provider:<34} {median:8.4f} ms (repeats "
                  f"{' '.join(f'{m:.4f}' for m in medians[provider])}; graph {rows[-1]['graph_ms']:.4f})",
                  flush=True)

    for nbits in args.nbits:
        for C in args.centroids:
            index = make_index(args.num_docs, C, DIM, nbits, device)
            shape = f"1q N={args.num_docs // 1000}k C={C} nbits={nbits} d={DIM}"
            call = (Q, index["codes"], index["residuals"], index["offsets"], index["centroids"],
                    index["bucket_weights"], nbits)
            variants = [
                ("maxsim_residual validate=False",
                 lambda: maxsim_residual(*call, inv_norms=index["inv_norms"], validate=False)),
                ("maxsim_residual", lambda: maxsim_residual(*call, inv_norms=index["inv_norms"]))]
            # The Triton launch the op picks here (one fp16 query builds an fp16 table): the
            # default where the mma kernel does not apply, else timed beside it.
            default = op_default(nbits, args.num_docs, Q.element_size())
            want = variants[0][1]()

            def with_config(c):
                return lambda: maxsim_residual(*call, inv_norms=index["inv_norms"], config=c,
                                               validate=False)

            mma = nvrtc.available() and not residual_mma.reasons_not_to_apply(
                Q[None], index["codes"], index["residuals"], nbits, index["inv_norms"],
                index["centroids"])
            if mma:
                # The op's other kernel beside its default: the Triton launch where the default
                # is the mma kernel (MMA_NBITS), else the mma launch; then the mma kernel's variants.
                hinted = residual_mma.takes_l2_hints(Q[None], index["centroids"])
                mma_default_config = mma_default(hinted)
                other = (("scoring=decode", default) if nbits in MMA_NBITS
                         else ("scoring=mma", mma_default_config))
                mma_want = with_config(mma_default_config)()
                triton_want = with_config(default)()
                if not torch.allclose(triton_want, mma_want, rtol=1e-3, atol=1e-3):
                    raise SystemExit(f"the Triton and mma kernels score differently at {shape}")
                variants.append((f"maxsim_residual validate=False {other[0]}",
                                 with_config(other[1])))
                for provider, config in mma_variants(args.mma_grabs, mma_default_config):
                    if not torch.equal(with_config(config)(), mma_want):
                        raise SystemExit(f"{provider} does not score as the mma default at {shape}")
                    variants.append((provider, with_config(config)))
                hints = with_l2_hints(with_config(mma_default_config), not hinted)
                if not torch.equal(hints(), mma_want):
                    raise SystemExit(f"the L2 hints flipped do not score as the mma default at {shape}")
                variants.append((f"maxsim_residual validate=False scoring=mma l2_hints="
                                 f"{not hinted}", hints))
                variants.append(("mma centroid-score table alone", lambda: residual_mma.
                                 permuted_table(Q[None], index["centroids"], torch.float16)))
                want = triton_want
            configs = (cap_variants(default, args.caps)
                       + decoder_variants(default, args.decoders, nbits))
            if args.pipeline_codes:
                configs += pipelined_variants(
                    default, decoder_variants(default, args.decoders, nbits))
            for provider, config in configs:
                fn = with_config(config)
                if not scores_as_default(config, default, fn(), want):
                    raise SystemExit(f"{provider} does not score as the default at {shape}")
                variants.append((provider, fn))
            timed_alternating(shape, variants)
            if C == args.centroids[0]:
                D16 = decompress_residuals(index["codes"], index["residuals"], index["centroids"],
                                           index["bucket_weights"], nbits)
                max_len = int(index["lengths"].max())
                timed(shape, "maxsim_packed on decoded fp16",
                      lambda: maxsim_packed(Q, D16, index["offsets"], max_doc_len=max_len))
                if nbits == 2:
                    sample = D16[torch.randperm(D16.shape[0], device=device)[:200_000]].float()
                    codec = PQCodec.train(sample, 16, niter=10, backend="torch")
                    codes, books = codec.encode(D16), codec.codebooks
                    timed(shape, "maxsim_pq M=16", lambda: maxsim_pq(Q, codes, index["offsets"], books))
                    timed(shape, "maxsim_pq M=16 validate=False",
                          lambda: maxsim_pq(Q, codes, index["offsets"], books, validate=False))
                del D16
            del index
            torch.cuda.empty_cache()
    path = harness.write_results(rows, args.out, SUITE, meta={"argv": sys.argv if argv is None else argv})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
