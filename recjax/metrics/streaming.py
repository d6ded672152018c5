"""Metrics accumulated over a stream of batches: train NE (ShadowSync) and evaluation.

Train NE, as ShadowSync reports it, scores each batch with the model *before* training on it:
the trainer passes the logits of the forward pass that precedes the update, so every example is
"unseen" when it is scored and no separate eval pass is needed::

    metrics = RunningMetrics()
    for batch in batches:
        logits, state = train_step(state, batch)    # logits from the pre-update forward pass
        metrics.update(batch.label, logits)
        if step % log_every == 0:
            log(metrics.result_and_reset())         # NE over the last interval

References:
  Q. Zheng et al. ShadowSync. arXiv 2003.03477, Sec. 5 and Eq. 2 (train NE).
  X. He et al. Practical lessons from predicting clicks on ads at Facebook. ADKDD 2014.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from recjax.metrics.auc import BucketedAUC, auc, check_labels_and_values
from recjax.metrics.logloss import binary_entropy, sigmoid, softplus


class RunningMetrics:
    """Log loss, NE, AUC, calibration and CTR over batches, in O(num_buckets) memory.

    Per batch it adds to running sums (all f64, so the order of batches changes results only
    by rounding)::

        loss_sum  += sum_i softplus(z_i) - y_i z_i      # -log p(y_i | z_i), exact for any z
        count     += n        label_sum += sum_i y_i    prob_sum += sum_i sigmoid(z_i)

    and feeds ``sigmoid(z)`` to a `BucketedAUC`. With ``keep_predictions=True`` it also keeps
    labels and logits (16 bytes per example) and reports the exact AUC instead; the logits,
    not the probabilities, are ranked, because distinct large logits round to the same
    probability and would turn into spurious ties.

    Per-interval metrics come from `result_and_reset`, not from a sliding window: an interval
    of batches is what ShadowSync plots, and a window would need a histogram per batch.

    A host-side object, not a pytree: call ``update`` outside jit with device arrays (they are
    copied to the host). Not thread-safe: give each worker thread its own and ``merge`` them.

    Attributes:
      keep_predictions: whether the exact AUC is computed from stored predictions.
      bucketed_auc: the histogram behind the streaming AUC.
    """

    def __init__(self, num_buckets: int = 10_000, keep_predictions: bool = False):
        """Build an empty accumulator.

        Args:
          num_buckets: buckets of the streaming AUC histogram (see `BucketedAUC`).
          keep_predictions: also keep every (label, logit) for the exact AUC.
        """
        self.keep_predictions = keep_predictions
        self.bucketed_auc = BucketedAUC(num_buckets)
        self.reset()

    def reset(self) -> None:
        """Forget every example seen so far."""
        self._loss_sum = 0.0
        self._count = 0
        self._label_sum = 0.0
        self._prob_sum = 0.0
        self.bucketed_auc.reset()
        self._labels: list[np.ndarray] = []
        self._logits: list[np.ndarray] = []

    def update(self, labels: ArrayLike, logits: ArrayLike, n_valid: int | None = None) -> None:
        """Add a batch of predictions.

        Args:
          labels: [B] click labels, 0 or 1.
          logits: [B] (or [B, 1]) predicted logits for the same examples.
          n_valid: count only the first ``n_valid`` rows; the rest are padding that fills the
            last batch of an eval pass to the fixed batch shape. None counts all B rows.

        Raises:
          ValueError: shapes differ, labels are not 0/1, a logit is NaN, or n_valid is out of
            [0, B].
        """
        y, z = check_labels_and_values(labels, logits, "RunningMetrics.update", "logits")
        if n_valid is not None:
            if not 0 <= n_valid <= y.size:
                raise ValueError(f"RunningMetrics.update: n_valid must be in [0, {y.size}] (the "
                                 f"batch size); got {n_valid}.")
            y, z = y[:n_valid], z[:n_valid]
        p = sigmoid(z)
        self._loss_sum += float(np.sum(softplus(z) - y * z))
        self._count += y.size
        self._label_sum += float(y.sum())
        self._prob_sum += float(p.sum())
        self.bucketed_auc.update(y, p)
        if self.keep_predictions:
            # Copies: a float64 input arrives here as a view of the caller's (reused) buffer.
            self._labels.append(y.copy())
            self._logits.append(z.copy())

    def merge(self, other: RunningMetrics) -> None:
        """Add another accumulator's examples (e.g. another worker thread's) into this one."""
        if other.keep_predictions != self.keep_predictions:
            raise ValueError("RunningMetrics.merge: both accumulators must have the same "
                             "keep_predictions setting.")
        self._loss_sum += other._loss_sum
        self._count += other._count
        self._label_sum += other._label_sum
        self._prob_sum += other._prob_sum
        self.bucketed_auc.merge(other.bucketed_auc)
        self._labels += other._labels
        self._logits += other._logits

    def result(self) -> dict[str, float | int]:
        """The metrics over every example since construction or the last reset.

        Returns:
          A dict with
          ``logloss``: mean log loss in nats;
          ``ne``: normalized entropy, ``logloss / H(ctr)`` (He et al. 2014; ShadowSync Eq. 2);
          ``auc``: exact with ``keep_predictions``, else bucketed;
          ``auc_error_bound``: ``|exact AUC - auc|`` is at most this; 0 when exact;
          ``calibration``: ``sum(p) / sum(y)``;
          ``examples``: examples counted (int);
          ``ctr``: mean label.
          Values that are undefined come out NaN: everything with no example, ``ne``/``auc``
          with a single class, ``calibration`` with no click.
        """
        n = self._count
        nan = float("nan")
        ctr = self._label_sum / n if n else nan
        logloss = self._loss_sum / n if n else nan
        h = binary_entropy(ctr) if n else 0.0
        if self.keep_predictions:
            labels = np.concatenate(self._labels) if self._labels else np.zeros(0)
            logits = np.concatenate(self._logits) if self._logits else np.zeros(0)
            auc_value = auc(labels, logits)
            bound = 0.0 if auc_value == auc_value else nan  # NaN stays NaN
        else:
            auc_value, bound = self.bucketed_auc.result()
        return {
            "logloss": logloss,
            "ne": logloss / h if h > 0 else nan,
            "auc": auc_value,
            "auc_error_bound": bound,
            "calibration": self._prob_sum / self._label_sum if self._label_sum > 0 else nan,
            "examples": n,
            "ctr": ctr,
        }

    def result_and_reset(self) -> dict[str, float | int]:
        """`result` over the interval since the last reset, then `reset` (per-interval train NE)."""
        out = self.result()
        self.reset()
        return out
