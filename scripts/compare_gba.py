"""GBA study (Su et al., NeurIPS 2022): the Fig. 6 and Table 5.3 analogues.

    python scripts/compare.py gba [--quick] [--out runs/compare_gba] [--frappe PATH]

Fig. 6 (a-c), switching without re-tuning: the synchronous reference (``--algo single``,
global batch 256) trains the first part of the data and checkpoints; each of the six
``--gba.mode`` values (and ``single`` itself, the no-switch reference) continues from a copy of
that checkpoint with the same optimizers, learning rates and global batch, one ``--resume``
segment per data chunk, and the eval AUC after each chunk is recorded. Fig. 6 (d-f), back to
sync: each mode's checkpoint after half the chunks continues under ``single`` for the rest.
Table 5.3: dropped gradients, dense and embedding staleness, updates, summed over the chunks.

Workers: N_a = 4, B_a = 64 (M = 4), stragglers ``lognormal:sigma=0.3+slow:k=1,factor=4``, the
deterministic virtual clock (bit-reproducible). Knobs from Table 5.1 (Criteo row) scaled to 4
workers: iota = 3, b1 = 2, b2 = 2 (20 of 100 workers -> 2 of 4, since 1 would be Async),
b3 = 1 (20 of 100 -> 1 of 4). Writes OUT/gba_study.json, OUT/gba_study.md and
OUT/gba_switch.{svg,png}; checkpoints under OUT/work (rebuilt each run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

MODES = ("gba", "sync", "async", "hop_bs", "bsp", "hop_bw")
ARMS = ("single",) + MODES
WORKERS, LOCAL, GLOBAL = 4, 64, 256  # N_a, B_a, global batch (M = GLOBAL / LOCAL = 4)
STRAGGLERS = "lognormal:sigma=0.3+slow:k=1,factor=4"
KNOBS = dict(iota=3, b1=2, b2=2, b3=1)
FRAPPE = "frappe/frappe.train.libfm"  # under $RECJAX_DATA (default ../shared/data)
ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Global steps of the study. Attributes:
      base: steps of the synchronous base run (the inherited checkpoint).
      chunk: steps per data chunk (one --resume segment, one eval).
      chunks: chunks after the switch.
      back_at: chunks trained under the mode before switching back to single (Fig. 6 d-f).
    """

    base: int
    chunk: int
    chunks: int
    back_at: int


SIZES = ("smoke", "quick", "full")


def base_config(dataset: str, size: str = "full", frappe: str = ""):
    """(config, schedule): DLRM on synthetic:default, DeepFM on Frappe (compare.py's models);
    ``smoke`` (tests): the smoke DLRM on a few thousand synthetic rows."""
    from recjax import configs
    from recjax.config import DataConfig
    from recjax.models.config import ModelConfig

    quick = size != "full"
    if dataset == "synthetic":
        c = configs.smoke() if size == "smoke" else configs.default()  # Adam 2e-3, Adagrad 0.05
        sched = {"smoke": Schedule(3, 2, 2, 1), "quick": Schedule(120, 40, 4, 2),
                 "full": Schedule(400, 100, 6, 3)}[size]
        n = (sched.base + sched.chunk * sched.chunks) * GLOBAL
        c = dataclasses.replace(c, synthetic=dataclasses.replace(
            c.synthetic, n_train=n, n_eval={"smoke": 2048, "quick": 20_000}.get(size, 50_000)))
    else:
        c = configs.frappe()  # Adam 1e-3 dense, Adagrad 0.1 sparse; seeded 90/10 hold-out
        c = dataclasses.replace(c, data=DataConfig(train=f"frappe:{frappe}"),
                                model=ModelConfig(name="deepfm", embed_dim=16, deep_mlp=(64, 32)))
        sched = Schedule(100, 40, 4, 2) if quick else Schedule(200, 50, 6, 3)
    return dataclasses.replace(c, train=dataclasses.replace(
        c.train, batch_size=GLOBAL, steps=sched.base, progress=False, deterministic=True,
        eval_batch_size=8192, log_every=10_000, keep_ckpts=1),
        runtime=dataclasses.replace(c.runtime, stragglers=STRAGGLERS),
        gba=dataclasses.replace(c.gba, workers=WORKERS, local_batch_size=LOCAL, **KNOBS)), sched


def arm(c, algo: str, out: pathlib.Path, steps: int, resume: bool = True):
    """`c` under `algo` (single, or a gba mode) for `steps` global steps into `out`."""
    mode = "gba" if algo == "single" else algo
    return dataclasses.replace(
        c, train=dataclasses.replace(c.train, algo="single" if algo == "single" else "gba",
                                     steps=steps, out=str(out), resume=resume),
        gba=dataclasses.replace(c.gba, mode=mode))


COUNTERS = ("dropped_gradients", "dropped_embedding_rows", "updates", "gradients_applied",
            "tokens_handed_out")


def segment(cfg) -> dict:
    """One --resume segment; the numbers the study keeps from its summary."""
    import algorithms

    t = time.perf_counter()
    s = algorithms.run(cfg)
    row = {k: s.get(k) for k in ("steps", "resumed_from_step", "eval_auc", "eval_ne",
                                 "eval_examples", "eval_ctr", "bayes_eval_ne", "global_qps")}
    row.update({k: s[k] for k in COUNTERS if k in s})
    for k in ("dense_staleness", "embedding_staleness"):
        if k in s:
            row[k] = s[k]["histogram"]
    row["secs"] = time.perf_counter() - t
    return row


def _merge(hists: list[dict]) -> dict:
    total: dict[int, int] = {}
    for h in hists:
        for k, v in h.items():
            total[int(k)] = total.get(int(k), 0) + v
    n = sum(total.values())
    return {"mean": sum(k * v for k, v in total.items()) / n if n else None,
            "max": max(total, default=None), "histogram": {str(k): total[k] for k in sorted(total)}}


def study(c, sched: Schedule, work: pathlib.Path, log=print) -> dict:
    """Base run, the seven forward arms chunk by chunk, and the six switches back to single."""
    from recjax.train import loop

    if work.exists():
        shutil.rmtree(work)  # the study's own checkpoints from an earlier run
    work.mkdir(parents=True)
    base = loop.run(arm(c, "single", work / "base", sched.base, resume=False))
    log(f"  base single {sched.base} steps: eval AUC {base['eval_auc']:.4f}")
    res = {"schedule": dataclasses.asdict(sched), "base": {"steps": base["steps"],
           "eval_auc": base["eval_auc"], "eval_ne": base["eval_ne"],
           "bayes_eval_ne": base.get("bayes_eval_ne")}, "forward": {}, "back": {}}
    for name in ARMS:
        out = work / name
        shutil.copytree(work / "base", out)
        rows = []
        for j in range(sched.chunks):
            rows.append(segment(arm(c, name, out, sched.base + (j + 1) * sched.chunk)))
            log(f"  {name:<7} chunk {j + 1}: step {rows[-1]['steps']} AUC "
                f"{rows[-1]['eval_auc']:.4f} ({rows[-1]['secs']:.1f}s)")
            if name != "single" and j + 1 == sched.back_at:
                shutil.copytree(out, work / f"{name}-back")
        res["forward"][name] = {"chunks": rows, **_totals(rows)}
    for name in MODES:
        out, rows = work / f"{name}-back", []
        for j in range(sched.back_at, sched.chunks):
            rows.append(segment(arm(c, "single", out, sched.base + (j + 1) * sched.chunk)))
        log(f"  {name:<7} -> single: AUC " + " ".join(f"{r['eval_auc']:.4f}" for r in rows))
        res["back"][name] = {"chunks": rows}
    return res


def _totals(rows: list[dict]) -> dict:
    out = {"handover_resumed_from_step": rows[0]["resumed_from_step"],
           "final_step": rows[-1]["steps"]}
    if "updates" in rows[0]:
        out.update({k: sum(r[k] for r in rows) for k in COUNTERS})
        for k in ("dense_staleness", "embedding_staleness"):
            out[k] = _merge([r[k] for r in rows])
        out["global_qps_virtual"] = sum(r["global_qps"] for r in rows) / len(rows)
    return out


# -- reporting ----------------------------------------------------------------------------------
PAR = 0.001  # the paper's claim: GBA within 0.001 AUC of sync


def deltas(res: dict, direction: str) -> dict[str, dict]:
    """Per mode: AUC minus the no-switch single run's, on the first and last chunk and averaged
    (Table 6.4 / 6.8 analogues)."""
    ref = [r["eval_auc"] for r in res["forward"]["single"]["chunks"]]
    if direction == "back":
        ref = ref[res["schedule"]["back_at"]:]
    out = {}
    for name, arm_res in res[direction].items():
        if name == "single":
            continue
        d = [r["eval_auc"] - x for r, x in zip(arm_res["chunks"], ref)]
        out[name] = {"first": d[0], "last": d[-1], "avg": sum(d) / len(d)}
    return out


def verdicts(res: dict) -> list[tuple[str, bool, str]]:
    """(claim, held, numbers) for one dataset."""
    fw, bk = deltas(res, "forward"), deltas(res, "back")
    out = []
    for direction, d in (("from sync", fw), ("back to sync", bk)):
        g = d["gba"]["avg"]
        near = abs(g) <= PAR
        worse = {m: d[m]["avg"] for m in ("hop_bs", "bsp", "hop_bw", "async")}
        lose = all(v < g for v in worse.values())
        out.append((f"{direction}: GBA's AUC within {PAR} of sync (avg over chunks)", near,
                    f"GBA - single = {g:+.4f} (first {d['gba']['first']:+.4f}, "
                    f"last {d['gba']['last']:+.4f}); GBA - gba.mode=sync = "
                    f"{g - d['sync']['avg']:+.4f}"))
        out.append((f"{direction}: Hop-BS, BSP, Hop-BW and Async lose more than GBA", lose,
                    ", ".join(f"{m} {v:+.4f}" for m, v in worse.items())))
    return out


def _eval_n(res: dict) -> int:
    return res["forward"]["single"]["chunks"][-1]["eval_examples"]


def auc_se(res: dict) -> float:
    """Hanley & McNeil (1982) standard error of the no-switch run's last AUC on the eval set."""
    last = res["forward"]["single"]["chunks"][-1]
    a, n = last["eval_auc"], last["eval_examples"]
    n1 = round(n * last["eval_ctr"])
    n0 = n - n1
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    return math.sqrt((a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n0 * n1))


def _f(x, fmt=".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def report(results: dict, meta: dict) -> str:
    out = ["# GBA study: Fig. 6 and Table 5.3 analogues", "",
           f"`{meta['command']}`, {meta['secs']:.0f} s. Settings: {meta['settings']}", ""]
    for ds, res in results.items():
        sch = res["schedule"]
        arms = list(res["forward"])
        out += [f"## {ds}", "",
                f"Base: `single` for {sch['base']} steps (eval AUC {res['base']['eval_auc']:.4f}"
                + (f", Bayes eval NE {res['base']['bayes_eval_ne']:.4f}"
                   if res["base"].get("bayes_eval_ne") else "")
                + f"); then {sch['chunks']} chunks of {sch['chunk']} steps x {GLOBAL} examples.",
                "", "### Eval AUC after each chunk, switched from sync (Fig. 6 a-c)", "",
                "| mode | " + " | ".join(f"chunk {j + 1}" for j in range(sch["chunks"]))
                + " | avg - single |", "|---|" + "---|" * (sch["chunks"] + 1)]
        fw = deltas(res, "forward")
        for name in arms:
            aucs = [r["eval_auc"] for r in res["forward"][name]["chunks"]]
            d = fw.get(name, {}).get("avg")
            out.append(f"| {name} | " + " | ".join(f"{a:.4f}" for a in aucs)
                       + f" | {_f(d, '+.4f')} |")
        out += ["", f"Sampling standard error of one AUC on these {_eval_n(res)} eval rows "
                f"(Hanley-McNeil): {auc_se(res):.4f}. Every arm is scored on the same rows, so "
                "the differences between arms are paired and vary less than that.", "",
                f"### Back to sync after {sch['back_at']} chunks under the mode (Fig. 6 d-f)", "",
                "| mode -> single | " + " | ".join(
                    f"chunk {j + 1}" for j in range(sch["back_at"], sch["chunks"]))
                + " | avg - single |", "|---|" + "---|" * (sch["chunks"] - sch["back_at"] + 1)]
        bk = deltas(res, "back")
        ref = [r["eval_auc"] for r in res["forward"]["single"]["chunks"]][sch["back_at"]:]
        out.append("| single (no switch) | " + " | ".join(f"{a:.4f}" for a in ref) + " | - |")
        for name, b in res["back"].items():
            out.append(f"| {name} | " + " | ".join(f"{r['eval_auc']:.4f}" for r in b["chunks"])
                       + f" | {bk[name]['avg']:+.4f} |")
        out += ["", "### AUC difference from the no-switch sync run (Tables 6.4 / 6.8 analogue)",
                "", "| mode | from sync: first | last | avg | back to sync: first | last | avg |",
                "|---|---|---|---|---|---|---|"]
        for name in MODES:
            a, b = fw[name], bk[name]
            out.append(f"| {name} | {a['first']:+.4f} | {a['last']:+.4f} | {a['avg']:+.4f} | "
                       f"{b['first']:+.4f} | {b['last']:+.4f} | {b['avg']:+.4f} |")
        out += ["", "### Fine-grained counters over the chunks after the switch (Table 5.3 "
                "analogue)", "",
                "| mode | updates | grads applied | dropped grads | dropped emb. rows | "
                "dense staleness avg (max) | emb. staleness avg (max) | global QPS (virtual) | "
                "last AUC |", "|---|---|---|---|---|---|---|---|---|"]
        for name in MODES:
            f = res["forward"][name]
            ds_, es = f["dense_staleness"], f["embedding_staleness"]
            out.append(f"| {name} | {f['updates']} | {f['gradients_applied']} | "
                       f"{f['dropped_gradients']} | {f['dropped_embedding_rows']} | "
                       f"{_f(ds_['mean'], '.2f')} ({ds_['max']}) | {_f(es['mean'], '.2f')} "
                       f"({es['max']}) | {f['global_qps_virtual']:,.0f} | "
                       f"{f['chunks'][-1]['eval_auc']:.4f} |")
        out += ["", "### Verdicts", ""]
        for claim, ok, nums in verdicts(res):
            out.append(f"- {claim}: **{'held' if ok else 'did not hold'}** ({nums})")
        out.append("")
    return "\n".join(out)


def plot(results: dict, path: pathlib.Path) -> None:
    """AUC per chunk, one line per arm; columns: from sync, back to sync; a row per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a small svg
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(9, 3.2 * len(results)), squeeze=False)
    for row, (ds, res) in zip(axes, results.items()):
        sch = res["schedule"]
        steps = [sch["base"] + (j + 1) * sch["chunk"] for j in range(sch["chunks"])]
        for name in ARMS:
            style = dict(color="k", lw=2.2) if name == "single" else dict(lw=1.3)
            row[0].plot(steps, [r["eval_auc"] for r in res["forward"][name]["chunks"]], "o-",
                        ms=3, label=name if name == "single" else f"gba.mode={name}", **style)
        b = sch["back_at"]  # the back-to-sync lines start at the switch point (the mode's AUC)
        ref = [r["eval_auc"] for r in res["forward"]["single"]["chunks"]]
        row[1].plot(steps[b - 1:], ref[b - 1:], "o-", ms=3, color="k", lw=2.2)
        for name in MODES:
            row[1].plot(steps[b - 1:], [res["forward"][name]["chunks"][b - 1]["eval_auc"]]
                        + [r["eval_auc"] for r in res["back"][name]["chunks"]], "o-", ms=3, lw=1.3)
        row[0].set_title(f"{ds}: switched from sync at step {sch['base']}", fontsize=9)
        row[1].set_title(f"{ds}: mode until step {steps[sch['back_at'] - 1]}, then sync",
                         fontsize=9)
        for ax in row:
            ax.set_xlabel("global step (x256 examples)")
            ax.set_ylabel("eval AUC")
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path.with_suffix(".svg"))
    fig.savefig(path.with_suffix(".png"), dpi=72)
    plt.close(fig)


def _enable_compile_cache(directory: pathlib.Path) -> None:
    """Every segment rebuilds its jitted functions; the persistent cache makes the rebuilds
    loads (same executables, same bits)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv=None) -> int:
    from recjax.data.sources import DataError, resolve_path

    p = argparse.ArgumentParser(prog="compare.py gba", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer, shorter chunks (< 3 min)")
    p.add_argument("--smoke", action="store_true", help="seconds-long tiny runs (tests)")
    p.add_argument("--out", default=str(ROOT / "runs" / "compare_gba"), help="output folder")
    p.add_argument("--frappe", default=FRAPPE, help="Frappe libfm file (relative paths are "
                   "looked up under $RECJAX_DATA, default ../shared/data)")
    p.add_argument("--datasets", default="synthetic,frappe", help="comma-separated subset")
    p.add_argument("--data", help="data folder the relative data paths are under (default "
                   "$RECJAX_DATA, else ../shared/data next to the checkout)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="do not keep jax's persistent compilation cache in OUT/jax_cache")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if args.data:  # recjax.data.sources.resolve_path looks relative paths up here
        os.environ["RECJAX_DATA"] = args.data
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_compile_cache:
        _enable_compile_cache(out / "jax_cache")
    t0 = time.perf_counter()
    results = {}
    for ds in args.datasets.split(","):
        path = ""
        if ds == "frappe":
            try:
                path = resolve_path(args.frappe)
            except DataError as e:
                print(f"skipping Frappe: {e}")
                continue
        print(f"{ds}:", flush=True)
        c, sched = base_config(ds, "smoke" if args.smoke else "quick" if args.quick else "full",
                               path)
        results[ds] = study(c, sched, out / "work" / ds, log=lambda s: print(s, flush=True))
    meta = {"command": " ".join(["python scripts/compare.py gba"] + argv), "secs": time.perf_counter() - t0,
            "settings": f"N_a = {WORKERS} workers, B_a = {LOCAL}, global batch {GLOBAL} "
            f"(M = {GLOBAL // LOCAL}), stragglers `{STRAGGLERS}`, "
            + ", ".join(f"{k} = {v}" for k, v in KNOBS.items())
            + ", embedding_mean/embedding_staleness/dense_mean at their defaults, "
            "deterministic virtual clock."}
    (out / "gba_study.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (out / "gba_study.md").write_text(report(results, meta))
    if results:
        plot(results, out / "gba_switch")
    print(f"wrote {out}/gba_study.{{json,md}} and gba_switch.{{svg,png}} "
          f"({time.perf_counter() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
