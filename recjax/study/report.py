"""A study's tables, verdicts and figure from its segment records (`recjax.study.runner`).

Per dataset: the metric after each chunk per arm (mean over seeds), the same after switching
back, the counters summed over an arm's chunks (mean over seeds), and one row per claim: the
paper's effect, our mean paired difference with its interval, the MDE, the seeds, the verdict
(`recjax.study.stats.verdict`).
"""

from __future__ import annotations

import math
import os
import pathlib
import statistics

from recjax.study.spec import Claim, Study, Sweep
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
    never switches: in the back phase it is its own forward run on the same chunks); for a
    ratio claim, of ``log(arm / reference)``."""
    out = []
    m = claim.metric or study.metric
    for seed in sorted({r["seed"] for r in rows}):
        a = trajectory(rows, claim.arm, claim.phase, m, seed)
        ref_phase = "forward" if claim.reference == study.reference else claim.phase
        b = trajectory(rows, claim.reference, ref_phase, m, seed)
        common = sorted(set(a) & set(b))
        if common:
            out.append(statistics.fmean(math.log(a[c] / b[c]) if claim.scale == "ratio"
                                        else a[c] - b[c] for c in common))
    return out


def verdicts(study: Study, rows: list[dict], dataset: str | None = None) -> list[dict]:
    """One record per claim scored on `dataset` (a claim naming datasets skips the others)
    that has paired seeds; a ratio claim's numbers are ratios (the geometric mean over seeds,
    its interval, the MDE as a factor)."""
    out = []
    for c in study.claims:
        if dataset is not None and c.datasets and dataset not in c.datasets:
            continue
        d = claim_diffs(study, rows, c)
        if not d:
            continue
        ratio = c.scale == "ratio"
        effect = math.log(c.effect) if ratio and c.effect is not None else c.effect
        v, p = verdict(c.kind, effect, d)
        back = (lambda x: math.exp(x) if math.isfinite(x) else x) if ratio else (lambda x: x)
        out.append({"claim": c.text, "source": c.source, "kind": c.kind, "paper": c.effect,
                    "phase": c.phase, "n": p.n, "mean": back(p.mean), "lo": back(p.lo),
                    "hi": back(p.hi), "mde": back(p.mde), "verdict": v,
                    "diffs": [back(x) for x in d],
                    **({"metric": c.metric} if c.metric else {}),
                    **({"scale": c.scale} if ratio else {})})
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


def _by_seed(rows: list[dict], arm: str, key: str) -> dict[int, float]:
    """seed -> the mean of `key` over the arm's forward chunks (seeds without it left out)."""
    out = {}
    for seed in sorted({r["seed"] for r in rows}):
        xs = [r[key] for r in rows if r["arm"] == arm and r["phase"] == "forward"
              and r["seed"] == seed and r.get(key) is not None]
        if xs:
            out[seed] = statistics.fmean(xs)
    return out


def _per_seed(rows: list[dict], arm: str, key: str) -> list[float]:
    return list(_by_seed(rows, arm, key).values())


def _fmt(xs: list[float]) -> str:
    return ",.0f" if xs and min(abs(x) for x in xs) >= 100 else ".4f"


def _ms(xs: list[float], fmt: str = "") -> str:
    """``mean ± sd`` of `xs` (the mean alone for one value; - for none)."""
    if not xs:
        return "-"
    fmt = fmt or _fmt(xs)
    mean = format(statistics.fmean(xs), fmt)
    return mean if len(xs) < 2 else f"{mean} ± {format(statistics.stdev(xs), fmt.strip('+'))}"


def _facts(facts: dict) -> dict:
    """The scalar facts of a dataset, formatted (lists and tables stay in the JSON)."""
    return {k: (f"{v:.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
            for k, v in facts.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


def _paired_ms(rows: list[dict], arm: str, ref: str, key: str) -> str:
    """``mean ± sd`` over seeds of ``arm - ref``."""
    a, b = _by_seed(rows, arm, key), _by_seed(rows, ref, key)
    return _ms([a[s] - b[s] for s in a if s in b], "+.4f")


def _effect(x: float) -> str:
    """The paper's effect: 4 decimals, 5 where it has them (NE differences of 0.00032)."""
    return f"{x:+.4f}" if abs(x - round(x, 4)) < 1e-12 else f"{x:+.5f}"


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _overview(study: Study, results: dict[str, list[dict]], facts: dict) -> list[str]:
    arms = [a.name for a in study.arms if not a.datasets]
    keys = list(dict.fromkeys(k for ds in results for k in _facts(facts.get(ds) or {})))
    out = ["", f"## Every dataset: {study.metric} per arm (mean ± sd over seeds)", "",
           "| dataset | " + "".join(f"{k} | " for k in keys) + "seeds | " + " | ".join(arms) + " |",
           "|---|" + "---|" * (len(keys) + 1 + len(arms))]
    for ds, rows in results.items():
        f = _facts(facts.get(ds) or {})
        out.append(f"| {ds} | " + "".join(f"{f.get(k, '-')} | " for k in keys)
                   + f"{len({r['seed'] for r in rows})} | "
                   + " | ".join(_ms(_per_seed(rows, a, study.metric)) for a in arms) + " |")
    return out


def _counter_table(study: Study, rows: list[dict], arms) -> tuple[list[str], dict[str, list]]:
    """``(keys, {arm: cells})``: the counters of the `arms` that have any, formatted; a counter
    no arm has is left out."""
    per = {a.name: counters(study, rows, a.name) for a in arms}
    per = {a: c for a, c in per.items() if c}
    keys = [k for k in study.counters if any(c.get(k) is not None for c in per.values())]
    return keys, {a: [(f"{_f(v[0], '.2f')} ({v[1]})" if isinstance(v, tuple) else _f(v, ",.0f"))
                      if v is not None else "-" for v in (c.get(k) for k in keys)]
                  for a, c in per.items()}


def _sweep_groups(study: Study, ran: set[str]) -> list[list[Sweep]]:
    """The sweeps with an arm in `ran`, those of one key together (in the study's order)."""
    groups: dict[str, list[Sweep]] = {}
    for sw in study.sweeps:
        if any(a.name in ran for a in sw.arms()):
            groups.setdefault(sw.key, []).append(sw)
    return list(groups.values())


def _sweep_tables(study: Study, rows: list[dict], group: list[Sweep], ran: set[str]
                  ) -> list[str]:
    """One sweep: its metrics and counters against its values. Several of one key: a table per
    metric, a column per sweep (its variant)."""
    m, sw = study.metric, group[0]
    metrics = list(dict.fromkeys(k for s in group for k in (s.metrics or (m,))))

    def cell(arm: str, k: str) -> str:
        xs = _per_seed(rows, arm, k)
        return _ms(xs, ".4f" if k == m else _fmt(xs))

    if len(group) == 1:
        sarms = [a for a in sw.arms() if a.name in ran]
        over = ", ".join(f"`{k}` {v}" for k, v in sw.overrides.items())
        keys, cells = _counter_table(study, rows, sarms)
        out = ["", f"### {', '.join(metrics)} against {sw.name} (`{sw.key}`"
               + (f"; {over}" if over else "") + ")", "", _row([sw.name, *metrics, *keys]),
               "|---|" + "---|" * (len(metrics) + len(keys))]
        return out + [_row([a.overrides[sw.key], *(cell(a.name, k) for k in metrics),
                            *cells.get(a.name, ["-"] * len(keys))]) for a in sarms]
    values = sorted({a.overrides[sw.key] for s in group for a in s.arms() if a.name in ran})
    out = []
    for k in metrics:
        out += ["", f"### {k} against {sw.name} (`{sw.key}`; mean ± sd over seeds)", "",
                _row([sw.name, *(s.variant or s.name for s in group)]),
                "|---|" + "---|" * len(group)]
        for v in values:
            names = [next((a.name for a in s.arms() if a.overrides[s.key] == v), "") for s in group]
            out.append(_row([v, *(cell(a, k) if a in ran else "-" for a in names)]))
    return out


def _claims(study: Study, rows: list[dict], ds: str) -> list[str]:
    vs = verdicts(study, rows, ds)
    if not vs:
        return []
    out = ["", "### Claims", "", "| claim | paper | ours: mean [95% CI] | MDE | seeds | verdict |",
           "|---|---|---|---|---|---|"]
    for v in vs:
        ratio = v.get("scale") == "ratio"
        x = (lambda y: "-" if not math.isfinite(y) else f"x{y:.2f}") if ratio else (
            lambda y: _f(y, "+.4f"))
        if v["kind"] == "within":
            paper = f"within x{v['paper']:.2f}" if ratio else f"within +-{v['paper']:g}"
        elif v["paper"] is None:
            paper = ("below" if v["kind"] == "less" else "above") + (" x1" if ratio else " 0")
        else:
            paper = f"x{v['paper']:.2f}" if ratio else _effect(v["paper"])
        mde = (f"x{v['mde']:.2f}" if math.isfinite(v["mde"]) else "-") if ratio else _f(v["mde"])
        mean = f"x{v['mean']:.2f}" if ratio else f"{v['mean']:+.4f}"
        out.append(f"| {v['claim']} | {paper} ({v['source']}) | {mean} [{x(v['lo'])}, "
                   f"{x(v['hi'])}] | {mde} | {v['n']} | **{v['verdict']}** |")
    out += ["", "Verdicts: held when the interval excludes 0 on the paper's side (within: "
            "the 90% interval inside the margin); did not hold only when it excludes the "
            "paper's effect; otherwise unresolved, and the MDE says what effect these "
            "seeds could detect (recjax/study/stats.py)."]
    if any(v.get("scale") == "ratio" for v in vs) or any(v["paper"] is None for v in vs):
        out[-1] += (" Ratios (x): the geometric mean over seeds of arm / reference, scored as "
                    "log ratios. A claim with a direction and no size (above / below) did not "
                    "hold only when the interval lies wholly on the other side.")
    return out


def markdown(study: Study, results: dict[str, list[dict]], command: str, seconds: float,
             facts: dict | None = None, title: bool = True) -> str:
    """The study's report (`facts`: dataset -> `Study.describe`'s dict; `title`: the first
    heading, which a doc section leaves out)."""
    m, facts = study.metric, facts or {}
    out = ([f"# {study.title}", ""] if title else []) + [f"`{command}`, {seconds:.0f} s.", ""]
    if study.notes:
        out += [study.notes, ""]
    if study.overview and results:
        out = out[:-1] + _overview(study, results, facts) + [""]
    for ds, rows in results.items():
        seeds = sorted({r["seed"] for r in rows})
        chunks = sorted({r["chunk"] for r in rows if r["phase"] == "forward"})
        start = (f"each starts every arm from its own base run (`{study.base_arm.name}`)"
                 + ("" if not any(a.scratch for a in study.all_arms)
                    else ", but the sweeps' arms, which train from scratch")
                 if any(r["phase"] == "base" for r in rows) else
                 "every arm trains from scratch (a seed fixes the init, the data order and the "
                 "eval rows of every arm)")
        out += [f"## {ds}", "", f"Seeds {', '.join(map(str, seeds))}; {start}; cells are means "
                "over the seeds."]
        if _facts(facts.get(ds) or {}):
            out += ["", "Data: " + ", ".join(f"{k} {v}" for k, v in _facts(facts[ds]).items())
                    + "."]
        ran = {r["arm"] for r in rows}
        arms = [a for a in study.arms if a.name in ran]
        if len(chunks) == 1 or study.metrics:
            keys = [m, *study.metrics]
            fmts = {k: _fmt([x for a in arms for x in _per_seed(rows, a.name, k)]) for k in keys}
            out += ["", "### Per arm (mean ± sd over seeds" + (", over its chunks" if len(chunks) > 1
                                                              else "") + ")", "",
                    _row(["arm", m, f"- {study.reference} (paired)", *study.metrics]),
                    "|---|" + "---|" * (len(keys) + 1)]
            for a in arms:
                out.append(_row([a.name, _ms(_per_seed(rows, a.name, m), fmts[m]),
                                 "-" if a.name == study.reference
                                 else _paired_ms(rows, a.name, study.reference, m),
                                 *(_ms(_per_seed(rows, a.name, k), fmts[k])
                                   for k in study.metrics)]))
        if len(chunks) > 1:
            out += ["", f"### {m} after each chunk", "",
                    "| arm | " + " | ".join(f"chunk {c}" for c in chunks)
                    + f" | avg - {study.reference} |", "|---|" + "---|" * (len(chunks) + 1)]
            ref = trajectory(rows, study.reference, "forward", m)
            for a in study.arms:
                if a.datasets and ds not in a.datasets:
                    continue
                t = trajectory(rows, a.name, "forward", m)
                d = [t[c] - ref[c] for c in chunks if c in t and c in ref]
                out.append(f"| {a.name} | " + " | ".join(_f(t.get(c)) for c in chunks)
                           + f" | {_f(statistics.fmean(d) if d else None, '+.4f')} |")
        back = sorted({r["chunk"] for r in rows if r["phase"] == "back"})
        if back:
            ref = trajectory(rows, study.reference, "forward", m)
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
        for group in _sweep_groups(study, ran):
            out += _sweep_tables(study, rows, group, ran)
        keys, cells = _counter_table(study, rows, study.arms)
        if cells:
            after = ("over the chunks after the switch" if any(r["phase"] == "base" for r in rows)
                     else "of each arm's run")
            out += ["", f"### Counters {after} (mean over seeds; histograms: mean (max))", "",
                    _row(["arm", *keys]), "|---|" + "---|" * len(keys)]
            out += [_row([a, *c]) for a, c in cells.items()]
        out += _claims(study, rows, ds)
        out += _collapsed(rows)
        out.append("")
    return "\n".join(out)


def _collapsed(rows: list[dict]) -> list[str]:
    """The segments whose model predicted one value for every eval row (``eval_logit_spread``
    0: recjax/train/contract.py `evaluate`), by arm and seed: such a seed's metric is the
    constant predictor's (AUC 0.5), which the claims' means and intervals include."""
    hit: dict[tuple[str, str, int], list[int]] = {}
    for r in rows:
        if r.get("eval_logit_spread") == 0:
            hit.setdefault((r["arm"], r["phase"], r["seed"]), []).append(r["chunk"])
    if not hit:
        return []
    out = ["", "### Collapsed runs", "", "Segments whose model gave every eval row the same "
           "prediction (a constant predictor: AUC 0.5, NE ~1), counted in the tables and "
           "claims above as they are:", ""]
    for (arm, phase, seed), chunks in sorted(hit.items()):
        out.append(f"- {arm}, {phase}, seed {seed}: chunk{'s' if len(chunks) > 1 else ''} "
                   + ", ".join(map(str, sorted(chunks))))
    return out


def figure(study: Study, results: dict[str, list[dict]], path: str) -> None:
    """The metric per chunk, one line per arm (mean over seeds); a second column for the switch
    back; a row per dataset. Whole runs (one chunk): the metric per arm and against each sweep's
    setting (mean ± sd). Writes ``path.svg`` and ``path.png``."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a small svg
    import matplotlib.pyplot as plt

    if all(r["chunk"] <= 1 for rows in results.values() for r in rows):
        return _figure_runs(study, results, path, plt)
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


def _figure_runs(study: Study, results: dict[str, list[dict]], path: str, plt) -> None:
    """Whole runs: per dataset, the metric per arm, then a panel per sweep and metric it shows
    (the sweeps of one key together, a line each; mean ± sd)."""
    ran = {r["arm"] for rows in results.values() for r in rows}
    panels = [(g, k) for g in _sweep_groups(study, ran)
              for k in dict.fromkeys(k for sw in g for k in (sw.metrics or (study.metric,)))]
    fig, axes = plt.subplots(len(results), 1 + len(panels), squeeze=False,
                             figsize=(4.5 * (1 + len(panels)), 2.8 * len(results)))
    for row, (ds, rows) in zip(axes, results.items()):
        arms = [a for a in study.arms if any(r["arm"] == a.name for r in rows)]
        xs = [_per_seed(rows, a.name, study.metric) for a in arms]
        row[0].errorbar(range(len(arms)), [statistics.fmean(x) for x in xs],
                        yerr=[statistics.stdev(x) if len(x) > 1 else 0 for x in xs],
                        fmt="o", capsize=3, color="k")
        row[0].set_xticks(range(len(arms)), [a.label or a.name for a in arms], fontsize=7,
                          **(dict(rotation=30, ha="right") if len(arms) > 5 else {}))
        row[0].set_title(f"{ds}: {study.metric} per arm (mean ± sd)", fontsize=9)
        row[0].set_ylabel(study.metric)
        for ax, (group, k) in zip(row[1:], panels):
            lines = [(sw, [(a.overrides[sw.key], _per_seed(rows, a.name, k)) for a in sw.arms()])
                     for sw in group]
            lines = [(sw, [(v, x) for v, x in pts if x]) for sw, pts in lines]
            if not any(pts for _, pts in lines):
                ax.axis("off")
                continue
            for i, (sw, pts) in enumerate(lines):
                # several lines: each thinner, with its own marker, on top of the one before,
                # so that lines that coincide (no sync and a free sync) both show
                style = dict(fmt="o-") if len(lines) == 1 else dict(
                    fmt="-" + "osD^v"[i % 5], lw=1 + 2.5 * (len(lines) - 1 - i) / len(lines),
                    ms=8 - 5 * i / len(lines), zorder=2 + i)
                if pts:
                    ax.errorbar([v for v, _ in pts], [statistics.fmean(x) for _, x in pts],
                                yerr=[statistics.stdev(x) if len(x) > 1 else 0 for _, x in pts],
                                capsize=3, label=sw.variant or None, **style)
            vals = sorted({v for _, pts in lines for v, _ in pts})
            ax.set_xscale("symlog", base=2, linthresh=1)
            ax.set_xticks(vals, [str(v) for v in vals])
            ax.set_xlabel(f"{group[0].name} ({group[0].key}, log scale)", fontsize=8)
            ax.set_title(f"{ds}: {k} against {group[0].name}", fontsize=9)
            ax.set_ylabel(k)
            if len(group) > 1:
                ax.legend(fontsize=7)
        for ax in row:
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path + ".svg")
    fig.savefig(path + ".png", dpi=72)
    plt.close(fig)


def write_doc(doc: str, name: str, text: str) -> None:
    """Put `text` into the markdown file `doc` between ``<!-- NAME-study:begin -->`` and
    ``<!-- NAME-study:end -->`` (appended at the end when absent), its headings one level down
    (the section sits under the doc's own); the rest of the file is kept."""
    begin, end = f"<!-- {name}-study:begin -->", f"<!-- {name}-study:end -->"
    old = pathlib.Path(doc).read_text() if os.path.exists(doc) else ""
    if begin not in old or end not in old[old.index(begin):]:
        old = f"{old.rstrip()}\n\n{begin}\n{end}\n" if old else f"{begin}\n{end}\n"
    head, _, rest = old.partition(begin)
    _, _, tail = rest.partition(end)
    body = "\n".join("#" + line if line.startswith("#") else line
                      for line in text.strip("\n").splitlines())
    pathlib.Path(doc).write_text(f"{head}{begin}\n{body}\n{end}{tail}")
