"""Mutation testing of chosen modules with mutmut, each against only its own tests.

    python scripts/mutants.py                       # every group, the working tree
    python scripts/mutants.py metrics routing       # some groups
    python scripts/mutants.py --rev 738e4ce metrics # the tree of a commit (the "before" numbers)
    python scripts/mutants.py codec --only runs/before.json  # re-run only that report's survivors
    python scripts/mutants.py routing --tests tests/test_routing_props.py  # a quick first pass

The body, and its full description: recjax/tools/mutants.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.mutants import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
