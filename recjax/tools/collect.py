"""Runs -> one table: `python scripts/collect.py runs/sw/* [--keys K ...] [--format md|csv] [--out F]`.

One row per run directory holding a summary.json: the config keys whose values differ between
the runs (``section.field``), then the final metrics. ``--keys`` picks the columns instead (any
summary key such as ``eval_auc`` or ``examples_per_sec``, or a config key such as ``dense.lr``).
Paths without a readable run summary (unfinished runs; an empty, cut, list-shaped or
otherwise damaged summary.json) are named on stderr with the reason and counted, not tabled.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys

from recjax.runlog import read_summary

METRICS = ("steps", "train_ne", "eval_auc", "eval_ne", "eval_logloss", "examples_per_sec",
           "wall_seconds")


def _flat(config: dict) -> dict:
    return {f"{s}.{k}": v for s, fields in config.items() if isinstance(fields, dict)
            for k, v in fields.items()}


def collect(paths: list[str]) -> tuple[list[dict], list[tuple[str, str]]]:
    """(rows, skipped): a row per ``PATH/summary.json`` (or a summary.json given directly);
    ``(path, why)`` for each path without a readable run summary."""
    rows, skipped = [], []
    for path in paths:
        f = path if path.endswith(".json") else os.path.join(path, "summary.json")
        s, why = read_summary(f)
        if s is None:
            skipped.append((path, why))
            continue
        run = os.path.basename(os.path.dirname(os.path.abspath(f)))
        rows.append({"run": run, **_flat(s.get("config", {})),
                     **{k: v for k, v in s.items() if k != "config"}})
    return rows, skipped


def columns(rows: list[dict], keys: list[str] | None) -> list[str]:
    """``run``, then `keys`, or the config keys that differ between rows and `METRICS`."""
    if keys:
        return ["run", *keys]
    config_keys = sorted({k for r in rows for k in r if "." in k})
    differ = [k for k in config_keys if len({json.dumps(r.get(k)) for r in rows}) > 1]
    return ["run", *differ, *(m for m in METRICS if any(m in r for r in rows))]


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def render(rows: list[dict], cols: list[str], fmt: str) -> str:
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(cells)
        return buf.getvalue()
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run directories (each with a summary.json)")
    p.add_argument("--keys", nargs="+", help="columns: summary keys or section.field config keys")
    p.add_argument("--format", choices=("md", "csv"), default="md")
    p.add_argument("--out", help="write the table here (default: stdout)")
    args = p.parse_args(argv)
    rows, skipped = collect(args.runs)
    for path, why in skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    if skipped:
        print(f"{len(skipped)} of {len(args.runs)} paths skipped", file=sys.stderr)
    if not rows:
        print("error: no run with a summary.json among the paths given", file=sys.stderr)
        return 2
    text = render(rows, columns(rows, args.keys), args.format)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0

