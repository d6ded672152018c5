"""A study's tables, verdicts and figure from its segment records (`recjax.study.runner`).

Per dataset: the metric after each chunk per arm (mean over seeds), the same after switching
back, the counters summed over an arm's chunks (mean over seeds), and one row per claim: the
paper's effect, our mean paired difference with its interval, the MDE, the seeds, the verdict
(`recjax.study.stats.verdict`).
"""

from __future__ import annotations

import math
import statistics

from recjax.study.spec import Claim, Study
from recjax.study.stats import verdict


def _cell(rows: list[dict], metric: str) -> float:
    return statistics.fmean(r[metric] for r in rows) if rows else math.nan


def _f(x, fmt=".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def trajectory(rows: list[dict], arm: str, phase: str, metric: str, seed: int | None = None
               ) -> dict[int, float]:
    """chunk -> metric of `arm` in `phase` (mean over seeds, or of one seed)."""
    sel = [r for r in rows if r["arm"] == arm and r["phase"] == phase
           and (seed is None or r["seed"] == seed)]
    return {c: _cell([r for r in sel if r["chunk"] == c], metric)
            for c in sorted({r["chunk"] for r in sel})}


def claim_diffs(study: Study, rows: list[dict], claim: Claim) -> list[float]:
    """Per seed: the mean over the phase's chunks of ``arm - reference`` (the reference arm
    never switches: in the back phase it is its own forward run on the same chunks)."""
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        a = trajectory(rows, claim.arm, claim.phase, study.metric, seed)
        ref_phase = "forward" if claim.reference == study.reference else claim.phase
        b = trajectory(rows, claim.reference, ref_phase, study.metric, seed)
        common = sorted(set(a) & set(b))
        if common:
            out.append(statistics.fmean(a[c] - b[c] for c in common))
    return out


def verdicts(study: Study, rows: list[dict]) -> list[dict]:
    out = []
    for c in study.claims:
        d = claim_diffs(study, rows, c)
        if not d:
            continue
        v, p = verdict(c.kind, c.effect, d)
        out.append({"claim": c.text, "source": c.source, "kind": c.kind, "paper": c.effect,
                    "phase": c.phase, "n": p.n, "mean": p.mean, "lo": p.lo, "hi": p.hi,
                    "mde": p.mde, "verdict": v, "diffs": d})
    return out


def _merge_hist(hists: list[dict]) -> tuple[float | None, int | None]:
    total: dict[int, int] = {}
    for h in hists:
        for k, v in (h or {}).items():
            total[int(k)] = total.get(int(k), 0) + v
    n = sum(total.values())
    return (sum(k * v for k, v in total.items()) / n if n else None), max(total, default=None)


def counters(study: Study, rows: list[dict], arm: str) -> dict:
    """The arm's counters over its forward chunks: sums (histograms merged), mean over seeds."""
    out = {}
    seeds = sorted({r["seed"] for r in rows})
    for k in study.counters:
        per_seed = []
        for s in seeds:
            sel = [r.get(k) for r in rows if r["arm"] == arm and r["phase"] == "forward"
                   and r["seed"] == s and r.get(k) is not None]
            if not sel:
                continue
            per_seed.append(_merge_hist(sel) if isinstance(sel[0], dict) else sum(sel))
        if per_seed and isinstance(per_seed[0], tuple):
            means = [m for m, _ in per_seed if m is not None]
            out[k] = (statistics.fmean(means) if means else None,
                      max((x for _, x in per_seed if x is not None), default=None))
        elif per_seed:
            out[k] = statistics.fmean(per_seed)
    return out


def markdown(study: Study, results: dict[str, list[dict]], command: str, seconds: float) -> str:
    """The study's report."""
    m = study.metric
    out = [f"# {study.title}", "", f"`{command}`, {seconds:.0f} s.", ""]
    if study.notes:
        out += [study.notes, ""]
    for ds, rows in results.items():
        seeds = sorted({r["seed"] for r in rows})
        chunks = sorted({r["chunk"] for r in rows if r["phase"] == "forward"})
        out += [f"## {ds}", "", f"Seeds {', '.join(map(str, seeds))}; each starts every arm "
                f"from its own base run (`{study.reference}`); cells are means over the seeds.",
                "", f"### {m} after each chunk", "",
                "| arm | " + " | ".join(f"chunk {c}" for c in chunks) + f" | avg - {study.reference} |",
                "|---|" + "---|" * (len(chunks) + 1)]
        ref = trajectory(rows, study.reference, "forward", m)
        for a in study.arms:
            t = trajectory(rows, a.name, "forward", m)
            d = [t[c] - ref[c] for c in chunks if c in t and c in ref]
            out.append(f"| {a.name} | " + " | ".join(_f(t.get(c)) for c in chunks)
                       + f" | {_f(statistics.fmean(d) if d else None, '+.4f')} |")
        back = sorted({r["chunk"] for r in rows if r["phase"] == "back"})
        if back:
            out += ["", f"### {m} after switching back to `{study.reference}`", "",
                    f"| arm -> {study.reference} | " + " | ".join(f"chunk {c}" for c in back)
                    + f" | avg - {study.reference} |", "|---|" + "---|" * (len(back) + 1),
                    f"| {study.reference} (no switch) | "
                    + " | ".join(_f(ref.get(c)) for c in back) + " | - |"]
            for a in study.arms:
                t = trajectory(rows, a.name, "back", m)
                if not t:
                    continue
                d = [t[c] - ref[c] for c in back if c in t and c in ref]
                out.append(f"| {a.name} | " + " | ".join(_f(t.get(c)) for c in back)
                           + f" | {_f(statistics.fmean(d) if d else None, '+.4f')} |")
        if study.counters:
            out += ["", "### Counters over the chunks after the switch (mean over seeds; "
                    "histograms: mean (max))", "",
                    "| arm | " + " | ".join(study.counters) + " |",
                    "|---|" + "---|" * len(study.counters)]
            for a in study.arms:
                c = counters(study, rows, a.name)
                if not c:
                    continue
                cells = [(f"{_f(v[0], '.2f')} ({v[1]})" if isinstance(v, tuple)
                          else _f(v, ",.0f")) if v is not None else "-"
                         for v in (c.get(k) for k in study.counters)]
                out.append(f"| {a.name} | " + " | ".join(cells) + " |")
        vs = verdicts(study, rows)
        if vs:
            out += ["", "### Claims", "",
                    "| claim | paper | ours: mean [95% CI] | MDE | seeds | verdict |",
                    "|---|---|---|---|---|---|"]
            for v in vs:
                paper = (f"within +-{v['paper']:g}" if v["kind"] == "within"
                         else f"{v['paper']:+.4f}") + f" ({v['source']})"
                out.append(f"| {v['claim']} | {paper} | {v['mean']:+.4f} [{_f(v['lo'], '+.4f')}, "
                           f"{_f(v['hi'], '+.4f')}] | {_f(v['mde'])} | {v['n']} | "
                           f"**{v['verdict']}** |")
            out += ["", "Verdicts: held when the interval excludes 0 on the paper's side (within: "
                    "the 90% interval inside the margin); did not hold only when it excludes the "
                    "paper's effect; otherwise unresolved, and the MDE says what effect these "
                    "seeds could detect (recjax/study/stats.py)."]
        out.append("")
    return "\n".join(out)


def figure(study: Study, results: dict[str, list[dict]], path: str) -> None:
    """The metric per chunk, one line per arm (mean over seeds); a second column for the switch
    back; a row per dataset. Writes ``path.svg`` and ``path.png``."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a small svg
    import matplotlib.pyplot as plt

    has_back = any(r["phase"] == "back" for rows in results.values() for r in rows)
    fig, axes = plt.subplots(len(results), 2 if has_back else 1,
                             figsize=(9 if has_back else 5, 3.2 * len(results)), squeeze=False)
    for row, (ds, rows) in zip(axes, results.items()):
        ref = trajectory(rows, study.reference, "forward", study.metric)
        for a in study.arms:
            style = dict(color="k", lw=2.2) if a.name == study.reference else dict(lw=1.3)
            t = trajectory(rows, a.name, "forward", study.metric)
            row[0].plot(list(t), list(t.values()), "o-", ms=3, label=a.label or a.name, **style)
            b = trajectory(rows, a.name, "back", study.metric)
            if has_back and b:
                start = min(b) - 1  # the line starts at the switch point: the arm's own value
                row[1].plot([start, *b], [t.get(start, math.nan), *b.values()], "o-", ms=3, lw=1.3)
        if has_back:
            row[1].plot(list(ref), list(ref.values()), "o-", ms=3, color="k", lw=2.2)
            row[1].set_title(f"{ds}: back to {study.reference}", fontsize=9)
        row[0].set_title(f"{ds}: switched from {study.reference}", fontsize=9)
        for ax in row:
            ax.set_xlabel("chunk")
            ax.set_ylabel(study.metric)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path + ".svg")
    fig.savefig(path + ".png", dpi=72)
    plt.close(fig)
