"""Runs -> one table: `python scripts/collect.py runs/sw/* [--keys K ...] [--format md|csv] [--out F]`.

One row per run directory holding a summary.json: the config keys whose values differ between
the runs (``section.field``), then the final metrics. ``--keys`` picks the columns instead (any
summary key such as ``eval_auc`` or ``examples_per_sec``, or a config key such as ``dense.lr``).
Paths without a readable run summary (unfinished runs; an empty, cut, list-shaped or
otherwise damaged summary.json) are named on stderr with the reason and counted, not tabled.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.collect import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
