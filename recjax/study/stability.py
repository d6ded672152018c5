"""Do two runs of a study with different seed sets reach the same verdicts? (issue 35)

    python scripts/compare.py gba --seeds 4,5,6,7 --out runs/gba_b --agree-with runs/compare_gba

A verdict that is not *unresolved* is a statement about the effect (it is on the paper's side,
or it excludes the paper's size); a second set of seeds must not contradict it. Per claim and
dataset: both resolved and equal (*agree*), both resolved and different (*disagree*: a claim
the study cannot support), or one of them unresolved (*open*: the seeds of one run could not
resolve it, which contradicts nothing). A claim only one run scored is *missing*.
"""

from __future__ import annotations

import json
import os

UNRESOLVED = "unresolved"


def load_verdicts(path: str, name: str) -> dict[str, list[dict]]:
    """The verdicts (dataset -> records) of a study's JSON: `path` is the file or the ``--out``
    folder holding ``<name>_study.json``.

    Raises:
      OSError: no such file. ValueError: a file without verdicts.
    """
    if os.path.isdir(path):
        path = os.path.join(path, f"{name}_study.json")
    with open(path) as f:
        got = json.load(f)
    if not isinstance(got, dict) or "verdicts" not in got:
        raise ValueError(f"{path}: not a study's JSON (no 'verdicts'); give the --out folder of "
                         f"a finished `compare.py {name}` run or its {name}_study.json")
    return got["verdicts"]


def agreement(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> list[dict]:
    """One record per (dataset, claim, phase) either run scored, in `a`'s order then `b`'s:
    ``dataset, claim, phase, a, b`` (the verdicts, None where missing) and ``status``."""
    def index(v: dict[str, list[dict]]) -> dict[tuple, str]:
        return {(ds, r["claim"], r.get("phase", "forward")): r["verdict"]
                for ds, recs in v.items() for r in recs}

    ia, ib = index(a), index(b)
    out = []
    for key in [*ia, *(k for k in ib if k not in ia)]:
        va, vb = ia.get(key), ib.get(key)
        if va is None or vb is None:
            status = "missing"
        elif UNRESOLVED in (va, vb):
            status = "open"
        else:
            status = "agree" if va == vb else "disagree"
        out.append({"dataset": key[0], "claim": key[1], "phase": key[2], "a": va, "b": vb,
                    "status": status})
    return out


def summary(rows: list[dict]) -> dict[str, int]:
    """How many records of each status."""
    return {s: sum(r["status"] == s for r in rows)
            for s in ("agree", "disagree", "open", "missing")}


def markdown(rows: list[dict], this: str, other: str) -> str:
    """A section of the report: the counts, then every record that is not *agree*."""
    n = summary(rows)
    lines = [f"### Stability: this run against {other}", "",
             f"{n['agree']} verdicts agree, **{n['disagree']} disagree**, {n['open']} open (one "
             f"run unresolved), {n['missing']} scored by one run only ({this} against {other}).",
             ""]
    rest = [r for r in rows if r["status"] != "agree"]
    if rest:
        lines += ["| dataset | claim | this run | other run | status |", "|---|---|---|---|---|"]
        lines += [f"| {r['dataset']} | {r['claim']}{' (back)' if r['phase'] == 'back' else ''} "
                  f"| {r['a'] or '-'} | {r['b'] or '-'} | {r['status']} |" for r in rest]
    return "\n".join(lines) + "\n"
