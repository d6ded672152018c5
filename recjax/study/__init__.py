"""The study kit: a paper's claims as a declarative file (arms, sizes, claims), run as arms x
seeds from shared checkpoints (or from scratch), scored by paired intervals (DESIGN.md
section 6).

    python scripts/compare.py gba --quick          # scripts/studies/gba.py through this kit
    python scripts/compare.py persia --quick       # scripts/studies/persia.py
    python scripts/compare.py shadowsync --quick   # scripts/studies/shadowsync.py

* `spec`: `Study`, `Arm`, `Size`, `Sweep`, `Claim` (what a study file declares);
* `runner`: `run_study`, the segments with skip/resume;
* `stats`: `paired`, `verdict` (held / did not hold / unresolved, with the MDE);
* `report`: markdown tables, verdicts, figure, the generated section of a doc;
* `data`: facts about a study's data (`id_alpha`) for ``Study.describe``.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time

from recjax.study.spec import Arm, Claim, Size, Study, Sweep

__all__ = ["Arm", "Claim", "Size", "Study", "Sweep", "load", "main"]


def load(path: str) -> Study:
    """The `Study` named ``STUDY`` in the study file at `path`.

    Raises:
      ValueError: naming the file (and the line, for a syntax error) and what is wrong.
    """
    try:
        study = runpy.run_path(path).get("STUDY")
    except SyntaxError as e:
        raise ValueError(f"{path}:{e.lineno}: {e.msg}") from e
    except (ValueError, TypeError) as e:  # a spec's own check (spec.py), or a wrong argument
        raise ValueError(f"{path}: {e}") from e
    if not isinstance(study, Study):
        raise ValueError(f"{path}: a study file defines STUDY = recjax.study.Study(...)")
    return study


def run_file(path: str, argv: list[str], run) -> int:
    """`main` of the study file at `path`: a file that does not load is one error line."""
    try:
        study = load(path)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return main(study, argv, run)


def main(study: Study, argv: list[str], run) -> int:
    """``compare.py NAME [--quick | --smoke] [--seeds 0,1] [--datasets a,b] [--out DIR]
    [--doc docs/NAME.md] [--agree-with OTHER_OUT]``.

    Args:
      run: ``algorithms.run`` (passed in: the library imports no algorithm).
    """
    from recjax.study import report, runner

    p = argparse.ArgumentParser(prog=f"compare.py {study.name}", description=study.title)
    p.add_argument("--quick", action="store_true", help="the quick size (< 3 minutes)")
    p.add_argument("--smoke", action="store_true", help="seconds-long runs (tests)")
    p.add_argument("--seeds", help="comma-separated seeds (default: the size's)")
    p.add_argument("--datasets", help=f"comma-separated subset of {', '.join(study.datasets)}")
    p.add_argument("--out", help="output folder (default runs/compare_NAME, or "
                   "runs/compare_NAME_quick / _smoke); a study run again there skips its "
                   "finished segments")
    p.add_argument("--data", help="folder the relative data paths are under (default "
                   "$RECJAX_DATA, else ../shared/data next to the checkout)")
    p.add_argument("--doc", help="also write the report into this markdown file (e.g. "
                   f"docs/{study.name}.md) between <!-- {study.name}-study:begin --> and "
                   f"<!-- {study.name}-study:end -->, the rest kept, and the figure next to it "
                   f"({study.name}_study.svg/png)")
    p.add_argument("--agree-with", help="another run of this study (its --out folder or "
                   f"{study.name}_study.json), e.g. with other seeds: the report gains a "
                   "table of the verdicts the two share and those they do not "
                   "(recjax/study/stability.py)")
    a = p.parse_args(argv)
    other = None
    if a.agree_with:  # read first: a bad path is an error before hours of runs
        from recjax.study import stability

        try:
            other = stability.load_verdicts(a.agree_with, study.name)
        except (OSError, ValueError) as e:
            print(f"error: --agree-with: {e}", file=sys.stderr)
            return 2
    if a.data:
        os.environ["RECJAX_DATA"] = a.data
    size = "smoke" if a.smoke else "quick" if a.quick else "full"
    a.out = a.out or os.path.join("runs", f"compare_{study.name}"
                                  + ("" if size == "full" else f"_{size}"))
    seeds = tuple(int(s) for s in a.seeds.split(",")) if a.seeds else None
    t0 = time.perf_counter()
    try:
        results = runner.run_study(study, size, a.out, run,
                                   a.datasets.split(",") if a.datasets else None, seeds,
                                   log=lambda s: print(s, flush=True))
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the finished segments are on disk
        from recjax.train.signals import exit_quietly

        exit_quietly(130)
        print(f"interrupted; the finished segments are kept in {a.out}: the same command "
              "goes on from them", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:  # a bad setting, a damaged file: a message
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not results:
        print("error: no dataset of the study could run (each one's reason is above)",
              file=sys.stderr)
        return 2
    facts = {ds: runner.describe(study, size, ds) for ds in results} if study.describe else {}
    secs = time.perf_counter() - t0
    command = " ".join(["python scripts/compare.py", study.name, *argv])
    base = os.path.join(a.out, f"{study.name}_study")
    verdicts = {ds: report.verdicts(study, rows, ds) for ds, rows in results.items()}
    stable, agreed = "", None
    if other is not None:
        agreed = stability.agreement(verdicts, other)
        stable = "\n" + stability.markdown(agreed, a.out, a.agree_with)
        print(stable)
    with open(base + ".json", "w") as f:
        json.dump({"command": command, "seconds": secs, "size": size, "results": results,
                   "verdicts": verdicts, **({"data": facts} if facts else {}),
                   **({"agreement": {"with": a.agree_with, "claims": agreed}} if agreed else {})},
                  f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(report.markdown(study, results, command, secs, facts) + stable)
    if results:
        report.figure(study, results, base)
    print(f"wrote {base}.{{json,md,svg,png}} ({secs:.0f} s)")
    if a.doc:
        report.write_doc(a.doc, study.name, report.markdown(study, results, command, secs, facts,
                                                            title=False) + stable)
        if results:
            report.figure(study, results, os.path.join(os.path.dirname(a.doc) or ".",
                                                       f"{study.name}_study"))
        print(f"wrote {a.doc} (between its {study.name}-study markers) and its figure")
    return 0
