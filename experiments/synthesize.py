"""Write a synthetic PLAID index in colbert-ai's on-disk format (see tilemaxsim_plaid.synthetic).

``tilemaxsim synthesize OUT_DIR --passages 1000000 [--dim 128] [--nbits 2] [--seed 0]``
``tilemaxsim synthesize OUT_DIR --verify``  (check a written index chunk by chunk, write nothing)

The folder is the index: ``Searcher(index=OUT_DIR.name, index_root=OUT_DIR.parent, checkpoint=...)``
or ``IndexScorer(OUT_DIR)`` load it. Rerunning the same command finishes an interrupted write
(chunks already on disk are kept). MS MARCO's 8.8M passages need about 21 GiB of disk at dim
128, nbits 2; memory peaks while the inverted lists are built at the end (their (centroid, pid)
pairs, ~4 GB at that size, plus the lists themselves).
"""

from __future__ import annotations

import argparse
import json
import sys

from tilemaxsim_plaid.synthetic import (MSMARCO_PASSAGES, SyntheticIndexSpec, verify_synthetic_index,
                                        write_synthetic_index)

__all__ = ["main"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tilemaxsim synthesize", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", help="index folder to write (its name is the index name)")
    parser.add_argument("--passages", type=int, default=1_000_000,
                        help=f"number of passages (MS MARCO: {MSMARCO_PASSAGES:,}; default 1,000,000)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--nbits", type=int, default=2, choices=(1, 2, 4))
    parser.add_argument("--doclen-median", type=float, default=SyntheticIndexSpec.doclen_median)
    parser.add_argument("--num-queries", type=int, default=SyntheticIndexSpec.num_queries)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="checkpoint recorded in the index (for text queries)")
    parser.add_argument("--verify", action="store_true",
                        help="only check the index already at OUT_DIR (exit 1 with the broken file named)")
    args = parser.parse_args(argv)
    if args.verify:
        try:
            print(json.dumps(verify_synthetic_index(args.out_dir), indent=2))
        except (ValueError, FileNotFoundError) as error:
            print(f"tilemaxsim synthesize --verify: {error}", file=sys.stderr)
            return 1
        return 0
    spec = SyntheticIndexSpec(num_passages=args.passages, dim=args.dim, nbits=args.nbits,
                              doclen_median=args.doclen_median, num_queries=args.num_queries,
                              seed=args.seed, checkpoint=args.checkpoint)
    manifest = write_synthetic_index(spec, args.out_dir)
    print(json.dumps({key: value for key, value in manifest.items() if key != "spec"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
