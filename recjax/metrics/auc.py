"""ROC AUC: exact (sort-based, ties = 1/2) and bucketed for streaming evaluation.

Both compute the Mann-Whitney statistic over groups of tied scores. With the scores sorted
increasingly and grouped into ``g = 1..G`` (a group = one distinct score, or one histogram
bucket), where ``pos_g`` / ``neg_g`` are the positive / negative mass in group ``g``::

    AUC = sum_g pos_g * (neg_{<g} + 1/2 neg_g) / (P * N),   P = sum_g pos_g, N = sum_g neg_g

i.e. each (positive, negative) pair scores 1 when the positive ranks higher and 1/2 on a tie.
This equals ``(R_+ - P (P + 1) / 2) / (P N)`` with ``R_+`` the sum of the positives' average
ranks (Mann & Whitney 1947; Hanley & McNeil 1982).

References:
  H. B. Mann, D. R. Whitney. On a test of whether one of two random variables is
  stochastically larger than the other. Ann. Math. Statist. 18(1), 1947.
  J. A. Hanley, B. J. McNeil. The meaning and use of the area under a receiver operating
  characteristic (ROC) curve. Radiology 143(1), 1982.
  T. Fawcett. An introduction to ROC analysis. Pattern Recognition Letters 27(8), 2006.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def check_labels_and_values(
    labels: ArrayLike, values: ArrayLike, where: str, values_name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Flatten labels and per-example values to float64 and check them, with a readable error.

    Args:
      labels: [n] (or any shape with n elements) click labels, each 0 or 1.
      values: [n] scores, probabilities or logits, one per label; no NaN.
      where: the caller's name, put at the front of any error message.
      values_name: what ``values`` are called in the caller's signature (``probs``, ``logits``).

    Returns:
      ``(labels, values)`` as f64[n].

    Raises:
      ValueError: the sizes differ, a label is not 0 or 1, or a value is NaN.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if y.shape != v.shape:
        raise ValueError(
            f"{where}: labels and {values_name} must have one element per example; got labels "
            f"of shape {np.shape(labels)} and {values_name} of shape {np.shape(values)}."
        )
    bad = np.flatnonzero((y != 0) & (y != 1))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{where}: labels must be 0 or 1; labels[{i}] = {float(y[i])} ({bad.size} such). "
            "Binarise the labels before computing metrics."
        )
    nan = np.flatnonzero(np.isnan(v))
    if nan.size:
        raise ValueError(
            f"{where}: {values_name}[{int(nan[0])}] is NaN ({nan.size} NaN in all); the model "
            "has probably diverged (lower the learning rate or check the inputs)."
        )
    return y, v


def _check_weights(weights: ArrayLike | None, n: int, where: str) -> np.ndarray:
    if weights is None:
        return np.ones(n)
    w = np.asarray(weights, dtype=np.float64).ravel()
    if w.shape != (n,):
        raise ValueError(f"{where}: weights must have one element per example ({n}); "
                         f"got shape {np.shape(weights)}.")
    if not np.all(w >= 0):  # also catches NaN
        raise ValueError(f"{where}: weights must be finite and >= 0; got min {float(np.nanmin(w))} "
                         f"and {int(np.isnan(w).sum())} NaN.")
    return w


def auc_from_groups(pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    """AUC from positive / negative mass per group of tied scores, groups in increasing order.

    Args:
      pos: f64[G] positive mass (count or weight) per group.
      neg: f64[G] negative mass per group.

    Returns:
      ``(auc, tie_fraction)``: the AUC with tied pairs counted 1/2, and the fraction of
      (positive, negative) pairs that share a group, ``sum_g pos_g neg_g / (P N)``. Both are
      NaN when ``P`` or ``N`` is 0 (AUC is undefined with a single class).
    """
    total_pos, total_neg = float(pos.sum()), float(neg.sum())
    if total_pos <= 0 or total_neg <= 0:
        return float("nan"), float("nan")
    neg_below = np.cumsum(neg) - neg  # neg_{<g}: negative mass in strictly lower groups
    pairs = total_pos * total_neg
    value = float(np.dot(pos, neg_below + 0.5 * neg) / pairs)
    return min(max(value, 0.0), 1.0), float(np.dot(pos, neg) / pairs)  # clamp float rounding


def auc(labels: ArrayLike, probs: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Exact ROC AUC with ties counted 1/2, in O(n log n).

    Only the order of ``probs`` matters, so any monotone score (probabilities or logits) gives
    the same value; prefer logits when the model saturates, since distinct logits can round to
    the same probability and become ties.

    Args:
      labels: [n] click labels, 0 or 1.
      probs: [n] scores, higher meaning more likely positive; no NaN.
      weights: optional [n] non-negative example weights; a pair (i, j) counts ``w_i w_j``.

    Returns:
      The probability that a random positive scores above a random negative (ties 1/2),
      weighted by ``weights``. NaN when there is no positive or no negative mass, including an
      empty input: AUC is undefined for one class, and NaN makes an aggregate built on it fail
      visibly rather than read as chance (0.5).

    Raises:
      ValueError: sizes differ, a label is not 0/1, a score is NaN, or a weight is negative.

    References:
      Mann & Whitney 1947; Hanley & McNeil 1982 (see the module docstring).
    """
    y, s = check_labels_and_values(labels, probs, "auc", "probs")
    w = _check_weights(weights, y.size, "auc")
    if y.size == 0:
        return float("nan")
    order = np.argsort(s)  # tie order is irrelevant: ties are grouped below
    s_sorted = s[order]
    # One group per distinct score; `!=` treats -0.0 and 0.0 as one score, as sorting does.
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    w_sorted = w[order]
    pos = np.add.reduceat(w_sorted * y[order], starts)
    neg = np.add.reduceat(w_sorted, starts) - pos
    return auc_from_groups(pos, neg)[0]


class BucketedAUC:
    """Streaming AUC from a histogram of predicted probabilities, with an exact error bound.

    ``update`` adds each example's mass to bucket ``k = min(floor(p K), K - 1)`` of ``K`` equal
    buckets over [0, 1], separately for positives (``pos_k``) and negatives (``neg_k``);
    memory is O(K) however many examples stream through. ``result`` is the AUC of the bucket
    indices: pairs in different buckets are ordered exactly (``floor(p K)`` is monotone in
    ``p``, also in floating point), pairs in the same bucket count 1/2. Each same-bucket pair
    contributes some value in [0, 1] to the exact AUC and 1/2 here, so::

        |AUC_exact - AUC_bucketed| <= 1/2 * sum_k pos_k neg_k / (P N)

    The bound is attained when every same-bucket pair is ordered the same way (all positives
    above, or all below, the negatives of their bucket), so it cannot be improved from the
    histogram alone. It shrinks as mass spreads over more buckets; CTR predictions crowd near 0,
    so uniform buckets need a large ``K`` (10^4 buckets cost 160 KB) for a tight bound there.

    Not thread-safe: give each thread its own instance and ``merge`` them.

    Attributes:
      num_buckets: K, the number of equal-width buckets over [0, 1].
      pos: f64[K] positive mass per bucket.
      neg: f64[K] negative mass per bucket.

    References:
      T. Fawcett, Pattern Recognition Letters 27(8), 2006 (ROC from thresholded counts);
      the thresholded AUC of ``tf.keras.metrics.AUC`` and torchrec's ``AUC`` are the same idea.
    """

    def __init__(self, num_buckets: int = 10_000):
        if int(num_buckets) != num_buckets or num_buckets < 1:
            raise ValueError(f"BucketedAUC: num_buckets must be an integer >= 1; got "
                             f"{num_buckets!r}.")
        self.num_buckets = int(num_buckets)
        self.pos = np.zeros(self.num_buckets)
        self.neg = np.zeros(self.num_buckets)

    def update(
        self, labels: ArrayLike, probs: ArrayLike, weights: ArrayLike | None = None
    ) -> None:
        """Add a batch of examples to the histogram.

        Args:
          labels: [n] click labels, 0 or 1.
          probs: [n] predicted probabilities in [0, 1] (not logits).
          weights: optional [n] non-negative example weights.

        Raises:
          ValueError: bad labels, NaN, or a probability outside [0, 1] (usually logits).
        """
        y, p = check_labels_and_values(labels, probs, "BucketedAUC.update", "probs")
        w = _check_weights(weights, y.size, "BucketedAUC.update")
        if y.size and (p.min() < 0 or p.max() > 1):
            raise ValueError(
                f"BucketedAUC.update: probs must lie in [0, 1]; got range [{float(p.min())}, "
                f"{float(p.max())}]. Were logits passed? Apply a sigmoid first."
            )
        k = np.minimum((p * self.num_buckets).astype(np.int64), self.num_buckets - 1)
        self.pos += np.bincount(k, weights=w * y, minlength=self.num_buckets)
        self.neg += np.bincount(k, weights=w * (1.0 - y), minlength=self.num_buckets)

    def merge(self, other: BucketedAUC) -> None:
        """Add another accumulator's histogram (e.g. another worker's) into this one."""
        if other.num_buckets != self.num_buckets:
            raise ValueError(f"BucketedAUC.merge: bucket counts differ ({self.num_buckets} vs "
                             f"{other.num_buckets}); build both with the same num_buckets.")
        self.pos += other.pos
        self.neg += other.neg

    def reset(self) -> None:
        """Forget every example seen so far."""
        self.pos[:] = 0.0
        self.neg[:] = 0.0

    def result(self) -> tuple[float, float]:
        """The bucketed AUC and its worst-case error against the exact AUC of the same examples.

        Returns:
          ``(auc, error_bound)`` with ``|exact - auc| <= error_bound``; both NaN while only
          one class has been seen.
        """
        auc_value, tie_fraction = auc_from_groups(self.pos, self.neg)
        return auc_value, 0.5 * tie_fraction
