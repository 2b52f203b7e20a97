"""``tilemaxsim`` command line: one entry point, each subcommand a ``main(argv)`` of its own module.

    tilemaxsim bench              dense kernels vs torch, colbert-ai and public kernels (GPU)
    tilemaxsim bench-compressed   residual-code and PQ kernels (GPU)
    tilemaxsim bench-plaid        end-to-end PLAID search and rerank, stock vs patched (GPU)
    tilemaxsim bench-distributed  multi-GPU sharded scoring (torchrun)
    tilemaxsim reproduce CONFIG   a reproduction table from configs/*.yaml
    tilemaxsim synthesize         a synthetic PLAID index in colbert-ai's on-disk format
    tilemaxsim pq-agreement       PQ ranking agreement vs exact MaxSim
    tilemaxsim equivalence CONFIG candidate sets and top-k vs stock and vs exact MaxSim, per query
    tilemaxsim plots FILE         plots of a dense benchmark result file
    tilemaxsim plots-plaid RUN..  plots of end-to-end PLAID benchmark runs
"""

from __future__ import annotations

import importlib
import sys

# Subcommand -> module whose main(argv) runs it. Modules are imported only when asked for, so
# `tilemaxsim --help` needs neither a GPU nor colbert-ai.
COMMANDS = {
    "bench": "experiments.bench",
    "bench-compressed": "experiments.bench_compressed",
    "bench-plaid": "experiments.bench_plaid",
    "bench-distributed": "experiments.bench_distributed",
    "reproduce": "experiments.reproduce",
    "synthesize": "experiments.synthesize",
    "pq-agreement": "experiments.pq_agreement",
    "equivalence": "experiments.equivalence",
    "plots": "experiments.plots_bench",
    "plots-plaid": "experiments.plots_plaid",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command])
    result = module.main(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
