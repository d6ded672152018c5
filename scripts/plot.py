"""Overlaid training curves of runs: `python scripts/plot.py RUN_DIR... --y eval_ne --x examples`.

The body and its full help are recjax/tools/plot.py (``--help``).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.plot import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
