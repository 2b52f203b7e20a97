"""Record a tiny fast-plaid index, its inputs and its outputs, as a fixture for CPU tests.

``python -m tilemaxsim_plaid.experiments.fast_plaid_fixture OUT_DIR`` (GPU machine, fast-plaid
installed). fast-plaid is built for one torch version and does not install beside the CPU
machine's torch, so the tests that check our writer of its on-disk format compare against files
fast-plaid itself wrote here: for nbits 2 and 4, the index folder ``create()`` leaves, and
``fixture.pt`` with the document embeddings it was given, ``get_embeddings()`` (its
decompression) and ``search()`` results for a few queries at its defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch

__all__ = ["main", "fixture_inputs"]


def fixture_inputs(num_docs: int = 48, dim: int = 128, num_queries: int = 4, seed: int = 0):
    """Deterministic unit-norm fp16 documents of lengths 3..40 and 32-token queries."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 41, (num_docs,), generator=generator).tolist()
    docs = [torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=-1).half()
            for n in lengths]
    queries = [torch.nn.functional.normalize(torch.randn(32, dim, generator=generator), dim=-1).half()
               for _ in range(num_queries)]
    return docs, queries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)
    from importlib.metadata import version

    from fast_plaid import search as fp_search

    docs, queries = fixture_inputs()
    out = pathlib.Path(args.out_dir)
    for nbits in (2, 4):
        folder = out / f"nbits{nbits}"
        index = fp_search.FastPlaid(index=str(folder / "index"), device=args.device)
        index.create(documents_embeddings=docs, nbits=nbits, seed=42)
        decompressed = index.get_embeddings(list(range(len(docs))))
        results = index.search(queries_embeddings=[q.float() for q in queries], top_k=10,
                               show_progress=False)
        index.close()
        torch.save({"docs": docs, "queries": queries,
                    "decompressed": [t.cpu() for t in decompressed], "results": results,
                    "fast_plaid": version("fast-plaid"), "torch": torch.__version__},
                   folder / "fixture.pt")
        listing = {p.name: p.stat().st_size for p in sorted((folder / "index").iterdir())}
        print(json.dumps({"nbits": nbits, "files": listing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
