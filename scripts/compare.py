"""Studies that reproduce a paper's claims with seeds and verdict rules, written to runs/.

    python scripts/compare.py shadowsync [--quick] [--seeds 0,1,2] [--out runs/compare_shadowsync]
    python scripts/compare.py gba [--quick] [--seeds 0,1] [--out runs/compare_gba]  (scripts/studies/gba.py)
    python scripts/compare.py persia [--quick] [--seeds 0,1] [--out runs/compare_persia]
        (scripts/studies/persia.py)

A study with a declarative file in scripts/studies/ runs through the study kit (recjax/study:
arms x seeds from shared checkpoints or from scratch, paired intervals, verdicts; run again, it
skips what it finished). Each study writes its results (JSON, markdown, figures) to ``--out``; a
tracked doc under docs/ is written only when asked (``--doc docs/NAME.md``). Data paths come
from ``--data`` or $RECJAX_DATA (default ../shared/data next to the checkout). ``shadowsync``
(Zheng et al., arXiv 2003.03477) is scripts/compare_shadowsync.py; its verdict rules are
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
    path = pathlib.Path(__file__).resolve().parent / "studies" / f"{argv[0]}.py"
    if path.exists():  # a declarative study file, run by the study kit (recjax/study)
        import algorithms
        from recjax import study

        return study.main(study.load(str(path)), argv[1:], algorithms.run)
    from scripts import compare_shadowsync

    return compare_shadowsync.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
