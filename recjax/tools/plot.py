"""Overlaid training curves of runs: `python scripts/plot.py RUN_DIR... --y eval_ne --x examples`.

Reads each run's metrics.jsonl (and summary.json for its label) and draws one line per run,
each with its own colour, dash and marker, into an SVG (vector, text kept as text) and a PNG
beside it. ``--y`` is a field of the records: ``eval_ne`` / ``eval_auc`` / ``eval_logloss``
(``kind: eval``), ``train_ne`` / ``train_ne_window`` / ``loss`` (``kind: train``), or any
counter (``avg_sync_gap``, ``mean_staleness``, ...; ``kind: counters``). ``--x``: ``step``,
``examples`` (step x global batch) or ``seconds`` (wall seconds, or virtual seconds for
``--deterministic`` runs, read off the train records), or ``day``: the ``kind: day`` records of
a ``--data.eval_protocol=next_day`` run (docs/data.md), one point per day at the day evaluated
(``--y eval_auc``, ``eval_ne``, ``bayes_eval_ne``, ...), the days a run trained with another
algorithm than its first shaded, and with ``--y eval_ne`` each day's Bayes-optimal NE dotted.

    python scripts/plot.py runs/easgd runs/bmuf --y eval_ne --x examples --out docs/fig.svg
"""

import argparse
import json
import pathlib

import numpy as np

Y_LABELS = {"eval_ne": "eval NE (lower is better)", "eval_auc": "eval AUC",
            "eval_logloss": "eval log loss", "train_ne": "train NE, whole run so far",
            "train_ne_window": "train NE of the logging window", "loss": "train log loss"}
STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"),
          ((0, (1, 1)), "P"), ((0, (8, 2)), "X"), ((0, (3, 1, 1, 1, 1, 1)), "*")]


def load(run: pathlib.Path, y: str, x: str) -> tuple[np.ndarray, np.ndarray, str]:
    """``(x values, y values, x unit)`` of one run; the unit says wall or virtual seconds."""
    recs = _records(run)
    if x == "day":
        days = _days(run, recs)
        if not days or any(y not in r for r in days):
            raise SystemExit(f"{run / 'metrics.jsonl'}: no kind: day record with {y!r} (run with "
                             "--data.eval_protocol=next_day)")
        return (np.array([r["day"] + 1 for r in days], float), np.array([r[y] for r in days]),
                "day evaluated (the model trained through the day before)")
    kind, field = ("eval", y[5:]) if y.startswith("eval_") else (None, y)
    pts = [r for r in recs if (r.get("kind") == kind if kind else field in r) and field in r
           and r.get(field) is not None and "step" in r]
    if not pts:
        fields = sorted({k for r in recs for k in r} | {f"eval_{k}" for r in recs
                                                        if r.get("kind") == "eval" for k in r})
        raise SystemExit(f"{run / 'metrics.jsonl'}: no record has {y!r}; --y can be one of "
                         f"{', '.join(fields)}")
    last = {}
    for r in pts:  # a resumed run may repeat a step: the latest record wins
        last[r["step"]] = r[field]
    steps = np.array(sorted(last), float)
    ys = np.array([last[s] for s in sorted(last)], float)
    if x == "step":
        return steps, ys, "global step"
    train = [r for r in recs if r.get("kind") == "train"]
    if x == "examples":
        per = train[0]["examples"] / train[0]["step"] if train else _batch(run)
        return steps * per, ys, "training examples"
    virtual = any("virtual_seconds" in r for r in train)
    key = "virtual_seconds" if virtual else "wall"
    t_steps = np.array([0.0] + [r["step"] for r in train])
    t = np.array([0.0] + [r[key] for r in train])
    return np.interp(steps, t_steps, t), ys, "virtual seconds" if virtual else "wall seconds"


def _records(run: pathlib.Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"{path}: no such file; give run directories written with --out")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _days(run: pathlib.Path, recs: list[dict] | None = None) -> list[dict]:
    """The run's ``kind: day`` records, the latest per day, in day order."""
    last = {r["day"]: r for r in (recs or _records(run)) if r.get("kind") == "day"}
    return [last[d] for d in sorted(last)]


def _summary(run: pathlib.Path) -> dict:
    p = run / "summary.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _batch(run: pathlib.Path) -> int:
    return _summary(run)["batch_size"]


def _short(v: float, _pos=None) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def label(run: pathlib.Path) -> str:
    """The run's algorithm and the settings that tell runs apart, from its summary.json."""
    s = _summary(run)
    if not s:
        return run.name
    algo = s.get("algorithm", run.name)
    if algo in ("shadow", "fr"):
        rule = s.get("sync_rule", "").upper()
        gap = f" k={s['sync_gap_k']}" if s.get("sync_gap_k") else ""
        return f"{'S' if algo == 'shadow' else 'FR'}-{rule}{gap}"
    return algo


def _day_marks(ax, runs: list[pathlib.Path], y: str) -> None:
    """Per-day plots: the days some run trained with another algorithm than its first day's
    shaded, and each day's Bayes-optimal NE."""
    switched = set()
    for run in runs:
        days = _days(run)
        switched |= {r["day"] for r in days if r["algorithm"] != days[0]["algorithm"]}
    for i, d in enumerate(sorted(switched)):
        ax.axvspan(d + 0.5, d + 1.5, color="0.85", alpha=0.5, linewidth=0,
                   label="trained with another algorithm" if i == 0 else None)
    if y == "eval_ne" and runs:
        days = [r for r in _days(runs[0]) if r.get("bayes_eval_ne") is not None]
        if days:
            ax.plot([r["day"] + 1 for r in days], [r["bayes_eval_ne"] for r in days],
                    color="0.4", linewidth=1.0, linestyle=(0, (2, 2)),
                    label="Bayes-optimal NE of the day")
    import matplotlib.ticker

    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=pathlib.Path, help="run directories (--out of a run)")
    p.add_argument("--y", default="eval_ne", help="eval_ne | train_ne | loss | a counter ...")
    p.add_argument("--x", default="examples", choices=["step", "examples", "seconds", "day"])
    p.add_argument("--logx", action="store_true", help="logarithmic x axis")
    p.add_argument("--labels", help="comma-separated legend labels, one per run")
    p.add_argument("--title", default="")
    p.add_argument("--out", default="curves.svg", help="figure path (.svg; a .png is written beside)")
    a = p.parse_args(argv)
    labels = a.labels.split(",") if a.labels else [label(r) for r in a.runs]
    if len(labels) != len(a.runs):
        p.error(f"--labels has {len(labels)} names for {len(a.runs)} runs")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "recjax", "font.size": 10})
    fig, ax = plt.subplots(figsize=(8.0 if a.x == "day" else 6.0, 3.8))
    units = set()
    for i, (run, name) in enumerate(zip(a.runs, labels)):
        xs, ys, unit = load(run, a.y, a.x)
        units.add(unit)
        dash, marker = STYLES[i % len(STYLES)]
        (line,) = ax.plot(xs, ys, linestyle=dash, marker=marker, markersize=4, linewidth=1.4,
                          markevery=max(1, len(xs) // 12), label=name, color=f"C{i % 10}")
        line.set_gid(f"run-{i}")
    if a.x == "day":
        _day_marks(ax, a.runs, a.y)
    bayes = {_summary(r).get("bayes_eval_ne") for r in a.runs}
    one_floor = len(bayes) == 1 and None not in bayes  # the same teacher: its floor
    if a.x != "day" and a.y == "eval_ne" and one_floor:
        ax.axhline(bayes.pop(), color="0.4", linewidth=1.0, linestyle=(0, (2, 2)),
                   label="Bayes-optimal eval NE")
    if a.logx:
        ax.set_xscale("log")
    if a.x in ("step", "examples"):  # 250K, not 250000
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_short))
    ax.set_xlabel(" / ".join(sorted(units)))
    ax.set_ylabel(Y_LABELS.get(a.y, a.y.replace("_", " ")))
    ax.grid(True, which="major", alpha=0.3)
    if a.x == "day":  # beside the axes: the days' lines fill them
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(frameon=False)
    if a.title:
        ax.set_title(a.title, fontsize=9)
    fig.tight_layout()
    out = pathlib.Path(a.out).with_suffix(".svg")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None})
    fig.savefig(out.with_suffix(".png"), dpi=200)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0

