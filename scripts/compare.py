"""Studies that reproduce a paper's claims with seeds and verdict rules, written to runs/.

    python scripts/compare.py shadowsync [--quick | --smoke] [--seeds 0,1,2] [--out DIR]
        [--doc docs/shadowsync.md]  (scripts/studies/shadowsync.py)
    python scripts/compare.py gba [--quick] [--seeds 0,1] [--out DIR]  (scripts/studies/gba.py)
    python scripts/compare.py persia [--quick] [--seeds 0,1] [--out DIR]
        (scripts/studies/persia.py)

Each study is a declarative file in scripts/studies/ run by the study kit (recjax/study: arms x
seeds from shared checkpoints or from scratch, paired intervals, verdicts; run again, it skips
what it finished). Each writes its results (JSON, markdown, figure) to ``--out`` (default
runs/compare_NAME, or runs/compare_NAME_quick / _smoke); a tracked doc under docs/ is written
only when asked (``--doc docs/NAME.md``, between its generated-section markers). Data paths
come from ``--data`` or $RECJAX_DATA (default ../shared/data next to the checkout).
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

FILES = pathlib.Path(__file__).resolve().parent / "studies"
STUDIES = sorted(p.stem for p in FILES.glob("*.py"))  # one declarative file per study


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in STUDIES:
        print(__doc__, file=sys.stderr)
        print(f"compare.py: first argument must be one of {', '.join(STUDIES)}", file=sys.stderr)
        return 2
    import algorithms
    from recjax import study

    return study.run_file(str(FILES / f"{argv[0]}.py"), argv[1:], algorithms.run)


if __name__ == "__main__":
    raise SystemExit(main())
