"""recjax.metrics: the cases mutation testing found unpinned (docs/testing.md).

Each test states the behaviour it pins and the expected values are written out by hand or in
plain numpy; the mutant each one kills is named in its docstring (``line: old -> new``).
"""

import re
import warnings

import numpy as np
import pytest

from recjax.metrics import (
    BucketedAUC,
    RunningMetrics,
    auc,
    binary_entropy,
    calibration,
    logloss,
    logloss_from_logits,
    normalized_entropy,
    normalized_entropy_from_logits,
)


def _bucketed_update(labels, values, weights=None):
    BucketedAUC(10).update(labels, values, weights)


def _running_update(labels, values):
    RunningMetrics(10).update(labels, values)


# (callable(labels, values), the name its errors start with, what its values are called)
CALLERS = [
    (auc, "auc", "probs"),
    (_bucketed_update, "BucketedAUC.update", "probs"),
    (logloss, "logloss", "probs"),
    (logloss_from_logits, "logloss_from_logits", "logits"),
    (normalized_entropy, "normalized_entropy", "probs"),
    (normalized_entropy_from_logits, "normalized_entropy_from_logits", "logits"),
    (calibration, "calibration", "probs"),
    (_running_update, "RunningMetrics.update", "logits"),
]


@pytest.mark.parametrize("fn,where,name", CALLERS, ids=[c[1] for c in CALLERS])
def test_errors_name_the_function_and_the_argument(fn, where, name):
    """A bad label or a NaN names the public function and its argument, e.g.
    ``normalized_entropy: probs[1] is NaN`` (kills ``"auc" -> "AUC"``/``None`` and
    ``"probs" -> "XXprobsXX"`` in every caller's check_labels_and_values call)."""
    w = re.escape(where)
    with pytest.raises(ValueError, match=rf"^{w}: labels must be 0 or 1; labels\[2\] = 3\.0"):
        fn([0.0, 1.0, 3.0], [0.2, 0.4, 0.6])
    with pytest.raises(ValueError, match=rf"^{w}: {name}\[1\] is NaN \(1 NaN in all\)"):
        fn([0.0, 1.0, 1.0], [0.2, np.nan, 0.6])


@pytest.mark.parametrize("fn,where", [(auc, "auc"), (_bucketed_update, "BucketedAUC.update")])
def test_weight_errors_name_the_function(fn, where):
    """Kills ``_check_weights(weights, y.size, "auc") -> None / "AUC"`` (auc.py:126, 190)."""
    with pytest.raises(ValueError, match=rf"^{re.escape(where)}: weights must be finite and >= 0"):
        fn([0.0, 1.0], [0.2, 0.4], [1.0, -0.5])


def test_weights_are_summed_in_float64():
    """Weights arriving as float16 are summed in float64, as the module promises ("compute in
    float64"). Kills ``np.asarray(weights, dtype=np.float64) -> np.asarray(weights)``
    (auc.py:70): float16 sums stop at 2048 (2048 + 1 rounds to 2048).

    3000 negatives score 0; 1000 negatives and 1000 positives tie at score 1. A positive beats
    3000 negatives and ties 1000: AUC = (3000 + 1000 / 2) / 4000 = 0.875.
    """
    y = np.r_[np.zeros(4000), np.ones(1000)]
    s = np.r_[np.zeros(3000), np.ones(2000)]
    w = np.ones(5000, np.float16)
    assert auc(y, s, w) == 0.875
    m = BucketedAUC(2)
    m.update(y, s * 0.9, w)  # buckets 0 and 1
    assert m.result() == (0.875, 0.5 * 1000 * 1000 / (1000 * 4000))


def test_float32_weights_of_mixed_magnitude_are_summed_in_float64():
    """float32 importance weights spanning 1 to 1e8 (a down-sampled class re-weighted) are summed
    in float64. Kills ``np.asarray(weights, dtype=np.float64) -> dtype=None`` and the dtype
    dropped (auc.py:70), which the float16 test above misses (numpy's pairwise float16 sums of
    ones stay exact): in float32, 1e8 + 7 x 1.0 in one tied group rounds to 1e8 + 8 (float32
    spacing at 1e8 is 8), so the group's negative mass becomes 8 instead of 7.

    One positive (weight 1e8) tied at score 0.5 with 7 negatives (weight 1), one negative
    (weight 1) below at 0.1: AUC = (1 + 7 / 2) / 8 = 0.5625 (the mutants: 0.5556).
    """
    y = np.r_[1.0, np.zeros(8)]
    s = np.r_[np.full(8, 0.5), 0.1]
    w = np.r_[1e8, np.ones(8)].astype(np.float32)
    assert auc(y, s, w) == 0.5625


def test_single_class_is_nan_without_a_warning():
    """One class: AUC and NE are NaN, returned without a numpy RuntimeWarning (no 0/0 is ever
    evaluated). Kills ``total_pos <= 0 or total_neg <= 0`` -> ``and`` / ``< 0`` (auc.py:93),
    which divide by P N = 0, and ``h = binary_entropy(y.mean()) if y.size`` -> ``if True``
    (logloss.py:114), which takes the mean of an empty array."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for y in (np.ones(4), np.zeros(4)):
            assert np.isnan(auc(y, np.arange(4.0)))
            m = BucketedAUC(4)
            m.update(y, np.arange(4.0) / 4)
            assert all(np.isnan(m.result()))
        assert np.isnan(auc([1.0, 1.0], [0.1, 0.2], [1.0, 1.0]))
        assert np.isnan(auc([0.0, 1.0], [0.1, 0.2], [1.0, 0.0]))  # the positive weighs 0
        assert np.isnan(normalized_entropy([], []))
        assert np.isnan(normalized_entropy_from_logits([], []))


def test_auc_with_one_negative_or_a_light_one():
    """A single negative, or negative mass below 1, is still two classes. Kills
    ``total_neg <= 0 -> total_neg <= 1`` (auc.py:93).

    Positives 0.9, 0.5, 0.05 against one negative at 0.1: two of three above, AUC = 2/3;
    weighted 0.25 the negative changes nothing (a single negative's weight cancels).
    """
    y, s = [1.0, 0.0, 1.0, 1.0], [0.9, 0.1, 0.5, 0.05]
    assert auc(y, s) == pytest.approx(2 / 3, abs=1e-15)
    assert auc(y, s, [1.0, 0.25, 1.0, 1.0]) == pytest.approx(2 / 3, abs=1e-15)


@pytest.mark.parametrize("seed", range(20))
def test_perfectly_separated_weighted_auc_stays_in_0_1(seed):
    """Every positive above every negative: AUC is 1 up to rounding and never above it, though
    the weighted sums round either way (cumsum and sum add in different orders: unclamped,
    seed 0 gives 1 + 2^-52, others a few ulps below 1). Kills the clamp ``min(..., 1.0) -> min(...,
    2.0)`` (auc.py:98). All positives below: exactly 0 (every term of the sum is 0)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 60))
    w = rng.random(2 * n) * rng.choice([1e-3, 1.0, 1e3], 2 * n)
    y = np.r_[np.zeros(n), np.ones(n)]
    value = auc(y, np.arange(2.0 * n), w)
    assert value <= 1.0 and value == pytest.approx(1.0, abs=1e-14)
    assert auc(y, -np.arange(2.0 * n), w) == 0.0


def test_bucket_count_defaults_and_checks():
    """The documented default of 10^4 buckets (kills ``10_000 -> 10001``, auc.py:168 and
    streaming.py:53) and ``keep_predictions=False``; a bucket count must be an integer >= 1
    (kills ``or -> and``, auc.py:169)."""
    assert BucketedAUC().num_buckets == 10_000 and BucketedAUC().pos.shape == (10_000,)
    m = RunningMetrics()
    assert m.bucketed_auc.num_buckets == 10_000 and m.keep_predictions is False
    for bad in (0, -3, 2.5, 0.5):
        with pytest.raises(ValueError, match="num_buckets must be an integer >= 1"):
            BucketedAUC(bad)
    assert BucketedAUC(3.0).num_buckets == 3


def test_bucketed_auc_refuses_any_probability_outside_0_1():
    """Either end out of [0, 1] is refused on its own (kills ``or -> and`` and ``> 1 -> > 2``,
    auc.py:191); 0 and 1 themselves are accepted; an empty batch is a no-op."""
    for p in ([0.5, 1.5], [-0.25, 0.5], [0.5, 1.0000001]):
        with pytest.raises(ValueError, match="probs must lie in"):
            BucketedAUC(4).update([0.0, 1.0], p)
    m = BucketedAUC(4)
    m.update([0.0, 1.0], [0.0, 1.0])
    m.update([], [])
    assert m.result() == (1.0, 0.0)


def test_binary_entropy_by_hand():
    """``0 log 0 = 0``: H(0) = H(1) = 0 (kills ``if q > 0 -> if q >= 0``, logloss.py:36, which
    gives 0 * log 0 = NaN). H(1/2) = log 2, H(1/10) = -(0.1 log 0.1 + 0.9 log 0.9)."""
    assert binary_entropy(0.0) == 0.0 and binary_entropy(1.0) == 0.0
    assert binary_entropy(0.5) == pytest.approx(np.log(2), rel=1e-15)
    assert binary_entropy(0.1) == pytest.approx(0.3250829733914482, rel=1e-14)


def test_logloss_clips_both_ends():
    """A certain miss costs -log(eps) at either end, with the default eps = 1e-7 (kills
    ``np.clip(p, eps, 1.0 - eps)`` -> ``None`` / ``1.0 + eps`` / ``2.0 - eps``, logloss.py:61).

    y = [0, 1], p = [1, 0]: both clipped, loss = -log(1e-7) = 16.118095650958317 each.
    """
    assert logloss([0.0], [1.0]) == pytest.approx(16.118095650958317, rel=1e-9)
    assert logloss([0.0, 1.0], [1.0, 0.0]) == pytest.approx(16.118095650958317, rel=1e-9)
    assert logloss([0.0], [1.0], eps=1e-3) == pytest.approx(-np.log(1e-3), rel=1e-12)


def test_normalized_entropy_passes_eps_on():
    """NE clips with the eps it is given (kills ``logloss(labels, probs, eps)`` -> without eps,
    logloss.py:104). y = [1, 0], p = [0, 1/2], eps = 0.01:
    loss = -(log 0.01 + log 0.5) / 2 = (log 100 + log 2) / 2, H(1/2) = log 2."""
    want = (np.log(100) + np.log(2)) / 2 / np.log(2)
    assert normalized_entropy([1.0, 0.0], [0.0, 0.5], eps=0.01) == pytest.approx(want, rel=1e-12)


def test_empty_inputs_are_nan():
    """Every metric of no example is NaN, without raising (kills ``float("nan")`` ->
    ``float("XXnanXX")`` / ``float(None)``, logloss.py:60, 81)."""
    for fn in (logloss, logloss_from_logits, normalized_entropy, calibration, auc):
        assert np.isnan(fn([], [])), fn.__name__


def test_running_metrics_keep_predictions_empty_and_one_class():
    """``keep_predictions=True`` with no example: every value NaN (kills the empty-list
    branches ``np.zeros(0) -> np.zeros(1)`` / ``np.zeros(None)`` and ``if self._labels -> if
    True``, streaming.py:138-139). One class: exact AUC NaN and so its error bound (kills
    ``0.0 if auc == auc`` -> ``if True``, streaming.py:141), CTR 1."""
    r = RunningMetrics(10, keep_predictions=True).result()
    assert r["examples"] == 0
    assert all(np.isnan(v) for k, v in r.items() if k != "examples"), r
    m = RunningMetrics(10, keep_predictions=True)
    m.update(np.ones(3), np.array([0.0, 1.0, 2.0]))
    r = m.result()
    assert np.isnan(r["auc"]) and np.isnan(r["auc_error_bound"]) and np.isnan(r["ne"])
    assert r["ctr"] == 1.0 and r["examples"] == 3


def test_running_metrics_calibration_with_one_click():
    """Calibration is defined from the first click (kills ``label_sum > 0 -> > 1``,
    streaming.py:149): logits 0 and log 3 are probabilities 1/2 and 3/4, one click, so
    calibration = (1/2 + 3/4) / 1 = 1.25."""
    m = RunningMetrics(10)
    m.update([0.0, 1.0], [0.0, np.log(3.0)])
    assert m.result()["calibration"] == pytest.approx(1.25, rel=1e-14)


def test_running_metrics_n_valid_bounds():
    """``n_valid`` may be anything in [0, B], both ends included (kills ``0 <= n_valid <= B``
    -> ``1 <=`` / ``0 <`` / ``< B``, streaming.py:89); -1 and B + 1 are refused."""
    y, z = np.array([1.0, 0.0, 1.0]), np.array([2.0, -1.0, 0.5])
    m = RunningMetrics(10)
    m.update(y, z, n_valid=0)
    assert m.result()["examples"] == 0
    m.update(y, z, n_valid=3)
    assert m.result()["examples"] == 3
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=r"n_valid must be in \[0, 3\]"):
            m.update(y, z, n_valid=bad)
