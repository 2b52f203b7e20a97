"""Pool the result files of ``experiments/equivalence.py`` run over ranges of queries.

A long run (k = 1000 on the CPU takes about half a second per query) goes in ranges
(``--start-query``, ``--limit-queries``), one result file each. This writes, per k, the fractions
over all queries of all files (each file weighted by its query count) and every example query
number, after checking that the ranges do not overlap and that they share one setting::

    python -m experiments.equivalence_pool OUT results/equivalence/a/equivalence.json ...
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from .harness import write_results

# Fractions of queries; everything else in a row is a setting, a count or a list of examples.
FRACTIONS = ("candidates_equal", "candidates_ties", "topk_exact", "topk_exact_ties",
             "topk_equal_stock", "topk_same_set_stock")
SETTINGS = ("ncells", "centroid_score_threshold", "ndocs")


def pool(rows: list[dict]) -> list[dict]:
    """One row per k: query-weighted fractions, summed queries and seconds, all examples."""
    by_k: dict[int, list[dict]] = {}
    for row in rows:
        by_k.setdefault(row["k"], []).append(row)
    pooled = []
    for k, group in sorted(by_k.items()):
        ranges = sorted((row.get("first_query", 0), row.get("first_query", 0) + row["queries"])
                        for row in group)
        for (_, end), (start, _) in zip(ranges, ranges[1:]):
            if start < end:
                raise ValueError(f"k = {k}: query ranges overlap: {ranges}")
        for name in SETTINGS:
            if len({row[name] for row in group}) != 1:
                raise ValueError(f"k = {k}: the files differ in {name}: {[row[name] for row in group]}")
        total = sum(row["queries"] for row in group)
        out = {"k": k, "queries": total, "ranges": ranges, **{name: group[0][name] for name in SETTINGS}}
        for name in FRACTIONS:
            out[name] = sum(row[name] * row["queries"] for row in group) / total
        for name in sorted({key for row in group for key in row if key.endswith("_examples")}):
            out[name] = sorted(number for row in group for number in row.get(name, []))
        out["seconds"] = round(sum(row["seconds"] for row in group), 1)
        pooled.append(out)
    return pooled


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="equivalence_pool", description=__doc__.split("\n")[0])
    parser.add_argument("out", help="folder for the pooled equivalence.json / .csv")
    parser.add_argument("files", nargs="+", help="equivalence.json files of disjoint query ranges")
    args = parser.parse_args(argv)
    documents = [json.loads(pathlib.Path(path).read_text()) for path in args.files]
    rows = pool([row for document in documents for row in document["rows"]])
    meta = {"pooled_from": [{"file": str(path), "commit": document.get("provenance", {}).get("commit")}
                            for path, document in zip(args.files, documents)],
            "argv": sys.argv}
    path = write_results(rows, args.out, "equivalence", meta=meta)
    for row in rows:
        print(json.dumps({key: value for key, value in row.items() if not key.endswith("_examples")}))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
