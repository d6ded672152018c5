"""Overlaid training curves of runs: `python scripts/plot.py RUN_DIR... --y eval_ne --x examples`.

Reads each run's metrics.jsonl (and summary.json for its label) and draws one line per run,
each with its own colour, dash and marker, into an SVG (vector, text kept as text) and a PNG
beside it. ``--y`` is a field of the records: ``eval_ne`` / ``eval_auc`` / ``eval_logloss``
(``kind: eval``), ``train_ne`` / ``train_ne_window`` / ``loss`` (``kind: train``), or any
counter (``avg_sync_gap``, ``mean_staleness``, ...; ``kind: counters``). ``--x``: ``step``,
``examples`` (step x global batch) or ``seconds`` (wall seconds, or virtual seconds for
``--deterministic`` runs, read off the train records).

    python scripts/plot.py runs/easgd runs/bmuf --y eval_ne --x examples --out docs/fig.svg
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.plot import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
