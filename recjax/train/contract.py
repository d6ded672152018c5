"""The run contract every trainer shares (DESIGN.md section 4, "One run contract").

The single-device trainer (`recjax.train.loop`), the SPMD algorithms (through it) and the
host-async engine (``algorithms/runtime/engine.py``) all go through these functions, so that a
run directory means the same thing whichever algorithm wrote it:

* `open_run` / `claim_out`: the ``--out`` policy (a fresh run, in any process layout, refuses
  a directory that already holds checkpoints or a finished run's summary; ``--resume``
  restores the latest checkpoint and refuses a config that would change what is trained or
  evaluated, naming each key) and the Train-NE sums and timings carried across segments;
* `Progress`: what a checkpoint carries besides the state (whole-run Train NE, timings);
* `evaluate` / `write_predictions`: the eval pass and predictions.csv;
* `build_summary` / `write_summary`: summary.json, with the same fields for every algorithm
  plus the algorithm's own counters.

``TrainState.step`` counts global steps everywhere: examples consumed = ``step x
train.batch_size``, so any algorithm's checkpoint starts any other (GBA's sync <-> async
switch, Su et al. 2022 Sec. 4.1, is a hand-over through one checkpoint).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from recjax import metrics, registry
from recjax.checkpoint import Checkpointer
from recjax.config import Config
from recjax.config_fields import resumable_keys
from recjax.data.pipeline import batches
from recjax.data.synthetic import SyntheticSource
from recjax.metrics.logloss import sigmoid
from recjax.runlog import drop_records_after, open_run_file, write_json_atomic
from recjax.train.data import RunData, rows_read
from recjax.train.setup import count_params
from recjax.train.step import StepMetrics, TrainState

# Config keys that may change between a checkpoint and its resumption: the fields declared with
# ``metadata=RESUMABLE`` (recjax/config.py). They do not alter the trajectory (how long to train,
# what to write, how often). Everything else must match. Not marked, so refused: ``data.eval``,
# ``data.holdout`` and ``data.split_seed`` choose the eval set and, when it is held out of the
# training data, the training set too (a new split puts trained rows into the eval set);
# ``train.monitor`` chose the state ``out/best`` holds. The marked ``data`` keys change how the
# data is read (caches, threads; the stream does not depend on them), ``eval_batch_size`` how
# the metrics of the same rows are summed (float rounding only); ``train.algo``,
# ``train.devices`` and ``train.deterministic`` are the hand-over below.
RESUMABLE_CHANGES = set(resumable_keys(Config))

# Switching the algorithm (and its own settings) is a deliberate hand-over: checkpoints hold the
# single-device layout, so any algorithm can continue any other's run (GBA's sync -> async).
HANDOVER_SECTIONS = registry.handover_sections()  # spmd, runtime, ray, shadowsync, gba, persia


def check_resumable(saved: dict, now: dict, defaults: dict | None = None) -> None:
    """Refuse to resume a checkpoint under a config that would change its trajectory.

    A key the checkpoint's config lacks (a field added since it was written) counts as its
    default in `defaults` (``Config().to_dict()``): new fields default to the old behaviour."""
    defaults = defaults or {}

    def was(sec: str, k: str):
        return saved[sec][k] if k in saved[sec] else defaults.get(sec, {}).get(k)

    diffs = [f"{sec}.{k}: checkpoint {was(sec, k)!r}, now {v!r}"
             for sec, fields in now.items() if sec in saved and sec not in HANDOVER_SECTIONS
             for k, v in fields.items()
             if f"{sec}.{k}" not in RESUMABLE_CHANGES and was(sec, k) != v]
    if diffs:
        raise ValueError("cannot --resume: the run's config differs from its checkpoint's in "
                         + "; ".join(diffs) + ". Resume with the original settings, or start "
                         "a new run in another --out")


# The checkpoint policy (README "What a run writes"): every run checkpoints at its end (and on
# Ctrl-C), and every train.ckpt_every steps when set; at each epoch's end only runs of at least
# SHORT_RUN_STEPS steps do. A short run is cheaper to rerun than its checkpoints are to write
# and keep: a 3-epoch DeepFM run on the 7,200-row Criteo sample wrote 398 MB of them (one
# checkpoint of its 2^17-row tables and their optimizer slots is 199 MB; keep_ckpts=2 kept two).
SHORT_RUN_STEPS = 1000


def epoch_checkpoints(total_steps: int) -> bool:
    """Whether a run of `total_steps` steps also checkpoints at each epoch's end."""
    return total_steps >= SHORT_RUN_STEPS


class Progress:
    """Train-NE sums and timings of a run, carried across --resume in the checkpoint metadata.

    Attributes:
      totals: StepMetrics sums over every step so far (Train NE of the whole run).
      timed_steps: steps counted in the throughput (each segment's compile step excluded).
      train_seconds: time of those steps, without in-loop evals and checkpoints.
      wall_seconds: wall time of earlier segments (a resumed run adds its own).
      early_stop: `EarlyStopper.state` at the checkpoint (None without early stopping or
        keep_best), so a resumed run goes on comparing with the best so far.
      counts: each host-async algorithm's additive counters up to the checkpoint (JSON: algo ->
        name -> int, or a histogram name -> {str: int}; `add_counts`; an algorithm's own, so a
        switch never adds GBA's staleness to Persia's), so that a summary's counters cover the whole
        run across checkpoint intervals and resumes ({} when it keeps none).
    """

    def __init__(self, saved: dict | None = None):
        saved = saved or {}
        self.totals = saved.get("totals", dict.fromkeys(StepMetrics._fields, 0.0))
        self.timed_steps = saved.get("timed_steps", 0)
        self.train_seconds = saved.get("train_seconds", 0.0)
        self.wall_seconds = saved.get("wall_seconds", 0.0)
        self.early_stop: dict | None = saved.get("early_stop")
        self.counts: dict = saved.get("counts", {})

    def add(self, s: dict) -> None:
        for k in StepMetrics._fields:
            self.totals[k] += s[k]

    def as_dict(self, wall_now: float) -> dict:
        return {"totals": self.totals, "timed_steps": self.timed_steps,
                "train_seconds": self.train_seconds, "wall_seconds": self.wall_seconds + wall_now,
                **({"early_stop": self.early_stop} if self.early_stop is not None else {}),
                **({"counts": self.counts} if self.counts else {})}


def add_counts(a: dict, b: dict) -> dict:
    """``a + b`` of two `Progress.counts` dicts: numbers add, histograms (dicts) add bin by
    bin."""
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict):
            h = dict(out.get(k, {}))
            for bin_, n in v.items():
                h[str(bin_)] = h.get(str(bin_), 0) + n
            out[k] = h
        else:
            out[k] = out.get(k, 0) + v
    return out


def subtract_counts(a: dict, b: dict) -> dict:
    """``a - b`` of two `Progress.counts` dicts (`b` counted before `a`, so every bin of `b`
    is in `a`): numbers subtract, histograms bin by bin, empty bins dropped."""
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict):
            h = {str(bin_): n for bin_, n in out.get(k, {}).items()}
            for bin_, n in v.items():
                h[str(bin_)] = h.get(str(bin_), 0) - n
            out[k] = {bin_: n for bin_, n in h.items() if n}
        else:
            out[k] = out.get(k, 0) - v
    return out


class DivergedError(ValueError):
    """The training loss became NaN or infinite: the run stops, nothing non-finite is saved."""


def sum_metrics(ms: list[StepMetrics], step: int | None = None, ckpt: Checkpointer | None = None,
                mean_loss: bool = False) -> dict:
    """StepMetrics sums over `ms` (fetched from the device), plus the last step's loss (with
    `mean_loss`, the mean of their batch losses: a host-async window has many workers' batches).

    Raises:
      DivergedError: a loss in `ms` is not finite (with `step`, the end of the window, and the
        last checkpoint in the message).
    """
    host = jax.device_get(ms)
    # in float64: a float32 running sum of a long segment's log losses drifts (issue 15)
    s = {k: float(sum(float(getattr(m, k)) for m in host)) for k in StepMetrics._fields}
    s["loss"] = s["loss"] / len(host) if mean_loss else float(host[-1].loss)
    if step is not None:
        check_finite(s, f"in steps {step - len(ms) + 1}-{step}", ckpt)
    return s


def check_finite(sums: dict, where: str, ckpt: Checkpointer | None) -> None:
    """Raise `DivergedError` if the loss sums are NaN or infinite (before anything is saved)."""
    if np.isfinite(sums["logloss_sum"]) and np.isfinite(sums.get("loss", 0.0)):
        return
    last = ckpt.latest_step() if ckpt is not None else None
    raise DivergedError(
        f"the training loss became NaN or infinite {where}; the run stops without saving that "
        "state. "
        + (f"The last good checkpoint is step {last} in {ckpt.directory}. " if last is not None
           else "No checkpoint was written before it. ")
        + "Lower the learning rates (--dense.lr, --sparse.lr), add --dense.clip_norm, or check "
        "the input data for extreme values")


def ne_from_sums(s: dict) -> float:
    """NE (ShadowSync Eq. 2) from StepMetrics sums: mean log loss / entropy of the mean label."""
    ctr = s["label_sum"] / max(s["count"], 1.0)
    h = metrics.binary_entropy(ctr)
    return s["logloss_sum"] / max(s["count"], 1.0) / h if h > 0 else float("nan")


def window_sums(s: dict) -> dict:
    """The Train-NE sums of one logging window, as a train record carries them (so that a
    reader can rebuild the curve: ``ne_from_sums`` of their running totals is ``train_ne``)."""
    return {"window_logloss_sum": s["logloss_sum"], "window_count": s["count"],
            "window_label_sum": s["label_sum"]}


def open_run(cfg: Config, state: TrainState, checkpoints: bool = True,
             resume: bool | None = None,
             loader=None) -> tuple[Checkpointer | None, TrainState, Progress]:
    """The ``--out`` and resume policy: ``(checkpointer or None, start state, progress)``.

    Args:
      cfg: the run's config.
      state: the freshly built initial state (its structure is what a checkpoint must match).
      checkpoints: keep checkpoints under ``--out`` (False: a multi-process run's process 0).
      resume: restore the latest checkpoint (default ``train.resume``; the host-async engine
        also goes on from its own periodic checkpoints this way).
      loader: holders that read the resumed step's tables themselves
        (`recjax.checkpoint_parts.Loader`; `Checkpointer.restore`): the state returned lacks
        them then.

    Raises:
      ValueError: a fresh run into an ``--out`` that holds a run (`claim_out`), or a resume
        whose config differs from the checkpoint's in a key that changes the trajectory.
      CheckpointCorruptError: a resume where no checkpoint is intact.
    """
    tc = cfg.train
    resume = tc.resume if resume is None else resume
    if tc.out:
        claim_out(tc.out, resume)  # every process layout: lock, and refuse a used --out
    if callable(checkpoints):  # every process of a multi-process run (sharding.spmd); those
        ckpt = checkpoints()   # without --out (all but process 0) resume as it says
        resume = resume or bool(getattr(checkpoints, "resume", False))
    else:
        ckpt = (Checkpointer(os.path.join(tc.out, "checkpoints"), tc.keep_ckpts,
                             unverified=tc.unverified_resume)
                if tc.out and checkpoints else None)
    if ckpt:
        ckpt.clean_stale()  # saves a kill cut short; safe under the lock
    if resume:
        # the newest intact checkpoint
        state, meta = ckpt.restore(state, loader=loader) if loader else ckpt.restore(state)
        # compare as JSON sees them (tuples were saved as lists)
        check_resumable(meta.get("config", {}), json.loads(json.dumps(cfg.to_dict())),
                        json.loads(json.dumps(Config().to_dict())))
        # this segment replays the steps after the checkpoint: their old records must go
        if tc.out:  # (the other processes of a multi-process run write no records)
            drop_records_after(os.path.join(tc.out, "metrics.jsonl"), int(state.step))
        return ckpt, state, Progress(meta.get("progress"))
    return ckpt, state, Progress()


def committed_steps(directory: str) -> list[int]:
    """The steps of the committed checkpoints in `directory` (orbax names each by its step;
    an unfinished save carries a suffix), read from the file system alone: no checkpoint
    manager, so one process of a multi-process run can ask without the others."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def claim_out(out: str, resume: bool = False) -> None:
    """The ``--out`` policy, the same for every process layout: take ``out/.lock`` (`lock_out`);
    a fresh run (not `resume`) refuses a directory that holds a run's checkpoints or the
    summary.json of a finished one, since it would
    overwrite that run's records beside them.

    Raises:
      ValueError: the lock is held by another process, or the directory holds a run.
    """
    lock_out(out)
    if resume:
        return
    ckpts = os.path.join(os.path.abspath(out), "checkpoints")
    steps = committed_steps(ckpts)
    if steps:
        raise ValueError(f"{ckpts} already holds checkpoints of a run (latest step {steps[-1]}); "
                         "pass --resume to continue it, or use another --out (or delete that "
                         "directory)")
    summary = os.path.join(os.path.abspath(out), "summary.json")
    if os.path.exists(summary):
        raise ValueError(f"{summary} is the summary of a finished run; use another --out (or "
                         "delete that directory)")


_LOCKS: dict[str, Any] = {}  # run directory -> its open lock file, held until the process ends


def lock_out(out: str) -> None:
    """Take ``out/.lock`` (an exclusive flock) for this process, or refuse: two runs writing one
    ``--out`` corrupt each other's checkpoints and metrics. The lock is released when the
    process ends (also on kill -9); runs one after another in one process reuse it.

    Raises:
      ValueError: another process holds the lock.
    """
    import fcntl

    path = os.path.abspath(out)
    if path in _LOCKS:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"Not a directory: --out {path} is a file; give a directory")
    os.makedirs(path, exist_ok=True)
    f = open_run_file(os.path.join(path, ".lock"), "a+")  # held for the process's life
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        who = f.read().strip() or "another process"
        f.close()
        raise ValueError(f"{path} is in use by another run ({who}); wait for it to finish, or "
                         "use another --out") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    _LOCKS[path] = f


def non_finite_leaves(state: Any) -> list[str]:
    """The paths of the floating leaves of `state` that hold a NaN or an infinity."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:  # across processes:
            if (jnp.issubdtype(leaf.dtype, jnp.floating)  # checked where its blocks are
                    and not bool(jax.jit(lambda a: jnp.isfinite(a).all())(leaf))):
                bad.append(jax.tree_util.keystr(path))
            continue
        x = np.asarray(leaf)
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            bad.append(jax.tree_util.keystr(path))
    return bad


def save(ckpt: Checkpointer, cfg: Config, state: TrainState, progress: Progress,
         wall_now: float, extra: Any = None, *, parts: Sequence = (), checked: bool = False,
         **meta: Any) -> None:
    """Checkpoint `state` at its step with the config and the run's progress (and `extra`,
    the algorithm's own arrays; `parts`, tables other processes write: `Checkpointer.save`).
    `checked`: the caller ran `refuse_non_finite` on them already.

    Raises:
      DivergedError: a leaf of the state (parameters, optimizer slots, tables) is NaN or
        infinite: nothing non-finite is checkpointed (the loss can stay finite while an
        optimizer slot overflows).
    """
    if not checked:
        refuse_non_finite(ckpt, state, extra)
    ckpt.save(int(state.step), state, {"config": cfg.to_dict(),
                                       "progress": progress.as_dict(wall_now), **meta},
              extra, **({"parts": parts} if parts else {}))


def refuse_non_finite(ckpt: Checkpointer, state: TrainState, extra: Any = None) -> None:
    """`DivergedError` if a leaf of `state` (or `extra`) is NaN or infinite (`save`'s check,
    for a caller that must know before it writes anything else of the run's end)."""
    step = int(state.step)
    if bad := non_finite_leaves(state) + (non_finite_leaves(extra) if extra is not None else []):
        last = ckpt.latest_step()
        raise DivergedError(
            f"the train state at step {step} holds NaN or infinite values in "
            f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}; the run stops without "
            "saving it. "
            + (f"The last good checkpoint is step {last} in {ckpt.directory}. " if last is not None
               else "No checkpoint was written before it. ")
            + "Lower the learning rates (--dense.lr, --sparse.lr) or add --dense.clip_norm")


def restore_extra(ckpt: Checkpointer | None, step: int, like: Any, who: str) -> Any:
    """An algorithm's own arrays saved with the checkpoint at `step` (`Checkpointer.save`'s
    ``extra``), structured like `like`; None for a fresh start (no checkpoint, step 0) or a
    checkpoint without them, or with others (another topology: said on stderr, and `who`
    starts its own state from the train state)."""
    if ckpt is None or not step:
        return None
    try:
        return ckpt.restore_extra(step, like)
    except ValueError as e:
        print(f"note: {e}; {who} starts its own state from the train state", file=sys.stderr,
              flush=True)
        return None


def evaluate(cfg: Config, data: RunData, predict, params, tables) -> tuple[dict, np.ndarray | None]:
    """Eval metrics over the whole eval set in input order, and (labels, probs) if asked.

    ``logit_spread`` is the largest eval logit minus the smallest: 0 when every prediction is
    the same (a model collapsed to a constant, e.g. every ReLU of its last hidden layer dead
    after divergent updates; its AUC is 0.5 and its NE ~1), NaN with no eval example.

    On a synthetic teacher's eval split (every row, in order) the metrics also hold
    ``kl_to_bayes``: the mean over the eval rows of KL(p*(x) || p(x)), the model's expected log
    loss above the Bayes-optimal predictor's, scored against the teacher's true probabilities
    instead of the sampled labels, so two models compared on the same rows differ by it without
    the labels' noise (issue 35's paired studies).
    """
    exact = data.eval_rows <= 20_000_000
    rm = metrics.RunningMetrics(keep_predictions=exact)
    preds = [] if cfg.train.save_predictions else None
    teacher = (isinstance(data.eval, SyntheticSource) and cfg.synthetic.teacher
               and data.keep_eval is None)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    lo, hi = np.inf, -np.inf  # the eval logits' range: equal ends are a constant predictor
    stream = batches(data.eval, cfg.train.eval_batch_size, seed=cfg.train.seed, epoch=0,
                     shuffle_buffer=0, drop_remainder=False, keep=data.keep_eval)
    for batch, n in stream:
        logits = np.asarray(predict(params, tables, batch))[:n]
        rm.update(batch.label[:n], logits)
        if n:
            lo, hi = min(lo, float(logits.min())), max(hi, float(logits.max()))
        if preds is not None:
            preds.append(np.stack([batch.label[:n], sigmoid(logits)], 1))
        if teacher:
            seen.append((np.asarray(batch.label[:n]), logits))
    out = {**rm.result(), "logit_spread": hi - lo if hi >= lo else float("nan")}
    if teacher:
        out.update(_against_teacher(data.eval, seen))
    return out, (np.concatenate(preds) if preds is not None else None)


def _against_teacher(source: SyntheticSource, seen: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """``kl_to_bayes`` (see `evaluate`) of the logits `seen` on `source`'s rows.

    KL(p* || q) with q = sigmoid(z), from the logits (log q = -softplus(-z), log(1 - q) =
    -softplus(z)): ``p* softplus(-z) + (1 - p*) softplus(z) - H(p*)``, in float64.

    Raises:
      AssertionError: the eval stream's labels are not the split's in order (the two would
        be scored against different rows).
    """
    y, p = source.labels_and_bayes_probs()
    labels = np.concatenate([s[0] for s in seen]) if seen else np.zeros(0)
    z = np.concatenate([s[1] for s in seen]).astype(np.float64) if seen else np.zeros(0)
    assert labels.shape == y.shape and np.array_equal(labels, y), (
        "evaluate: the eval stream is not the teacher split's rows in order")
    p = p.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(np.where(p > 0, p * np.log(p), 0.0) + np.where(p < 1, (1 - p) * np.log1p(-p), 0.0))
    kl = p * np.logaddexp(0.0, -z) + (1 - p) * np.logaddexp(0.0, z) - h
    return {"kl_to_bayes": float(kl.mean()) if kl.size else float("nan")}


def write_predictions(path: str, preds: np.ndarray) -> None:
    """predictions.csv: `label,prob` rows in eval input order, written to a temp file then renamed."""
    tmp = path + ".tmp"
    with open_run_file(tmp, "w") as f:
        f.write("label,prob\n")
        np.savetxt(f, preds, fmt=["%d", "%.7g"], delimiter=",")
    os.replace(tmp, path)


def build_summary(cfg: Config, data: RunData, state: TrainState, progress: Progress,
                  ev: dict, *, start_step: int, wall_seconds: float, train_seconds: float,
                  timed_steps: int, clock: str = "wall", last_loss: float | None = None,
                  extra: dict | None = None) -> dict:
    """summary.json: the fields every algorithm reports, then the algorithm's own `extra`.

    Args:
      state: the final state in the single-device layout.
      progress: the whole run's Train-NE sums (earlier segments included).
      ev: `evaluate`'s metrics of the final model.
      start_step: the step this segment started at (0, or the resumed checkpoint's).
      wall_seconds: wall time of the whole run (earlier segments included).
      train_seconds, timed_steps: the steps the throughput is measured over and their time.
      clock: "wall", or "virtual" when train_seconds are the virtual clock's (host-async
        ``--deterministic`` runs): examples_per_sec is then a modelled rate.
      last_loss: the last step's loss.
      extra: the algorithm's counters (sync gap, staleness, bytes, ...).
    """
    tc = cfg.train
    step = int(state.step)
    steps_per_epoch = max(data.train_rows // tc.batch_size, 1)
    warnings = []
    cut = {(src.name, src.stats.unterminated) for src in (data.train, data.eval)
           if getattr(src.stats, "unterminated", None)}
    for name, line in sorted(cut):
        warnings.append(f"the data file {name} does not end with a newline: its last line "
                        f"({line}) was read as is, and if the file was cut short that line may "
                        "be incomplete")
    if not np.isfinite(ev["auc"]):
        warnings.append(f"eval AUC/NE are undefined: the eval set ({ev['examples']} examples) "
                        f"has a single class (CTR {ev['ctr']}); use a larger eval set: "
                        "--eval-data FILE, or a larger --data.holdout (e.g. 0.3)")
    if ev.get("logit_spread") == 0 and ev["examples"] > 1:
        warnings.append(
            f"every one of the {ev['examples']} eval predictions is the same: the model "
            "collapsed to a constant predictor (e.g. every unit of its last "
            "hidden layer dead after divergent updates), so its AUC is 0.5 and it ranks nothing; "
            "see eval_logit_spread")
    summary = {
        "algorithm": tc.algo, "model": cfg.model.name, "dataset": cfg.data.train,
        "eval_dataset": data.eval_desc,
        "examples": step * tc.batch_size, "steps": step, "epochs": step / steps_per_epoch,
        "batch_size": tc.batch_size, "wall_seconds": wall_seconds, "clock": clock,
        "train_seconds": train_seconds,
        "examples_per_sec": timed_steps * tc.batch_size / train_seconds if train_seconds > 0 else None,
        "train_ne": ne_from_sums(progress.totals) if progress.totals["count"] else None,
        "train_examples_scored": progress.totals["count"],
        "train_loss_last": last_loss,
        "eval_auc": ev["auc"], "eval_auc_error_bound": ev["auc_error_bound"],
        "eval_logloss": ev["logloss"], "eval_ne": ev["ne"], "eval_calibration": ev["calibration"],
        "eval_examples": ev["examples"], "eval_ctr": ev["ctr"],
        "eval_logit_spread": ev.get("logit_spread"),
        "train_examples_per_epoch": data.train_rows,
        "data_stats": {"train": data.train.stats.as_dict(), "eval": data.eval.stats.as_dict()},
        "data_rows_read": rows_read(data),  # examples read (recjax.data.seek): resume seeks
        **count_params(state),
        "resumed_from_step": start_step if tc.resume else None,
        "deterministic": tc.deterministic,
        "warnings": warnings,
        "hardware": {"platform": jax.default_backend(), "devices": jax.device_count(),
                     "device_kind": jax.devices()[0].device_kind, "cpu": platform.processor(),
                     "cores": os.cpu_count(), "jax": jax.__version__},
        **(extra or {}),
        "config": cfg.to_dict(),
    }
    for w in warnings:
        print(f"warning: {w}")
    if isinstance(data.eval, SyntheticSource) and cfg.synthetic.teacher:
        bayes = data.eval.bayes_optimal()
        summary.update(bayes_eval_ne=bayes["ne"], bayes_eval_auc=bayes["auc"],
                       eval_ne_gap_to_bayes=ev["ne"] - bayes["ne"])
        if "kl_to_bayes" in ev:  # the expected NE gap: KL / H(ctr), as NE = log loss / H(ctr)
            ctr = ev["ctr"]
            h = -(ctr * np.log(ctr) + (1 - ctr) * np.log1p(-ctr))
            summary.update(eval_kl_to_bayes=ev["kl_to_bayes"],
                           eval_excess_ne=ev["kl_to_bayes"] / h)
    return summary


def write_summary(cfg: Config, summary: dict, preds: np.ndarray | None) -> None:
    """summary.json (atomically) and predictions.csv under ``--out``; nothing without one."""
    if not cfg.train.out:
        return
    write_json_atomic(os.path.join(cfg.train.out, "summary.json"), summary)
    if preds is not None:
        write_predictions(os.path.join(cfg.train.out, "predictions.csv"), preds)
