"""Runs -> one table: `python scripts/collect.py runs/sw/* [--keys K ...] [--format md|csv] [--out F]`.

The body and its full help are recjax/tools/collect.py (``--help``).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.collect import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
