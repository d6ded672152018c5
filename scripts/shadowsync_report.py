"""The ShadowSync study's verdicts, markdown and scaling figure, from its results.json.

`verdicts(res)` states each claim as the paper states it (Zheng et al., arXiv 2003.03477, section
/ table / figure), applies the rules of scripts/shadowsync_verdicts.py to the per-seed numbers,
and marks claims that hold by construction of the study's setup. `write(path, res, other)` writes
the markdown to `path` and shadowsync_scaling.{png,svg} next to it; with `other` (a second run's
results.json) it adds both runs' verdicts side by side.
"""

from __future__ import annotations

import pathlib

from scripts import shadowsync_verdicts as sv

METRICS = ("train_ne", "eval_ne", "eval_auc", "gap")


def cells(res: dict, ds: str) -> dict[str, dict[str, list[float]]]:
    """variant -> metric -> per-seed values (in res["seeds"] order)."""
    per_seed = res["datasets"][ds]
    seeds = [str(s) for s in res["seeds"] if str(s) in per_seed]
    names = list(per_seed[seeds[0]])
    return {n: {m: [per_seed[s][n][m] for s in seeds] for m in METRICS + ("steps",)}
            for n in names}


def _d(p: dict) -> str:
    return f"d = {p['mean']:+.4f} ± {p['se']:.4f} (mean ± SE over {p['n']} seeds)"


def verdicts(res: dict) -> list[dict]:
    """One row per claim: id, claim (the paper's words, cited), verdict, detail."""
    rows = []
    for ds in res["datasets"]:
        c = cells(res, ds)
        for metric, label, col in (("eval_ne", "Eval NE", 2), ("train_ne", "Train NE", 1)):
            per_k = {k: sv.lower(c["S-EASGD"][metric], c[f"FR-EASGD k={k}"][metric])
                     for k in (5, 10, 30, 100)}
            ok = all(v["verdict"] == sv.HELD for v in per_k.values())
            rows.append({
                "id": f"{ds}/s-easgd-lower-{metric}",
                "claim": f"S-EASGD outperforms FR-EASGD for {label} (Sec. 4.1.1, Table 2: "
                         + ", ".join(f"{n} {v[col]}" for n, v in sv.PAPER_TABLE2.items()) + ")",
                "verdict": sv.HELD if ok else sv.NOT_HELD,
                "detail": "FR minus S, paired by seed: " + "; ".join(
                    f"k={k}: {_d(v)} ({v['reason']})" for k, v in per_k.items())
                + f". The paper's margin at k=5 is {paper_margin(col):.5f}; a difference counts "
                  f"there only above 2 SE = {2 * per_k[5]['se']:.4f}"})
        inc = sv.increases({k: c[f"FR-EASGD k={k}"]["eval_ne"] for k in (5, 10, 30, 100)})
        rows.append({
            "id": f"{ds}/fr-eval-ne-rises-with-k",
            "claim": "the Eval NE of FR-EASGD increases as the sync gap goes up (Sec. 4.1.1, "
                     "Table 2: 0.78483, 0.78508, 0.78523, 0.78531 at k = 5, 10, 30, 100)",
            "verdict": inc["verdict"],
            "detail": "means " + ", ".join(f"k={k} {m:.4f}" for k, m in inc["means"].items())
                      + f"; k=100 minus k=5: {_d(inc)} ({inc['reason']})"})
        for rule in ("MA", "BMUF"):
            v = sv.lower(c[f"S-{rule}"]["eval_ne"], c[f"FR-{rule} k=10"]["eval_ne"])
            rows.append({
                "id": f"{ds}/s-{rule.lower()}-lower",
                "claim": f"S-{rule} has lower NE than FR-{rule} (Sec. 4.1.3, Fig. 6: \"The "
                         "ShadowSync versions achieve lower NE\"; the paper's FR rate is one "
                         "sync a minute, ours k = 10)",
                "verdict": v["verdict"],
                "detail": f"Eval NE, FR minus S: {_d(v)} ({v['reason']})"})
    rows += scaling_verdicts(res["scaling"])
    return rows


def paper_margin(col: int) -> float:
    """Table 2: FR-EASGD k=5 minus S-EASGD, in Train NE (col 1) or Eval NE (col 2)."""
    return sv.PAPER_TABLE2["FR-EASGD k=5"][col] - sv.PAPER_TABLE2["S-EASGD"][col]


def scaling_verdicts(sc: dict) -> list[dict]:
    """Fig. 5's claims on the virtual-clock sweep; the FR cap is set by the chosen link size."""
    ns, eps = sc["trainers"], sc["eps"]
    n = ns[-1]
    speed = {k: v[-1] / v[0] for k, v in eps.items()}
    one = eps["no sync"][0]
    rows = [{
        "id": "scaling/s-easgd-linear",
        "claim": "S-EASGD achieves linear EPS growth (Sec. 4.1.2, Fig. 5, 3rd panel)",
        "verdict": sv.HELD if speed["S-EASGD"] >= 0.9 * n else sv.NOT_HELD,
        "by_construction": True,
        "detail": f"speed-up 1 -> {n} trainers {speed['S-EASGD']:.2f}x (no sync "
                  f"{speed['no sync']:.2f}x; rule: >= 0.9 x {n}). By construction: the virtual "
                  "clock charges a worker only for its own compute and PS transfers, so a "
                  "shadow thread's sync cannot slow a worker; S-EASGD's EPS equals no sync's."}]
    for k in (5, 30):
        cap = sv.fr_cap(k, sv_exchange(sc), one)
        got = eps[f"FR-EASGD k={k}"][-1]
        linear = speed[f"FR-EASGD k={k}"] >= 0.9 * n
        claim, want = ((f"FR-EASGD-{k}'s EPS almost stops increasing as trainers are added; "
                        "the sync PS is the bottleneck (Sec. 4.1.2, Fig. 5)", not linear)
                       if k == 5 else
                       (f"FR-EASGD-{k} achieves linear EPS growth (Sec. 4.1.2, Fig. 5)", linear))
        rows.append({
            "id": f"scaling/fr{k}-{'capped' if k == 5 else 'linear'}",
            "claim": claim, "verdict": sv.HELD if want else sv.NOT_HELD, "by_construction": True,
            "detail": f"speed-up 1 -> {n} trainers {speed[f'FR-EASGD k={k}']:.2f}x; EPS at {n} "
                      f"trainers {got:,.0f} vs the cap k / {sv_exchange(sc):g} x one trainer's "
                      f"EPS = {cap:,.0f} (= {cap / one:.1f} trainers' worth). By construction: "
                      "the sync link is sized so one exchange takes "
                      f"{sv_exchange(sc):g} iterations, which fixes this cap; below it, every "
                      "foreground sync waits for the shared link in the worker's own time, so "
                      "efficiency falls as the link fills (rule for linear: speed-up >= 0.9 n)."})
    gap = sc["gap"]["S-EASGD"][-1]
    rows.append({
        "id": "scaling/s-easgd-syncs-more-than-fr30",
        "claim": "at the largest trainer counts S-EASGD still syncs more often than FR-EASGD-30 "
                 "(Sec. 4.1.2: average gaps 8.60 ... 12.48 for 15-20 trainers)",
        "verdict": sv.HELD if gap < 30 else sv.NOT_HELD, "by_construction": True,
        "detail": f"S-EASGD's measured gap at {n} trainers {gap:.2f} (rule: < 30); gaps by "
                  "trainers: " + ", ".join(f"{m}: {g:.2f}" for m, g in zip(ns, sc["gap"]["S-EASGD"]))
                  + f". Largely by construction: n shadow threads share a link that serves one "
                  f"exchange per {sv_exchange(sc):g} iterations, so the gap tends to "
                  f"{sv_exchange(sc):g} x n once the link saturates."})
    return rows


def sv_exchange(sc: dict) -> float:
    return float(sc.get("exchange_iters", 2.0))


def plot(sc: dict, stem: pathlib.Path) -> None:
    """EPS vs trainers on log2 axes with the ideal line and the FR caps (left), and EPS per
    trainer relative to one trainer without sync (right); SVG and PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns, eps = sc["trainers"], sc["eps"]
    one = eps["no sync"][0]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.0, 4.4))
    # S-EASGD's points coincide with no sync's: no sync is a wide grey band with open circles,
    # S-EASGD a thin dashed line with small squares on top of it, the ideal a dotted line on top
    style = {"no sync": dict(color="0.65", ls="-", lw=6, marker="o", ms=12, mfc="none", mew=2,
                             zorder=2),
             "FR-EASGD k=30": dict(color="tab:orange", ls="-.", lw=1.5, marker="D", ms=6,
                                   zorder=3),
             "FR-EASGD k=5": dict(color="tab:red", ls="-", lw=1.5, marker="^", ms=7, zorder=3),
             "S-EASGD": dict(color="tab:blue", ls="--", lw=1.5, marker="s", ms=4, zorder=4)}
    for a, rel in ((ax, False), (ax2, True)):
        ideal = [1.0 for _ in ns] if rel else [n * one for n in ns]
        a.plot(ns, ideal, ":", color="black", lw=1.2, zorder=5,
               label="ideal: n x one trainer" if not rel else "ideal")
        for name in style:
            ys = [e / (n * one) for n, e in zip(ns, eps[name])] if rel else eps[name]
            a.plot(ns, ys, label=name, **style[name])
        a.set_xscale("log", base=2)
        a.set_xticks(ns, [str(n) for n in ns])
        a.minorticks_off()
        a.set_xlabel("trainers n (1 Hogwild worker each)")
        a.grid(True, which="major", lw=0.3)
    for k, col in ((5, "tab:red"), (30, "tab:orange")):
        cap = sv.fr_cap(k, sv_exchange(sc), one)
        if cap < ns[-1] * one:
            ax.axhline(cap, color=col, lw=1.0, ls=(0, (1, 2)), zorder=1,
                       label=f"FR k={k} cap: {cap / one:g} x one trainer (link size)")
    ax.set_yscale("log", base=2)
    ticks = [n * one for n in ns]
    ax.set_yticks(ticks, [f"{t / 1000:,.0f}k" for t in ticks])
    ax.minorticks_off()
    ax.set_ylabel("throughput (examples / virtual second)")
    ax.set_title("EPS vs trainers (log2 axes)", fontsize=10)
    ax2.set_ylim(0, 1.1)
    ax2.set_ylabel("efficiency: EPS / (n x 1-trainer EPS)")
    ax2.set_title("efficiency (S-EASGD = no sync = ideal)", fontsize=10)
    fig.suptitle("ShadowSync Fig. 5 analogue (virtual clock)", fontsize=11)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    for ext in ("png", "svg"):
        fig.savefig(stem.with_suffix("." + ext), dpi=150)
    plt.close(fig)


def _ms(xs: list, fmt: str = ".4f") -> str:
    if any(x is None for x in xs):
        return "-"
    s = sv.summary(xs)
    return f"{s['mean']:{fmt}} ± {s['sd']:{fmt}}"


def _v(r: dict) -> str:
    return f"**{r['verdict']}**" + (" (by construction)" if r.get("by_construction") else "")


def markdown(res: dict, other: dict | None) -> str:
    from scripts.compare_shadowsync import SIZES

    n_syn, frappe_epochs, _, _ = SIZES[res["size"]]
    seeds = ", ".join(str(s) for s in res["seeds"])
    out = ["# ShadowSync on recjax: Table 2 and Fig. 5 analogues, with seeds", "",
           f"Generated by `{res.get('command', 'python scripts/compare.py shadowsync')}` "
           f"(commit {res.get('commit', '?')}, seeds {seeds}, {res['wall_seconds']:.0f} s on the "
           "2-core dev box)" + (f"; rendered by `{res['rendered_by']}`" if "rendered_by" in res
                                  else "") + ". Paper: Zheng et al., ShadowSync, arXiv 2003.03477.",
           "",
           f"Setup: n = 4 trainers x m = 2 Hogwild workers, batch 128 per worker, alpha = 0.5, "
           "S-BMUF / FR-BMUF with block lr 1 and block momentum 0.5; embeddings on 2 PS shards; "
           "deterministic virtual-clock mode (same seed, same bits), so the sync gap is measured "
           "in virtual time (shadow pause 5 ms, 20 us per example). Synthetic = DLRM on the "
           f"default synthetic task ({n_syn:,} examples, 1 epoch, 20,000 eval examples); "
           f"Frappe = DeepFM (deep MLP 64-32), {frappe_epochs} epochs, seeded 90/10 hold-out "
           f"(`{res['size']}` size). A seed sets parameter init and data order (`train.seed`); "
           "the eval set is the same for every seed, so variants are compared *paired by seed*.",
           "", "Cells are mean ± sample standard deviation over the seeds.", ""]
    for ds in res["datasets"]:
        c = cells(res, ds)
        out += [f"## {ds}: Train NE, Eval NE, measured sync gap (Table 2 analogue)", "",
                "| variant | Train NE | Eval NE | Eval AUC | avg sync gap | iterations |",
                "|---|---|---|---|---|---|"]
        for name, m in c.items():
            out.append(f"| {name} | {_ms(m['train_ne'])} | {_ms(m['eval_ne'])} | "
                       f"{_ms(m['eval_auc'])} | {_ms(m['gap'], '.2f')} | {m['steps'][0]} |")
        never = [n for n, m in c.items() if n.startswith("FR-") and None in m["gap"]]
        if never:
            out.append(f"{', '.join(never)} never synced in this run (each worker ran fewer "
                       "than k iterations): independent local training, not a sync gap of k.")
        out.append("")
    out += ["Paper, Table 2 (Dataset-1, 11 trainers; one run each): "
            + "; ".join(f"{n} gap {g}, Train NE {t}, Eval NE {e}"
                        for n, (g, t, e) in sv.PAPER_TABLE2.items())
            + ". Its whole Eval NE spread is 0.0008; S-EASGD beats k=5 by 0.00032.", ""]
    sc = res["scaling"]
    out += ["## Examples/sec vs trainers (Fig. 5 analogue)", "",
            "![EPS vs trainers on log2 axes, and scaling efficiency](shadowsync_scaling.png) "
            "([SVG](shadowsync_scaling.svg))", "",
            f"Virtual clock, 1 worker per trainer, 8 fast embedding-PS links, seed {sc['seed']} "
            "(virtual-clock EPS depends on the schedule only, not on the seed). **The sync PS "
            f"link is chosen** ({sc['sync_gbps']:.3f} Gbit/s) so that one EASGD exchange "
            f"(2 x dense bytes) takes as long as {sv_exchange(sc):g} iterations' compute. That "
            f"choice fixes the FR-EASGD cap: with sync gap k, each worker iteration needs 1/k of "
            f"an exchange, so the link admits at most k / {sv_exchange(sc):g} iterations per "
            f"iteration time, i.e. k / {sv_exchange(sc):g} trainers' worth of EPS (2.5 for "
            "k = 5, 15 for k = 30), however many trainers run. The scaling verdicts below "
            "therefore hold by construction: they show the simulator reproduces the mechanism "
            "the paper names (a saturated sync PS link), not that the mechanism occurs on real "
            "hardware. In the paper the cap came from a measured 25 Gbit NIC on 2 sync PSs.", "",
            "| trainers | " + " | ".join(sc["eps"]) + " | S-EASGD gap |",
            "|---|" + "---|" * (len(sc["eps"]) + 1)]
    for i, n in enumerate(sc["trainers"]):
        out.append(f"| {n} | " + " | ".join(f"{v[i]:,.0f}" for v in sc["eps"].values())
                   + f" | {sc['gap']['S-EASGD'][i]:.2f} |")
    rows = verdicts(res)
    out += ["", "## The paper's claims, checked here", "",
            "Rules (scripts/shadowsync_verdicts.py): *A has lower NE than B* is held iff the mean "
            "of the per-seed differences B - A exceeds 2 standard errors of that mean; "
            "otherwise not held (within noise, or reversed). *NE increases with k* is held iff "
            "the seed means rise at every step k = 5 -> 10 -> 30 -> 100 and the k = 100 minus "
            "k = 5 difference exceeds 2 SE. No tolerance is added for \"on par\": the paper "
            "claims *lower*, so that is what is tested. With 3 seeds, |d| > 2 SE happens by "
            "chance in about 18% of runs when there is no effect (t distribution, 2 degrees of "
            "freedom), which is why a second run with other seeds is part of the study.", ""]
    for r in rows:
        out.append(f"- `{r['id']}`: *{r['claim']}* {_v(r)}. {r['detail']}")
    out += ["", "Not checked here: *the sync is off the critical path in real time* "
            "(`scripts/bench_runtime.py`, threaded, real clock). Its runs on the shared 2-core "
            "box, reported in docs/performance.md with their commands, gave S-EASGD / no-sync "
            "ratios of 0.84, 0.92 and 0.93 (single repeats ranging 78K-131K ex/s), a spread as "
            "large as the effect, so no verdict is given for it here; in the virtual clock it holds by "
            "construction (see `scaling/s-easgd-linear`). Nor: Table 3 (relative NE increase "
            "from 5 to 10 and 20 trainers), Sec. 4.2 / Fig. 7 (S-EASGD vs S-BMUF vs S-MA; the "
            "paper finds \"none of those algorithm stands out clearly\" on Eval NE, so there is "
            "no direction to test), Sec. 4.3 / Fig. 8 (Hogwild worker threads).", ""]
    if other is not None:
        theirs = {r["id"]: r for r in verdicts(other)}
        agree = sum(theirs.get(r["id"], {}).get("verdict") == r["verdict"] for r in rows)
        oseeds = ", ".join(str(s) for s in other["seeds"])
        out += ["## Stability: a second run with other seeds", "",
                f"Second run: `{other.get('command', '?')}` (commit {other.get('commit', '?')}, "
                f"seeds {oseeds}, {other['wall_seconds']:.0f} s). Verdicts agree on "
                f"**{agree} of {len(rows)}** claims. Its scaling table (seed {other['scaling']['seed']}) "
                + ("is identical to this run's, as a seed-independent virtual-clock schedule must be."
                   if other["scaling"]["eps"] == res["scaling"]["eps"] else
                   "**differs** from this run's: virtual-clock EPS should not depend on the seed."),
                "",
                "| claim | this run | second run | same |", "|---|---|---|---|"]
        for r in rows:
            t = theirs.get(r["id"], {}).get("verdict", "-")
            out.append(f"| `{r['id']}` | {r['verdict']} | {t} | "
                       f"{'yes' if t == r['verdict'] else '**no**'} |")
        out.append("")
        for ds in other["datasets"]:
            c = cells(other, ds)
            out.append(f"Second run, {ds}, Eval NE: " + "; ".join(
                f"{n} {_ms(m['eval_ne'])}" for n, m in c.items()) + ".")
        out.append("")
    out += ["Caveats: a few seeds per cell, short runs (k = 100 syncs only a few times per "
            "trainer), a synthetic task and a small public dataset instead of the paper's "
            "production data; the virtual clock models compute as a constant per example and "
            "links as FIFO queues, not a real network.", "",
            "See also docs/shadowsync_curves.md: eval NE over training examples (Fig. 4/5 style) "
            "and why a 4x2 Frappe run's Train NE reads 2.1.", ""]
    return "\n".join(out)


def write(path: pathlib.Path, res: dict, other: dict | None = None) -> None:
    """The markdown to `path`, the figure to shadowsync_scaling.{png,svg} beside it."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plot(res["scaling"], path.parent / "shadowsync_scaling")
    path.write_text(markdown(res, other))
