"""Early stopping on an eval metric and the best checkpoint (FuxiCTR's ``monitor`` and
``early_stop_patience``; issue 15).

The shared trainer (recjax/train/loop.py) evaluates every ``train.eval_every`` steps and hands
each result to `EarlyStopper.update`:

    improved  = best is None or sign * (value - best) > 0     sign = +1 AUC, -1 NE / logloss
    bad       = 0 if improved else bad + 1
    stop      = patience > 0 and bad >= patience

so with patience p the run stops at the p-th eval in a row that did not beat the best (a NaN
metric, e.g. AUC of a one-class hold-out, never does). The state of every improving eval is
written to ``out/best/`` by its own `Checkpointer` keeping one step (orbax's atomic commit, the
same checksums), and summary.json reports ``best_step`` and ``best_metric``. The end-of-run
eval counts as one more eval. A checkpoint carries the tracker's state (`state`: best value,
its step, the evals since), so a resumed run compares with the best so far and out/best/ keeps
the earlier best until a better one replaces it; ``train.monitor`` cannot change on
``--resume``. Should ``train.keep_best`` be switched on at a resume while out/best/ holds no
checkpoint yet, the tracking starts afresh there, so that out/best/ holds the best eval it saw.
"""

from __future__ import annotations

import math
import os

from recjax.checkpoint import Checkpointer
from recjax.train.features import MONITORS


class EarlyStopper:
    """Tracks ``train.monitor`` over a run's evals; see the module docstring.

    Attributes:
      monitor: the summary name of the metric (eval_auc | eval_ne | eval_logloss).
      patience: evals without improvement that stop the run (0 = never).
      best: the best value so far (None before the first eval).
      best_step: the step of that eval.
      bad: evals since the best one.
      stopped_at: the step early stopping ended the run at, or None.
      ckpt: the `Checkpointer` of out/best (None without --out or checkpoints).
    """

    def __init__(self, monitor: str, patience: int, best_dir: str | None = None):
        self.monitor, self.patience = monitor, patience
        self.key, self.sign = MONITORS[monitor]
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad = 0
        self.stopped_at: int | None = None
        self.ckpt = Checkpointer(best_dir, max_to_keep=1) if best_dir else None

    @classmethod
    def from_config(cls, cfg, checkpoints: bool = True,
                    saved: dict | None = None) -> EarlyStopper | None:
        """None unless ``train.early_stop_patience`` or ``train.keep_best`` is set.

        Args:
          saved: `state` from the checkpoint a run resumes from (None: a fresh tracker).
        """
        tc = cfg.train
        if not (tc.early_stop_patience or tc.keep_best):
            return None
        best_dir = os.path.join(tc.out, "best") if tc.out and checkpoints else None
        stopper = cls(tc.monitor, tc.early_stop_patience, best_dir)
        if saved and not (stopper.ckpt is not None and stopper.ckpt.latest_step() is None):
            if saved["monitor"] != tc.monitor:  # check_resumable refuses this first
                raise ValueError(f"train.monitor {tc.monitor!r} differs from the checkpoint's "
                                 f"{saved['monitor']!r}")
            stopper.best, stopper.best_step, stopper.bad = (saved["best"], saved["best_step"],
                                                            saved["bad"])
        return stopper

    def state(self) -> dict:
        """What a checkpoint carries (`recjax.train.contract.Progress.early_stop`)."""
        return {"monitor": self.monitor, "best": self.best, "best_step": self.best_step,
                "bad": self.bad}

    def update(self, step: int, ev: dict) -> bool:
        """Record the eval ``ev`` (`contract.evaluate`'s dict) made at ``step``; True when it is
        the best so far (the caller then saves the state with `save_best`)."""
        value = float(ev[self.key])
        improved = math.isfinite(value) and (self.best is None
                                             or self.sign * (value - self.best) > 0)
        if improved:
            self.best, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad >= self.patience

    def save_best(self, save) -> None:
        """``save(checkpointer)`` writes the current state into out/best (if there is one)."""
        if self.ckpt is not None:
            save(self.ckpt)

    def summary(self) -> dict:
        """summary.json fields."""
        return {"monitor": self.monitor, "best_step": self.best_step, "best_metric": self.best,
                "early_stopped": self.stopped_at is not None,
                "early_stop_patience": self.patience,
                "best_checkpoint": self.ckpt.directory if self.ckpt else None}

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
