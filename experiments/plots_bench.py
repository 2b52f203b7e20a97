"""Plots of the dense benchmark, drawn only from the result file it wrote.

    tilemaxsim plots results/bench/h200-final/dense.json [--out DIR]

Writes throughput vs number of documents, vs document length (per query length), vs embedding
dimension, and a roofline (every measured point against the read-bandwidth and bf16 ceilings
measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import pathlib

PROVIDER_STYLE = {
    "tilemaxsim": {"color": "#d62728", "marker": "s"},
    "flash_maxsim": {"color": "#1f77b4", "marker": "o"},
    "late_interaction_kernels": {"color": "#2ca02c", "marker": "^"},
    "torch_einsum": {"color": "#7f7f7f", "marker": "x"},
    "torch_compile": {"color": "#9467bd", "marker": "+"},
    "colbert_packed": {"color": "#8c564b", "marker": "v"},
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _title(doc: dict) -> str:
    p = doc["provenance"]
    return f"{p.get('gpu')} | torch {p['torch']} | triton {p['triton']} | {p['commit'][:8]}"


def _sweep_plot(doc, sweep, x_key, out, xlabel, series_key=None, logx=False):
    rows = [r for r in doc["rows"] if r.get("sweep") == sweep]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series = sorted({(r["provider"], r.get(series_key) if series_key else None) for r in rows},
                    key=str)
    for provider, group in series:
        pts = sorted((r[x_key], r["gbps"]) for r in rows
                     if r["provider"] == provider and (not series_key or r.get(series_key) == group))
        style = PROVIDER_STYLE.get(provider, {})
        label = provider if group is None else f"{provider} {series_key}={group}"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                linestyle="-" if provider == "tilemaxsim" else "--", **style)
    read = doc["ceilings"].get("read_gbps")
    if read:
        ax.axhline(read, color="black", linewidth=0.8, linestyle=":", label="measured read BW")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GB/s of document bytes (each byte once)")
    ax.set_title(_title(doc), fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def plot_roofline(doc, out):
    plt = _pyplot()
    ceilings = doc["ceilings"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for row in doc["rows"]:
        if not row["tflops"]:  # the per-document read floors do no products
            continue
        intensity = row["tflops"] * 1e12 / (row["gbps"] * 1e9)  # FLOP per byte
        style = PROVIDER_STYLE.get(row["provider"], {})
        ax.scatter(intensity, row["tflops"], s=12, color=style.get("color", "gray"),
                   marker=style.get("marker", "o"))
    xs = [2 ** (i / 4) for i in range(0, 48)]
    roof = [min(ceilings["bf16_tflops"], x * ceilings["read_gbps"] / 1e3) for x in xs]
    ax.plot(xs, roof, color="black", linewidth=1)
    for provider, style in PROVIDER_STYLE.items():
        ax.scatter([], [], label=provider, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per document byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("roofline: " + _title(doc), fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def plot_all(result_file, out_dir=None) -> list[pathlib.Path]:
    result_file = pathlib.Path(result_file)
    doc = json.loads(result_file.read_text())
    out_dir = pathlib.Path(out_dir or result_file.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        _sweep_plot(doc, "num_docs", "N", out_dir / "throughput_vs_num_docs.png", "documents N",
                    logx=True),
        _sweep_plot(doc, "length", "Ld", out_dir / "throughput_vs_doc_length.png",
                    "document length Ld (tokens)", series_key="Lq", logx=True),
        _sweep_plot(doc, "dim", "d", out_dir / "throughput_vs_dim.png", "embedding dimension d"),
        plot_roofline(doc, out_dir / "roofline_dense.png"),
    ]
    return [p for p in written if p is not None]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="tilemaxsim plots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result_file", help="dense.json written by tilemaxsim bench")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: beside the file)")
    args = parser.parse_args(argv)
    for path in plot_all(args.result_file, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
