"""The dense op's default call under a kernel switch the host sets, side by side with the switch
as the host sets it and with the peers, in alternated rounds on one machine.

    python -m experiments.bench_dense_variants [--cells NAME ...] [--rounds 5] [--out DIR]

A grid run times each cell once, minutes apart from the run it is compared with (and days from
the runs before it), and a cell moves 5-10 % between runs. Here every variant of a cell is timed
in each round, in turn, on the same inputs (each round starting one call further on), and the
round medians are compared. Variants:

* ``default``: what ``maxsim_packed`` / ``maxsim_padded`` do with their default arguments;
* ``int64 rows`` / ``int32 rows``: the same launch with 64-bit / 32-bit row offsets within a
  document (the kernel's ``TOKENS_I32``; the default takes 32-bit ones where d is one chunk);
* ``masked rows`` / ``repeated rows``: the same launch with a tile's rows past a document's end
  masked to -inf in every product, or re-read as its last row (the kernels' ``REPEAT_ROWS``; the
  default repeats them for several queries and for one query at d <= 64);
* ``flat documents`` / ``loop per document``: the default launch, where it holds the query over
  packed documents, with the tiles of a program's documents walked as one loop
  (``_maxsim_packed_flat_kernel``: the pipeline runs across document boundaries), or with a loop
  per document (the default walks one query's short documents as one loop);
* ``length order``, ``order given``: the default launch where it takes the slots kernel, with
  the tiles' documents in order of length (``MaxSimConfig.length_order``: a tile runs to its
  longest document, so documents of like length share it), or in the order given;
* ``slots 8x16 by length``: every several-query launch over packed documents as the slots
  kernel in order of length, 8 documents of 16-token slots (a 128-column product: half the query
  operand's shared-memory reads of a 64-column one; the default's for a full 128-row block over
  many documents, not yet for queries of up to 16 tokens), the default's query blocks;
* ``held block``: several queries' full 128-row blocks held in registers across 8 documents
  in 32-token tiles (the default's before 8 x 16 slots; still a split query's head that holds
  its tail);
* ``tail apart``: a split query's tail (``dense.default_query_chunks``) in a second launch
  of its own where the default holds it beside the head (``dense.tail_joins_head``): the head
  then takes 8 x 16 slots, the tail its own config, and the documents are read twice;
* ``masked remainder`` / ``widest chunks``: the default launch with d's last chunk, where d
  is past its whole chunks by a power of two, as a whole chunk masked past d instead of a
  narrower one of its own (the tiled kernels' ``REM_D``); or, where the default holds one query
  in chunks of d, in the widest chunks (up to 128 columns) that leave such a remainder
  (d = 144 as 128 + 16 instead of 4 x 32 + 16);
* ``per document`` / ``held query``: one query's launch over many packed documents as the
  per-document tiles the default takes below ``dense.MANY_DOCS`` documents, or as a card of
  any bandwidth takes it (the default takes per-document tiles for long documents on a card
  of less bandwidth than ``dense.PER_DOCUMENT_MAX_BANDWIDTH``; the held query, or at d past
  128 columns the held or streamed chunks);
* ``slower card``: one query's default as a card of less bandwidth than that takes it (an
  H100's), on any card: the per-document rules' choice where the card has them off;
* ``validate=False``: the default launch without the checks' host work.

Each of our rows also carries ``graph_ms``, its call replayed from a CUDA graph (GPU time
alone, captured under its switch): where ``ms`` exceeds it, the call is bound by the host's
work, not the kernel, and variants within the rounds' spread are compared by it.

Every switch's scores are checked equal to the default's up to fp32 rounding (the switches
change addressing, not arithmetic). The peers (flash-maxsim, late-interaction-kernels) are
timed in the same rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
from pathlib import Path
from unittest import mock

import torch

from experiments import bench, harness
from experiments import bench_grid as bg
from tilemaxsim_plaid.ops import dense

SUITE = "dense_variants"
# Cells where the grid moved most between runs (d = 192-768 at short and long documents), the
# headline, the lowest several-query cells and one query of 48-64 tokens, as changes from
# bench_grid's HEADLINE.
CELLS = {
    "headline": {},
    "d192-lognormal-30": {"d": 192, "dist": "lognormal-30"},
    "d64-lognormal-30": {"d": 64, "dist": "lognormal-30"},
    "d128-lognormal-30": {"dist": "lognormal-30"},
    "d256-lognormal-30": {"d": 256, "dist": "lognormal-30"},
    "d256-lognormal-70": {"d": 256},
    "d256-heavy-512": {"d": 256, "dist": "heavy-512"},
    "d256-lognormal-150": {"d": 256, "dist": "lognormal-150"},
    "d256-uniform": {"d": 256, "dist": "uniform-1-300"},
    "d512": {"d": 512},
    "d512-uniform": {"d": 512, "dist": "uniform-1-300"},
    "d384-lognormal-70": {"d": 384},
    "d512-Lq31": {"d": 512, "Lq": 31},
    "d512-lognormal-150": {"d": 512, "dist": "lognormal-150"},
    "d768-Lq31": {"d": 768, "Lq": 31},
    "Lq64": {"Lq": 64},
    "d64-Lq64": {"d": 64, "Lq": 64},
    "d144-Lq48": {"d": 144, "Lq": 48},
    "B4": {"B": 4},
    "B4-Lq33": {"B": 4, "Lq": 33},
    "B16-Lq16": {"B": 16, "Lq": 16},
    "B32-Lq8": {"B": 32, "Lq": 8},
    "B32-Lq33": {"B": 32, "Lq": 33},
    "B16-Lq8": {"B": 16, "Lq": 8},
    "B32-Lq16": {"B": 32, "Lq": 16},
    "B16": {"B": 16},
    "B32": {"B": 32},
    "B4-Lq64": {"B": 4, "Lq": 64},
    "B16-Lq64": {"B": 16, "Lq": 64},
    "B4-Lq48": {"B": 4, "Lq": 48},
    "B16-Lq48": {"B": 16, "Lq": 48},
    "B32-Lq48": {"B": 32, "Lq": 48},
    "B4-padded": {"B": 4, "layout": "padded", "dist": bg.PADDED_DIST},
    "d64": {"d": 64},
    "d64-Lq16": {"d": 64, "Lq": 16},
    "d64-Lq24": {"d": 64, "Lq": 24},
    "d64-lognormal-150": {"d": 64, "dist": "lognormal-150"},
    "d64-heavy-512": {"d": 64, "dist": "heavy-512"},
    "d64-uniform": {"d": 64, "dist": "uniform-1-300"},
    "d80": {"d": 80},
    "d96-lognormal-30": {"d": 96, "dist": "lognormal-30"},
    "d144-lognormal-30": {"d": 144, "dist": "lognormal-30"},
    "d144-Lq64": {"d": 144, "Lq": 64},
    "d96-Lq48": {"d": 96, "Lq": 48},
    "d192-Lq64": {"d": 192, "Lq": 64},
    "d256-Lq48": {"d": 256, "Lq": 48},
    "d384-lognormal-30": {"d": 384, "dist": "lognormal-30"},
    "d768-lognormal-30": {"d": 768, "dist": "lognormal-30"},
    "d512-heavy-512": {"d": 512, "dist": "heavy-512"},
    "d144-Lq16": {"d": 144, "Lq": 16},
    "d144": {"d": 144},
    "d144-Lq33": {"d": 144, "Lq": 33},
    "d96": {"d": 96},
    "d160": {"d": 160},
    "d96-Lq33": {"d": 96, "Lq": 33},
    "d96-Lq64": {"d": 96, "Lq": 64},
    "d192-Lq33": {"d": 192, "Lq": 33},
    "d192-Lq48": {"d": 192, "Lq": 48},
    "d144-padded": {"d": 144, "layout": "padded", "dist": bg.PADDED_DIST},
    "d160-padded": {"d": 160, "layout": "padded", "dist": bg.PADDED_DIST},
    "d320-padded": {"d": 320, "layout": "padded", "dist": bg.PADDED_DIST},
}
# The cells each switch was added for (gpu_suite's variants and dense-rows suites): row offsets;
# rows past a document's end and flat documents (several queries, one query of 48-64 tokens,
# short documents); one query's rows past a document's end at d = 64 beside d = 80 and 96.
ROW_OFFSET_CELLS = ("headline", "d192-lognormal-30", "d64-lognormal-30", "d128-lognormal-30",
                    "d256-lognormal-30", "d256-lognormal-70", "d256-heavy-512",
                    "d384-lognormal-70", "d512-Lq31", "d512-lognormal-150", "d768-Lq31")
TILE_WALK_CELLS = ("headline", "d128-lognormal-30", "d64-lognormal-30", "Lq64", "d64-Lq64",
                   "d144-Lq48", "B4", "B4-Lq33", "B16-Lq16", "B32-Lq8", "B32-Lq33", "B4-padded")
NARROW_ROW_CELLS = ("d64", "d64-Lq16", "d64-Lq24", "d64-lognormal-150", "d64-heavy-512",
                    "d64-uniform", "d80", "d96-lognormal-30")
# Several queries over packed documents: the slots kernel's cells (Lq <= 16, and B = 4 at
# Lq = 33 as 32 + 1 tokens) and the held query block's (Lq 17-64).
SEVERAL_QUERY_CELLS = ("B4", "B4-Lq33", "B16-Lq16", "B32-Lq8", "B32-Lq33", "B16-Lq8",
                       "B32-Lq16", "B16", "B32", "B4-Lq64", "B16-Lq64")
# Several queries split into a 32-token head and a 16-token tail that joins the head's launch
# (dense.tail_joins_head).
JOINED_TAIL_CELLS = ("B4-Lq48", "B16-Lq48", "B32-Lq48")
# One query's short documents, where the default walks them as one loop (flat documents).
SHORT_DOC_CELLS = ("d64-lognormal-30", "d96-lognormal-30", "d128-lognormal-30",
                   "d144-lognormal-30", "d192-lognormal-30", "d256-lognormal-30")
# One query at a d whose held chunks leave a remainder (d = 80 and 144 in 32-column chunks) or
# could take wider chunks that do (d = 96, 160 and 192): one-warp and 64-row held blocks, flat
# documents, and the padded layout at d = 144, 160 and 320.
REMAINDER_CELLS = ("d144-Lq16", "d144", "d144-Lq33", "d144-Lq48", "d144-Lq64",
                   "d144-lognormal-30", "d96", "d96-Lq48", "d96-lognormal-30", "d80",
                   "d160", "d192-Lq64", "d144-padded", "d160-padded", "d320-padded")
# One query of 33-64 tokens held as a 64-row block across 4 warps in chunks of d (32 columns at
# d = 96 and 144, 64 at d = 192).
HELD_BLOCK_CELLS = ("d144-Lq33", "d144-Lq48", "d144-Lq64", "d96-Lq33", "d96-Lq48", "d96-Lq64",
                    "d192-Lq33", "d192-Lq48", "d192-Lq64")
PEERS = ("flash_maxsim", "late_interaction_kernels")


def _rows_switch(rule):
    return mock.patch.object(dense, "_tokens_i32", rule)


def _int32_wherever_they_fit(rows, num_d_tiles, block_d, stride_dt, stride_dd):
    return dense._row_offsets_fit_int32(rows, num_d_tiles * block_d, stride_dt, stride_dd)


def _repeat_switch(repeat: bool):
    return mock.patch.object(dense, "_repeat_rows", lambda num_queries, config, dim: repeat)


def _config_switch(rule):
    """dense.default_config replaced by ``rule(config, num_queries, variable_lengths, held)``:
    ``config`` the default's, ``held()`` the default's for a head that holds its split query's
    tail (joins_tail). Such a head keeps its held block, the only one that holds a tail."""
    saved = dense.default_config

    def config(num_queries, Lq, max_doc_len, dim, variable_lengths=False, num_docs=0,
               element_size=2, joins_tail=False, **kwargs):
        cfg = saved(num_queries, Lq, max_doc_len, dim, variable_lengths, num_docs, element_size,
                    joins_tail, **kwargs)
        if joins_tail and cfg.hold_query:
            return cfg
        return rule(cfg, num_queries, variable_lengths, lambda: saved(
            num_queries, Lq, max_doc_len, dim, variable_lengths, num_docs, element_size, True,
            **kwargs))

    return mock.patch.object(dense, "default_config", config)


def _length_order_switch(docs: int | None = None, slot: int | None = None, on: bool = True):
    """The default's slots configs in order of length (``on``) or in the order given; with
    ``docs`` and ``slot``, every several-query config over packed documents as slots of
    ``docs`` documents of ``slot`` tokens in order of length, with the default's query
    blocks."""
    def rule(cfg, num_queries, variable_lengths, held):
        if docs is None:
            return dataclasses.replace(cfg, length_order=on) if cfg.slots else cfg
        if num_queries > 1 and variable_lengths and (cfg.slots or cfg.hold_query):
            return dense.MaxSimConfig(block_t=slot, queries_per_block=cfg.queries_per_block,
                                      docs_per_program=docs, slots=True, num_warps=4,
                                      num_stages=2, length_order=True)
        return cfg

    return _config_switch(rule)


def _held_block_switch():
    """Several queries' full 128-row blocks over many packed documents held in registers across
    documents (the default's before eight documents a tile took them; a head holding its tail
    keeps it)."""
    return _config_switch(lambda cfg, num_queries, variable_lengths, held:
                          held() if num_queries > 1 and variable_lengths else cfg)


def _tail_apart_switch():
    """A split query's tail in a launch of its own, never held beside the head (the head then
    takes the default's config for its rows alone: 8 x 16 slots where its block is full)."""
    return mock.patch.object(dense, "tail_joins_head", lambda *args, **kwargs: False)


def _flat_switch(flat: bool):
    return mock.patch.object(
        dense, "_flat_documents", lambda num_queries, config, packed, tail_tokens, mean_tokens:
        flat and dense._flat_applies(config, packed, tail_tokens))


def _masked_remainder_switch():
    return mock.patch.object(dense, "_remainder_chunk", lambda dim, block_d: 0)


def _widest_chunks_switch():
    """One query's default held in chunks of d (block_d set) taken in the widest chunks."""
    saved = dense.default_config

    def config(num_queries, Lq, max_doc_len, dim, *args, **kwargs):
        cfg = saved(num_queries, Lq, max_doc_len, dim, *args, **kwargs)
        if num_queries == 1 and cfg.hold_query and cfg.block_d is not None:
            return dataclasses.replace(cfg, block_d=dense._widest_chunk(dim) or dense.MIN_DOT_DIM)
        return cfg

    return mock.patch.object(dense, "default_config", config)


def _held_query_switch():
    """One query's default as a card of any bandwidth takes it, where the default takes
    per-document tiles on a card of less bandwidth than dense.PER_DOCUMENT_MAX_BANDWIDTH."""
    saved = dense.default_config
    return mock.patch.object(dense, "default_config",
                             lambda *args, **kwargs: saved(*args, **{**kwargs,
                                                                     "read_bandwidth": None}))


def _slower_card_switch():
    """One query's default as a card of less bandwidth than dense.PER_DOCUMENT_MAX_BANDWIDTH
    takes it (an H100), whatever this card's: the per-document rules' choice on a card where
    they are off (any bandwidth under the bound decides alike)."""
    saved = dense.default_config
    slower = dense.PER_DOCUMENT_MAX_BANDWIDTH / 2
    return mock.patch.object(dense, "default_config",
                             lambda *args, **kwargs: saved(*args, **{**kwargs,
                                                                     "read_bandwidth": slower}))


def _per_document_switch():
    """One query's held default (several documents a program) replaced by the default's
    per-document tiles for the same shape (what it takes below MANY_DOCS documents)."""
    saved = dense.default_config

    def config(num_queries, Lq, max_doc_len, dim, variable_lengths=False, num_docs=0,
               *args, **kwargs):
        cfg = saved(num_queries, Lq, max_doc_len, dim, variable_lengths, num_docs, *args,
                    **kwargs)
        if num_queries == 1 and cfg.hold_query:
            return saved(num_queries, Lq, max_doc_len, dim, variable_lengths, 0, *args, **kwargs)
        return cfg

    return mock.patch.object(dense, "default_config", config)


VARIANTS = {"default": contextlib.nullcontext,
            "int64 rows": lambda: _rows_switch(lambda *args: False),
            "int32 rows": lambda: _rows_switch(_int32_wherever_they_fit),
            "masked rows": lambda: _repeat_switch(False),
            "repeated rows": lambda: _repeat_switch(True),
            "flat documents": lambda: _flat_switch(True),
            "loop per document": lambda: _flat_switch(False),
            "length order": _length_order_switch,
            "order given": lambda: _length_order_switch(on=False),
            "slots 8x16 by length": lambda: _length_order_switch(8, 16),
            "held block": _held_block_switch,
            "tail apart": _tail_apart_switch,
            "masked remainder": _masked_remainder_switch,
            "widest chunks": _widest_chunks_switch,
            "per document": _per_document_switch,
            "held query": _held_query_switch,
            "slower card": _slower_card_switch}


def make_cell(name: str, sizing: bg.Sizing) -> bg.Cell:
    if name not in CELLS:
        raise ValueError(f"unknown cell {name!r}; known: {', '.join(CELLS)}")
    p = {**bg.HEADLINE, **CELLS[name]}
    return bg.Cell(p["B"], p["Lq"], p["d"], p["dtype"], p["layout"], p["dist"],
                   bg.num_docs(p["dist"], p["d"], p["dtype"], sizing))


def _same_scores(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to fp32 rounding: validate=False without max_doc_len may take another launch
    config than the default (several queries: held tiles instead of single ones), and the CPU
    interpreter's numpy products may round a repeated row's copies apart in the last bit
    (tests/kernels/test_maxsim_dense.py holds the switches bit for bit on a GPU)."""
    return torch.equal(got, want) or torch.allclose(got, want, rtol=1e-6, atol=0.0,
                                                    equal_nan=True)


def run_cell(cell: bg.Cell, rounds: int, time_fn, ceilings: dict, device,
             variants=tuple(VARIANTS)) -> list[dict]:
    x = bg.make_inputs(cell, device)
    case = bg.bench_case(cell, x)
    ours = bg.provider_ours(cell, x)
    want = ours()
    calls = {}
    for variant in dict.fromkeys(("default", *variants)):
        switch = VARIANTS[variant]
        with switch():
            got = ours()  # compiles the variant's specialisation outside the timed rounds
        if not _same_scores(got, want):
            raise AssertionError(f"{cell.name}: variant {variant!r} does not score as the default")
        calls[variant] = (switch, ours)
    unchecked = bg.provider_ours(cell, x, validate=False)
    if not _same_scores(unchecked(), want):
        raise AssertionError(f"{cell.name}: validate=False does not score as the default")
    calls["validate=False"] = (contextlib.nullcontext, unchecked)
    for peer in PEERS:
        fn = bench.PROVIDERS[peer](case, x)
        if fn is not None:
            fn()
            calls[peer] = (contextlib.nullcontext, fn)
    times = {name: [] for name in calls}
    for r in range(rounds):
        for name in harness.round_order(list(calls), r):
            switch, fn = calls[name]
            with switch():
                times[name].append(time_fn(fn))
    nbytes, flops = bg.bytes_and_flops(cell, x)
    ours_names = [name for name in calls if name not in PEERS]
    rows = []
    for name, samples in times.items():
        ms = statistics.median(t[0] for t in samples)
        rows.append(harness.make_row(
            SUITE, cell.name, "tilemaxsim" if name in ours_names else name,
            (ms, min(t[0] for t in samples), max(t[0] for t in samples)),
            num_docs=cell.N * cell.B, nbytes=nbytes, flops=flops, ceilings=ceilings,
            variant=name if name in ours_names else None, rounds=[t[0] for t in samples]))
    if device.type == "cuda":
        for row in rows:
            if row["variant"] is not None:
                switch, fn = calls[row["variant"]]
                with switch():
                    row["graph_ms"] = harness.graph_replay_ms(fn)
    base = next(r["ms"] for r in rows if r["variant"] == "default")
    peers = [r["ms"] for r in rows if r["variant"] is None]
    for row in rows:
        row["ratio_to_default"] = base / row["ms"]
        row["ratio_to_best_peer"] = min(peers) / row["ms"] if peers else None
    return rows


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        choices=list(VARIANTS),
                        help="variants timed beside the default (which is always timed)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-docs", type=int, default=bg.MAX_DOCS,
                        help="documents per cell at most (a CPU smoke run takes a few)")
    parser.add_argument("--out", default="results/dense_variants")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    ceilings = harness.measure_ceilings() if cuda else {}
    time_fn = (lambda fn: harness.time_ms(fn, warmup_ms=25, rep_ms=200)) if cuda else bg.wall_clock_ms
    sizing = bg.Sizing(max_docs=args.max_docs)
    meta = {"rounds": args.rounds,
            "variants": [*dict.fromkeys(["default", *args.variants]), "validate=False"]}
    rows = []
    for name in args.cells:
        cell = make_cell(name, sizing)
        rows += run_cell(cell, args.rounds, time_fn, ceilings, device, args.variants)
        for row in rows:
            if row["shape"] == cell.name:
                label = row["variant"] or row["provider"]
                graph = f"  graph {row['graph_ms']:.4f} ms" if "graph_ms" in row else ""
                print(f"{cell.name:58s} {label:26s} {row['ms']:8.4f} ms  "
                      f"x default {row['ratio_to_default']:.3f}  x best peer "
                      f"{row['ratio_to_best_peer'] or float('nan'):.3f}{graph}", flush=True)
        # Written after every cell, so a run stopped early keeps the cells it finished.
        path = harness.write_results(rows, args.out, SUITE, ceilings=ceilings,
                                     meta={**meta, "cells_done": len({r["shape"] for r in rows})})
    print(harness.provenance_line(harness.provenance(), ceilings))
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
