"""Log loss, normalized entropy (NE) and calibration of click predictions.

All in nats, computed in float64 on the host. NE divides the log loss by the entropy of the
background CTR, so it reads the same across data sets of different click rates: 1 is the
constant predictor that always outputs the base rate, lower is better.

References:
  X. He et al. Practical lessons from predicting clicks on ads at Facebook. ADKDD 2014,
  Sec. 2 (normalized entropy, calibration).
  Q. Zheng et al. ShadowSync: performing synchronization in the background for highly scalable
  distributed training. arXiv 2003.03477, Eq. 2 (NE, used as train and eval metric).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from recjax.metrics.auc import check_labels_and_values


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-z))`` without overflow: exp is only taken of ``-|z|``."""
    e = np.exp(-np.abs(logits))
    return np.where(logits >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def softplus(logits: np.ndarray) -> np.ndarray:
    """``log(1 + exp(z)) = max(z, 0) + log1p(exp(-|z|))``, finite for every finite z."""
    return np.maximum(logits, 0.0) + np.log1p(np.exp(-np.abs(logits)))


def binary_entropy(p: float) -> float:
    """``H(p) = -(p log p + (1 - p) log(1 - p))`` in nats, with ``0 log 0 = 0``."""
    p = float(p)
    return float(-sum(q * np.log(q) for q in (p, 1.0 - p) if q > 0))


def logloss(labels: ArrayLike, probs: ArrayLike, eps: float = 1e-7) -> float:
    """Mean binary cross entropy of predicted probabilities.

    ``-1/n sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)]`` with ``p`` clipped to
    ``[eps, 1 - eps]``, so a confidently wrong prediction costs ``-log(eps)`` (16.1 nats for the
    default) instead of infinity. Prefer `logloss_from_logits` when logits are at hand: it
    needs no clipping.

    Args:
      labels: [n] click labels, 0 or 1.
      probs: [n] predicted click probabilities.
      eps: clipping margin, in (0, 0.5).

    Returns:
      The mean log loss in nats; NaN for an empty input.

    References:
      He et al. 2014, Sec. 2.
    """
    y, p = check_labels_and_values(labels, probs, "logloss", "probs")
    if y.size == 0:
        return float("nan")
    p = np.clip(p, eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def logloss_from_logits(labels: ArrayLike, logits: ArrayLike) -> float:
    """Mean binary cross entropy from logits, exact and finite without clipping.

    With ``p = sigmoid(z)``: ``-log p = softplus(-z)`` and ``-log(1 - p) = softplus(z)``, so the
    per-example loss is ``softplus(z) - y z`` (the form ``optax.sigmoid_binary_cross_entropy``
    uses), which never takes ``log(0)``.

    Args:
      labels: [n] click labels, 0 or 1.
      logits: [n] predicted logits ``z = log(p / (1 - p))``.

    Returns:
      The mean log loss in nats; NaN for an empty input.
    """
    y, z = check_labels_and_values(labels, logits, "logloss_from_logits", "logits")
    if y.size == 0:
        return float("nan")
    return float(np.mean(softplus(z) - y * z))


def normalized_entropy(labels: ArrayLike, probs: ArrayLike, eps: float = 1e-7) -> float:
    """Normalized entropy: log loss divided by the entropy of the mean label.

    ``NE = logloss / H(p_bar)`` with ``p_bar = mean(labels)`` (the background CTR) and ``H`` the
    binary entropy (`binary_entropy`).

    Args:
      labels: [n] click labels, 0 or 1.
      probs: [n] predicted click probabilities, clipped as in `logloss`.
      eps: clipping margin passed to `logloss`.

    Returns:
      NE; 1 for the constant predictor ``p_i = p_bar``. NaN when every label is equal (or the
      input is empty): then ``H(p_bar) = 0`` and NE is undefined.

    References:
      He et al. 2014, Sec. 2; Zheng et al. (ShadowSync) 2020, Eq. 2.
    """
    y, _ = check_labels_and_values(labels, probs, "normalized_entropy", "probs")
    return _ne(logloss(labels, probs, eps), y)


def normalized_entropy_from_logits(labels: ArrayLike, logits: ArrayLike) -> float:
    """`normalized_entropy` from logits, with the loss of `logloss_from_logits` (no clipping)."""
    y, _ = check_labels_and_values(labels, logits, "normalized_entropy_from_logits", "logits")
    return _ne(logloss_from_logits(labels, logits), y)


def _ne(loss: float, y: np.ndarray) -> float:
    h = binary_entropy(y.mean()) if y.size else 0.0
    return loss / h if h > 0 else float("nan")


def calibration(labels: ArrayLike, probs: ArrayLike) -> float:
    """Ratio of the mean predicted CTR to the observed CTR, ``mean(probs) / mean(labels)``.

    Args:
      labels: [n] click labels, 0 or 1.
      probs: [n] predicted click probabilities.

    Returns:
      The ratio; 1 is calibrated on average, above 1 over-predicts clicks. NaN when there is no
      click (or the input is empty).

    References:
      He et al. 2014, Sec. 2.
    """
    y, p = check_labels_and_values(labels, probs, "calibration", "probs")
    return float(p.sum() / y.sum()) if y.sum() > 0 else float("nan")
