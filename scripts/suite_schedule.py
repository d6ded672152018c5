"""Replay a test run's durations through pytest-xdist's schedulers (load, worksteal).

    python scripts/suite_schedule.py run.log order.txt --workers 2

The body, and its full description: recjax/tools/suite_schedule.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.suite_schedule import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
