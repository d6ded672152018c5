"""Studies that reproduce a paper's claims with seeds and verdict rules, written to runs/.

    python scripts/compare.py shadowsync [--quick] [--seeds 0,1,2] [--out runs/compare_shadowsync]
    python scripts/compare.py gba [--quick] [--out runs/compare_gba]      (scripts/compare_gba.py)
    python scripts/compare.py persia [--quick] [--out runs/compare_persia] (scripts/compare_persia.py)

Each study writes its results (JSON, markdown, figures) to ``--out``; a tracked doc under docs/
is written only when asked (``--doc`` / ``--write-docs``). Data paths come from ``--data`` or
$RECJAX_DATA (default ../shared/data next to the checkout). ``shadowsync`` (Zheng et al.,
arXiv 2003.03477) is scripts/compare_shadowsync.py; its verdict rules are
scripts/shadowsync_verdicts.py.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

STUDIES = ("shadowsync", "gba", "persia")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in STUDIES:
        print(__doc__, file=sys.stderr)
        print(f"compare.py: first argument must be one of {', '.join(STUDIES)}", file=sys.stderr)
        return 2
    if argv[0] == "gba":
        from scripts import compare_gba as study
    elif argv[0] == "persia":
        from scripts import compare_persia as study
    else:
        from scripts import compare_shadowsync as study
    return study.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
