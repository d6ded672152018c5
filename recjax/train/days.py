"""``--data.eval_protocol=next_day``: train day t, evaluate on day t + 1, day after day.

GBA's continual-training protocol (Su et al. 2022, Sec. 5.1 Table 5.1 and Sec. 5.2 Fig. 6:
Criteo's 23 days and Alimama's trained day by day after base days, scored on the test days, the
training mode switched at a day boundary), and MLPerf DLRM's "score a later window". A run of
this protocol is a chain of ordinary ``--resume`` segments in one ``--out``, one per day:
segment t trains to the step at which day t's last example has been trained and evaluates on
day t + 1 (synthetic data: fresh
examples of that day's teacher, ``synthetic.eval_day``; a Parquet dataset of one file per day:
the hold-out rows of that day, ``data.eval_day``). The last day evaluates on the day after it
(synthetic) or on the whole eval set (files). Every algorithm runs it unchanged (each segment is
a plain run of ``run``), and a later command may resume the chain with another ``--algo``: the
day schedule of GBA's switch experiments is a sequence of commands (docs/data.md).

After each day, one ``kind: day`` record goes to metrics.jsonl (day, eval day, step, algorithm,
eval AUC / NE / log loss, the eval day's Bayes-optimal NE for synthetic data); summary.json gets
``days``, every day's record of the run directory (earlier commands' included).

The days are cut on step boundaries: day t ends at the first step by which all of its training
examples have been trained (``ceil(examples through day t / B)``, at most the epoch's steps).
When a day's examples are not a multiple of the batch, that step's batch also holds the first
examples of day t + 1's training rows; never an example of the eval set (a hold-out, or fresh
synthetic examples).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

import numpy as np

from recjax.config import Config
from recjax.data.days import days_of, has_days, num_days
from recjax.data.synthetic import SyntheticSource
from recjax.runlog import MetricsWriter, read_summary, write_json_atomic
from recjax.train.contract import committed_steps
from recjax.train.data import open_data

RunFn = Callable[[Config], dict]
RECORD_KEYS = ("eval_auc", "eval_ne", "eval_logloss", "eval_examples", "bayes_eval_ne",
               "eval_ne_gap_to_bayes")


def day_end_steps(cfg: Config) -> list[int]:
    """The global step at which each training day ends (see the module docstring)."""
    data = open_data(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_day=-1)))
    b = cfg.train.batch_size
    if isinstance(data.train, SyntheticSource):
        n, d = data.train.num_rows, cfg.synthetic.days
        ends = [-(-(t + 1) * n // d) for t in range(d)]  # rows r < ends[t] are of days <= t
    else:
        if not has_days(data.train):
            raise ValueError(f"{cfg.data.train}: data.eval_protocol=next_day needs data with "
                             "days: synthetic data with --synthetic.days, or a Parquet dataset "
                             "converted from one input per day (scripts/convert.py)")
        src, per_day = data.train, np.zeros(num_days(data.train), np.int64)
        for c in range(len(src.chunk_sizes())):  # the row ids only, no example read
            rows = src.chunk_row_ids(c)
            if data.keep_train is not None:
                rows = rows[np.asarray(data.keep_train(rows), bool)]
            per_day += np.bincount(days_of(src, rows), minlength=per_day.size)
        ends = np.cumsum(per_day).tolist()
    per_epoch = data.train_rows // b
    return [min(-(-e // b), per_epoch) for e in ends]


def _with(cfg: Config, steps: int, resume: bool, eval_day: int) -> Config:
    synthetic = cfg.data.train.startswith("synthetic")
    train = dataclasses.replace(cfg.train, steps=steps, resume=resume)
    data = dataclasses.replace(cfg.data, eval_protocol="final",
                               eval_day=-1 if synthetic else eval_day)
    syn = (dataclasses.replace(cfg.synthetic, eval_day=eval_day) if synthetic
           else cfg.synthetic)
    return dataclasses.replace(cfg, train=train, data=data, synthetic=syn)


def run_days(cfg: Config, run: RunFn) -> dict:
    """Train `cfg` day by day under `run` (``algorithms.run``), evaluating each day's model on
    the next day; returns the last day's summary with ``days``, the per-day table.

    The run trains from its checkpoint (``--resume``; a day boundary) to ``train.steps`` (a day
    boundary; 0: the end of the data's last day: the days are trained once, whatever
    ``train.epochs``), one segment per day.
    """
    tc = cfg.train
    if not tc.out:
        raise ValueError("data.eval_protocol=next_day chains one resumed segment per day: give "
                         "--out DIR")
    ends = day_end_steps(cfg)
    total = tc.steps or ends[-1]
    done = committed_steps(os.path.join(tc.out, "checkpoints")) if tc.resume else []
    start = done[-1] if done else 0
    for what, step in (("train.steps", total), ("the checkpoint to resume", start)):
        if step and step not in ends:
            raise ValueError(f"data.eval_protocol=next_day: {what} is at step {step}, inside a "
                             f"day; the days end at steps {ends}")
    if start >= total:
        raise ValueError(f"data.eval_protocol=next_day: nothing to train, the checkpoint is at "
                         f"step {start} and train.steps at {total}")
    last_day = len(ends) - 1
    synthetic = cfg.data.train.startswith("synthetic")
    summary: dict = {}
    resume = tc.resume
    for day, end in enumerate(ends):
        if not start < end <= total:
            continue
        eval_day = day + 1 if synthetic or (day < last_day and not cfg.data.eval) else -1
        summary = run(_with(cfg, end, resume, eval_day))
        resume = True  # the next day goes on from this one's checkpoint
        if "stopped_at" in summary:  # interrupted: the checkpoint holds where it stopped
            return summary
        rec = {"kind": "day", "step": summary["steps"], "day": day,
               "eval_day": eval_day if eval_day >= 0 else None,
               "algorithm": summary["algorithm"],
               **{k: summary.get(k) for k in RECORD_KEYS if summary.get(k) is not None}}
        writer = MetricsWriter(tc.out, False, append=True)
        writer.write(rec)
        writer.close()
    return _with_table(tc.out, summary)


def day_records(out: str) -> list[dict]:
    """The ``kind: day`` records of the run in `out`, one per day (the latest where a day was
    run again), in day order."""
    path = os.path.join(out, "metrics.jsonl")
    by_day = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    if r.get("kind") == "day":
                        by_day[r["day"]] = r
    return [by_day[d] for d in sorted(by_day)]


def _with_table(out: str, summary: dict) -> dict:
    """`summary` (the last segment's) with the per-day table, written to summary.json too."""
    table = [{k: v for k, v in r.items() if k != "kind"} for r in day_records(out)]
    path = os.path.join(out, "summary.json")
    on_disk, _ = read_summary(path)
    if on_disk is not None:
        write_json_atomic(path, {**on_disk, "days": table})
    return {**summary, "days": table}


def table_text(days: list[dict]) -> str:
    """The per-day table as text (what ``scripts/train.py`` prints)."""
    head = f"{'day':>4} {'eval day':>8} {'step':>7} {'algorithm':>9} {'AUC':>7} {'NE':>7} " \
           f"{'Bayes NE':>8}"
    rows = [head]
    for r in days:
        ev = "eval set" if r["eval_day"] is None else str(r["eval_day"])
        bayes = r.get("bayes_eval_ne")
        rows.append(f"{r['day']:>4} {ev:>8} {r['step']:>7} {r['algorithm']:>9} "
                    f"{r['eval_auc']:7.4f} {r['eval_ne']:7.4f} "
                    f"{'' if bayes is None else f'{bayes:8.4f}'}")
    return "\n".join(rows)
