"""The single-device trainer, read top to bottom: data -> state -> jitted steps -> eval -> files.

    summary = run(cfg)

Data order is a pure function of (seed, epoch), so a run resumed from the checkpoint at step k
replays exactly the batches an uninterrupted run would have seen from step k on; together with
XLA:CPU's deterministic kernels this makes resumed runs bitwise equal to uninterrupted ones
(tests/test_train.py).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from typing import Any, Protocol

import jax
import numpy as np
from tqdm.auto import tqdm

from recjax import metrics
from recjax.batch import Batch
from recjax.checkpoint import Checkpointer
from recjax.concurrency import Prefetcher
from recjax.config import Config
from recjax.data.pipeline import batches
from recjax.data.synthetic import SyntheticSource
from recjax.metrics.logloss import sigmoid
from recjax.runlog import MetricsWriter, write_json_atomic
from recjax.train.data import RunData, open_data
from recjax.train.setup import build, count_params
from recjax.train.step import StepMetrics, TrainState, jit_predict, jit_train_step


class Strategy(Protocol):
    """How a run executes its steps: the single-device default, or an SPMD algorithm's.

    `run` owns data, logging, eval, checkpoints and the summary; a strategy owns placement and
    the jitted functions. Algorithms (``algorithms/``) implement this to reuse the trainer.
    """

    name: str

    def prepare(self, state: Any) -> Any:
        """Place a freshly built or restored state where the steps expect it."""
        ...

    def put_batch(self, batch: Batch) -> Any:
        """Host batch -> device batch (runs in the prefetch thread)."""
        ...

    def train_step(self, state: Any, batch: Any) -> tuple[Any, StepMetrics]: ...

    def predict(self, params: Any, tables: dict, batch: Batch) -> jax.Array: ...

    def unshard(self, state: Any) -> TrainState:
        """The state in the single-device layout: what checkpoints hold, so that any algorithm
        can resume (or start from) any other's checkpoint."""
        ...

    def summary(self) -> dict:
        """The algorithm's own counters for summary.json (e.g. comm_bytes_per_step)."""
        ...


class SingleDevice:
    """The reference strategy: one device, `train_step` jitted with the state donated."""

    name = "single"

    def __init__(self, model, tx, sparse_opt):
        self.train_step = jit_train_step(model, tx, sparse_opt)
        self.predict = jit_predict(model)

    def prepare(self, state):
        return jax.device_put(state)

    def put_batch(self, batch: Batch):
        return jax.device_put(batch)

    def unshard(self, state):
        return state

    def summary(self) -> dict:
        return {}


def train_batches(cfg: Config, data: RunData, start_step: int, total_steps: int,
                  steps_per_epoch: int) -> Iterator[Batch]:
    """Training batches for steps [start_step, total_steps): epoch e is shuffled by (seed, e)."""
    step = start_step
    epoch, skip = divmod(start_step, steps_per_epoch)
    # Synthetic examples are i.i.d. draws already: shuffling them would only cost time.
    buffer = 0 if isinstance(data.train, SyntheticSource) else cfg.data.shuffle_buffer
    while step < total_steps:
        stream = batches(data.train, cfg.train.batch_size, seed=cfg.train.seed, epoch=epoch,
                         shuffle_buffer=buffer, drop_remainder=True,
                         keep=data.keep_train)
        for i, (batch, _) in enumerate(stream):
            if i < skip:
                continue
            yield batch
            step += 1
            if step >= total_steps:
                return
        epoch, skip = epoch + 1, 0


def evaluate(cfg: Config, data: RunData, predict, params, tables) -> tuple[dict, np.ndarray | None]:
    """Eval metrics over the whole eval set in input order, and (labels, probs) if asked."""
    exact = data.eval_rows <= 20_000_000
    rm = metrics.RunningMetrics(keep_predictions=exact)
    preds = [] if cfg.train.save_predictions else None
    stream = batches(data.eval, cfg.train.eval_batch_size, seed=cfg.train.seed, epoch=0,
                     shuffle_buffer=0, drop_remainder=False, keep=data.keep_eval)
    for batch, n in stream:
        logits = np.asarray(predict(params, tables, batch))[:n]
        rm.update(batch.label[:n], logits)
        if preds is not None:
            preds.append(np.stack([batch.label[:n], sigmoid(logits)], 1))
    out = rm.result()
    return out, (np.concatenate(preds) if preds is not None else None)


def _sum_metrics(ms: list[StepMetrics]) -> dict:
    host = jax.device_get(ms)
    s = {k: float(sum(getattr(m, k) for m in host)) for k in StepMetrics._fields}
    s["loss"] = float(host[-1].loss)
    return s


def ne_from_sums(s: dict) -> float:
    """NE (ShadowSync Eq. 2) from StepMetrics sums: mean log loss / entropy of the mean label."""
    ctr = s["label_sum"] / max(s["count"], 1.0)
    h = metrics.binary_entropy(ctr)
    return s["logloss_sum"] / max(s["count"], 1.0) / h if h > 0 else float("nan")


# Config keys that may change between a checkpoint and its resumption: they do not alter the
# trajectory (how long to train, what to write, how often). Everything else must match.
RESUMABLE_CHANGES = {"train.steps", "train.epochs", "train.out", "train.resume", "train.log_every",
                     "train.eval_every", "train.ckpt_every", "train.keep_ckpts", "train.progress",
                     "train.save_predictions", "train.tensorboard", "train.stop_after",
                     "train.eval_batch_size", "data.prefetch", "data.workers", "data.cache_dir",
                     "data.cache_rows", "data.eval", "data.holdout", "data.split_seed"}


# Switching the algorithm (and its own settings) is a deliberate hand-over: checkpoints hold the
# single-device layout, so any algorithm can continue any other's run (GBA's sync -> async).
HANDOVER_SECTIONS = ("spmd", "runtime")
RESUMABLE_CHANGES |= {"train.algo", "train.devices", "train.deterministic"}


def check_resumable(saved: dict, now: dict) -> None:
    """Refuse to resume a checkpoint under a config that would change its trajectory."""
    diffs = [f"{sec}.{k}: checkpoint {saved[sec].get(k)!r}, now {v!r}"
             for sec, fields in now.items() if sec in saved and sec not in HANDOVER_SECTIONS
             for k, v in fields.items()
             if f"{sec}.{k}" not in RESUMABLE_CHANGES and saved[sec].get(k) != v]
    if diffs:
        raise ValueError("cannot --resume: the run's config differs from its checkpoint's in "
                         + "; ".join(diffs) + ". Resume with the original settings, or start "
                         "a new run in another --out")


class Progress:
    """Train-NE sums and timings of a run, carried across --resume in the checkpoint metadata.

    Attributes:
      totals: StepMetrics sums over every step so far (Train NE of the whole run).
      timed_steps: steps counted in the throughput (each segment's compile step excluded).
      train_seconds: time of those steps, without in-loop evals and checkpoints.
      wall_seconds: wall time of earlier segments (a resumed run adds its own).
    """

    def __init__(self, saved: dict | None = None):
        saved = saved or {}
        self.totals = saved.get("totals", dict.fromkeys(StepMetrics._fields, 0.0))
        self.timed_steps = saved.get("timed_steps", 0)
        self.train_seconds = saved.get("train_seconds", 0.0)
        self.wall_seconds = saved.get("wall_seconds", 0.0)

    def add(self, s: dict) -> None:
        for k in StepMetrics._fields:
            self.totals[k] += s[k]

    def as_dict(self, wall_now: float) -> dict:
        return {"totals": self.totals, "timed_steps": self.timed_steps,
                "train_seconds": self.train_seconds, "wall_seconds": self.wall_seconds + wall_now}


def run(cfg: Config, make_strategy=None, checkpoints: bool = True) -> dict:
    """Train and evaluate as `cfg` says; returns (and with --out writes) the summary dict.

    Args:
      cfg: the run's config.
      make_strategy: ``(cfg, model, tx, sparse_opt) -> Strategy``; default `SingleDevice`.
      checkpoints: write checkpoints/ under ``--out`` (False: summary, metrics and predictions
        only; a multi-process run's process 0, whose state is not all on its devices).
    """
    t0 = time.perf_counter()
    tc = cfg.train
    data = open_data(cfg)
    model, tx, sparse_opt, state = build(cfg, data.spec)
    steps_per_epoch = data.train_rows // tc.batch_size
    total_steps = tc.steps or tc.epochs * steps_per_epoch

    ckpt = (Checkpointer(os.path.join(tc.out, "checkpoints"), tc.keep_ckpts)
            if tc.out and checkpoints else None)
    progress = Progress()
    if tc.resume:
        state, meta = ckpt.restore(state)
        # compare as JSON sees them (tuples were saved as lists)
        check_resumable(meta.get("config", {}), json.loads(json.dumps(cfg.to_dict())))
        progress = Progress(meta.get("progress"))
    elif ckpt and ckpt.latest_step() is not None:
        raise ValueError(f"{ckpt.directory} already holds checkpoints of a run (latest step "
                         f"{ckpt.latest_step()}); pass --resume to continue it, or use another "
                         "--out (or delete that directory)")
    start_step = int(state.step)
    strategy = (make_strategy or (lambda c, *a: SingleDevice(*a)))(cfg, model, tx, sparse_opt)
    state = strategy.prepare(state)
    step_fn, predict = strategy.train_step, strategy.predict

    writer = MetricsWriter(tc.out, tc.tensorboard, append=tc.resume)
    stop_at = min(total_steps, tc.stop_after) if tc.stop_after else total_steps
    bar = tqdm(total=total_steps, initial=start_step, disable=not tc.progress, unit="step",
               dynamic_ncols=True, desc=f"{cfg.model.name} on {cfg.data.train}")

    window: list[StepMetrics] = []
    t_first = t_log = None  # end of the first (compiling) step; start of the current log window
    paused = 0.0  # seconds spent in in-loop evals and checkpoints since t_first
    step, first_step, interrupted = start_step, start_step, False

    def save(at: int) -> None:
        nonlocal window, paused
        t = time.perf_counter()
        if window:  # fold pending Train-NE sums in, so the checkpoint carries all of them
            progress.add(_sum_metrics(window))
            window = []
        progress.train_seconds = train_seconds_before + (t - t_first - paused if t_first else 0.0)
        progress.timed_steps = timed_before + (at - first_step if t_first else 0)
        ckpt.save(at, strategy.unshard(state), {"config": cfg.to_dict(),
                                                "progress": progress.as_dict(t - t0)})
        paused += time.perf_counter() - t

    train_seconds_before, timed_before = progress.train_seconds, progress.timed_steps
    prefetch = Prefetcher(train_batches(cfg, data, start_step, stop_at, steps_per_epoch),
                          depth=cfg.data.prefetch, transform=strategy.put_batch)
    try:
        for batch in prefetch:
            state, m = step_fn(state, batch)
            window.append(m)
            step += 1
            if t_first is None:  # the first step includes compilation: time from its end
                jax.block_until_ready(m.loss)
                t_first = t_log = time.perf_counter()
                first_step, log_from = step, step
            if step % tc.log_every == 0 or step == stop_at:
                s = _sum_metrics(window) if window else None
                now = time.perf_counter()
                rate = (step - log_from) * tc.batch_size / max(now - t_log, 1e-9)
                if s is not None:
                    progress.add(s)
                    bar.set_postfix(loss=f"{s['loss']:.4f}", ne=f"{ne_from_sums(progress.totals):.4f}",
                                    ex_s=f"{rate:,.0f}", refresh=False)
                    writer.write({"kind": "train", "step": step,
                                  "epoch": (step - 1) // steps_per_epoch,
                                  "examples": step * tc.batch_size, "loss": s["loss"],
                                  "train_ne_window": ne_from_sums(s),
                                  "train_ne": ne_from_sums(progress.totals),
                                  "examples_per_sec": rate, "wall": progress.wall_seconds + now - t0})
                bar.update(step - bar.n)
                window, t_log, log_from = [], time.perf_counter(), step
            if tc.eval_every and step % tc.eval_every == 0 and step < stop_at:
                t = time.perf_counter()
                ev, _ = evaluate(cfg, data, predict, state.params, state.tables)
                writer.write({"kind": "eval", "step": step, **ev})
                paused += time.perf_counter() - t
                t_log = time.perf_counter()
            if ckpt and step < stop_at and ((tc.ckpt_every and step % tc.ckpt_every == 0)
                                            or step % steps_per_epoch == 0):
                save(step)
                t_log = time.perf_counter()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        prefetch.close()
        bar.close()
    t_train_end = time.perf_counter()
    seg_seconds = t_train_end - t_first - paused if t_first else 0.0
    if ckpt and step > start_step:
        try:  # state is between steps here: a consistent point to save
            save(step)
        except RuntimeError as e:  # interrupted inside a dispatch: the donated state is gone
            print(f"could not checkpoint step {step} ({e}); the previous checkpoint is intact")
    elif window:
        progress.add(_sum_metrics(window))
    if interrupted or step < total_steps:
        if ckpt:
            ckpt.close()
        writer.close()
        # without checkpoints (no --out, or a multi-process run) there is nothing to resume
        print(f"stopped at step {step}/{total_steps}"
              + (f"; resume with --resume --out {tc.out}" if ckpt else ""))
        if interrupted:
            raise KeyboardInterrupt
        return {"stopped_at": step, "steps": step}

    ev, preds = evaluate(cfg, data, predict, state.params, state.tables)
    writer.write({"kind": "eval", "step": step, **ev})
    timed = timed_before + (step - first_step if t_first else 0)
    train_seconds = train_seconds_before + seg_seconds
    warnings = []
    if not np.isfinite(ev["auc"]):
        warnings.append(f"eval AUC/NE are undefined: the eval set ({ev['examples']} examples) "
                        f"has a single class (CTR {ev['ctr']}); use a larger eval set")
    summary = {
        "algorithm": tc.algo, "model": cfg.model.name, "dataset": cfg.data.train,
        "eval_dataset": data.eval_desc,
        "examples": step * tc.batch_size, "steps": step, "epochs": step / steps_per_epoch,
        "batch_size": tc.batch_size,
        "wall_seconds": progress.wall_seconds + time.perf_counter() - t0,
        "train_seconds": train_seconds,
        "examples_per_sec": timed * tc.batch_size / train_seconds if train_seconds > 0 else None,
        "train_ne": ne_from_sums(progress.totals) if progress.totals["count"] else None,
        "train_examples_scored": progress.totals["count"],
        "train_loss_last": float(jax.device_get(m.loss)) if step > start_step else None,
        "eval_auc": ev["auc"], "eval_auc_error_bound": ev["auc_error_bound"],
        "eval_logloss": ev["logloss"], "eval_ne": ev["ne"], "eval_calibration": ev["calibration"],
        "eval_examples": ev["examples"], "eval_ctr": ev["ctr"],
        "train_examples_per_epoch": data.train_rows,
        "data_stats": {"train": data.train.stats.as_dict(), "eval": data.eval.stats.as_dict()},
        **count_params(strategy.unshard(state)),
        **strategy.summary(),
        "resumed_from_step": start_step if tc.resume else None,
        "warnings": warnings,
        "hardware": {"platform": jax.default_backend(), "devices": jax.device_count(),
                     "device_kind": jax.devices()[0].device_kind, "cpu": platform.processor(),
                     "cores": os.cpu_count(), "jax": jax.__version__},
        "config": cfg.to_dict(),
    }
    for w in warnings:
        print(f"warning: {w}")
    if isinstance(data.eval, SyntheticSource) and cfg.synthetic.teacher:
        bayes = data.eval.bayes_optimal()
        summary.update(bayes_eval_ne=bayes["ne"], bayes_eval_auc=bayes["auc"],
                       eval_ne_gap_to_bayes=ev["ne"] - bayes["ne"])
    if tc.out:
        write_json_atomic(os.path.join(tc.out, "summary.json"), summary)
        if preds is not None:
            write_predictions(os.path.join(tc.out, "predictions.csv"), preds)
    if ckpt:
        ckpt.close()
    writer.close()
    return summary | {"final_state": state}


def write_predictions(path: str, preds: np.ndarray) -> None:
    """predictions.csv: `label,prob` rows in eval input order, written to a temp file then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("label,prob\n")
        np.savetxt(f, preds, fmt=["%d", "%.7g"], delimiter=",")
    os.replace(tmp, path)
