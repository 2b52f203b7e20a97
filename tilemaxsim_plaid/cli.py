"""``tilemaxsim`` command line: one entry point, each subcommand the ``main(argv)`` of its module.

The experiments install with the package (``tilemaxsim_plaid.experiments``, the checkout's
``experiments/``); a subcommand's module is imported only when that subcommand runs, so
``tilemaxsim --help`` and ``--version`` import neither torch nor colbert-ai.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand -> (module, one line of help). A bare name is a module under experiments/; a
# dotted name is imported as it is (a module of the package).
COMMANDS = {
    "bench": ("bench", "dense kernels beside torch, colbert-ai and the public kernels (GPU)"),
    "bench-compressed": ("bench_compressed", "residual-code and PQ kernels (GPU)"),
    "bench-plaid": ("bench_plaid", "end-to-end PLAID search and rerank, stock vs patched (GPU)"),
    "bench-grid": ("bench_grid", "dense ops over a grid of shapes, dtypes and length distributions (GPU)"),
    "bench-distributed": ("bench_distributed", "multi-GPU sharded scoring (torchrun)"),
    "bench-engines": ("bench_engines", "stock colbert-ai, the plugin and fast-plaid on one compressed index (GPU)"),
    "report-engines": ("report_engines", "the engines report and plots from engines.json files"),
    "reproduce": ("reproduce", "a reproduction table from a config (path or shipped name)"),
    "synthesize": ("synthesize", "a synthetic PLAID index in colbert-ai's on-disk format"),
    "pq-agreement": ("pq_agreement", "PQ ranking agreement with exact MaxSim"),
    "equivalence": ("equivalence", "candidate sets and top-k against stock and exact MaxSim, per query"),
    "results": ("results_table", "results/TABLE.md and its plots from every committed result file"),
    "plots": ("plots_bench", "plots of a dense benchmark result file"),
    "plots-plaid": ("plots_plaid", "plots of end-to-end PLAID benchmark runs"),
    "plots-grid": ("plots_grid", "heatmaps of shape-grid benchmark result files"),
    "plots-validate": ("plots_validate", "validate=True's cost against the host's work per call"),
    "explain": ("tilemaxsim_plaid.explain", "which path each op and PLAID stage takes on this machine, and why"),
}


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("tilemaxsim-plaid")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _command_module(name: str):
    """The module of a COMMANDS entry (see there)."""
    return importlib.import_module(name) if "." in name else _experiment_module(name)


def _experiment_module(name: str):
    """The installed ``tilemaxsim_plaid.experiments.<name>``, or a checkout's ``experiments.<name>``."""
    try:
        return importlib.import_module(f"tilemaxsim_plaid.experiments.{name}")
    except ModuleNotFoundError as error:
        if error.name not in ("tilemaxsim_plaid.experiments", f"tilemaxsim_plaid.experiments.{name}"):
            raise
        return importlib.import_module(f"experiments.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilemaxsim",
        description="TileMaxSim-PLAID: benchmarks, reproduction tables and results.",
        epilog="`tilemaxsim COMMAND --help` shows a command's own options.",
    )
    parser.add_argument("--version", action="version", version=f"tilemaxsim-plaid {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, (_, help_text) in COMMANDS.items():
        # Each command parses its own options: everything after its name goes to its main().
        commands.add_parser(command, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 0
    # Options before the command are this parser's (--help, --version); the rest is the command's.
    split = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), len(argv) - 1)
    args = parser.parse_args(argv[: split + 1])
    if args.command is None:
        parser.print_help()
        return 2
    module = _command_module(COMMANDS[args.command][0])
    return int(module.main(argv[split + 1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
