"""Metrics against independent references: brute-force pairwise AUC, hand-computed losses."""

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
from recjax.metrics.logloss import sigmoid


def brute_force_auc(labels, scores, weights=None):
    """O(n^2) over every (positive, negative) pair: 1 if the positive is higher, 1/2 if tied."""
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype=np.float64)
    pos, neg = labels == 1, labels == 0
    sp, sn = scores[pos][:, None], scores[neg][None, :]
    score = (sp > sn) + 0.5 * (sp == sn)
    pair_w = w[pos][:, None] * w[neg][None, :]
    return float(np.sum(pair_w * score) / np.sum(pair_w))


def tied_data(seed, n=300, levels=10):
    """Labels correlated with scores, and scores on a coarse grid so ties are everywhere."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, levels, n) / levels
    labels = (rng.random(n) < 0.2 + 0.6 * scores).astype(np.float32)
    return labels, scores, rng


# ---- exact AUC ----


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_brute_force_with_ties(seed):
    labels, scores, rng = tied_data(seed)
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores), abs=1e-12)
    weights = rng.exponential(size=labels.size)
    weights[rng.random(labels.size) < 0.1] = 0.0
    assert auc(labels, scores, weights) == pytest.approx(
        brute_force_auc(labels, scores, weights), abs=1e-12)


def test_auc_limits():
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.1, 0.2, 0.7, 0.9, 0.3, 0.8])
    assert auc(y, s) == 1.0
    assert auc(y, -s) == 0.0
    assert auc(y, np.full(6, 0.3)) == 0.5
    assert np.isnan(auc(np.ones(4), np.arange(4.0)))  # one class: undefined
    assert np.isnan(auc([], []))
    # Only the order matters: logits and probabilities give one AUC.
    z = np.random.default_rng(0).normal(size=6)
    assert auc(y, z) == auc(y, sigmoid(z))
    # Integer weights = repeated examples.
    w = np.array([1, 2, 1, 3, 1, 2])
    assert auc(y, z, w) == pytest.approx(auc(np.repeat(y, w), np.repeat(z, w)), abs=1e-12)


def test_auc_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"labels\[1\] = 2.0"):
        auc([0, 2, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="one element per example"):
        auc([0, 1, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match=r"probs\[2\] is NaN"):
        auc([0, 1, 1], [0.1, 0.2, np.nan])
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        auc([0, 1], [0.1, 0.2], [1.0, -1.0])


# ---- log loss, NE, calibration ----


def test_hand_computed_four_examples():
    # labels y = [1, 0, 0, 0], probs p = [1/2, 1/2, 1/4, 1/4]:
    #   logloss = -(log 1/2 + log 1/2 + log 3/4 + log 3/4) / 4 = (log 2 + log 4/3) / 2
    #           = log(8/3) / 2                                         = 0.4904146...
    #   p_bar = 1/4;  H(1/4) = -(1/4 log 1/4 + 3/4 log 3/4) = log 4 - 3/4 log 3 = 0.5623351...
    #   NE = logloss / H(1/4)                                          = 0.8721...
    #   calibration = mean(p) / mean(y) = (3/8) / (1/4)                = 3/2
    #   AUC: the positive (1/2) ties one negative (1/2) and beats two (1/4): (1/2 + 1 + 1) / 3
    y = np.array([1.0, 0.0, 0.0, 0.0])
    p = np.array([0.5, 0.5, 0.25, 0.25])
    expected_loss = np.log(8 / 3) / 2
    expected_h = np.log(4) - 0.75 * np.log(3)
    assert binary_entropy(0.25) == pytest.approx(expected_h, rel=1e-14)
    assert logloss(y, p) == pytest.approx(expected_loss, rel=1e-14)
    assert logloss_from_logits(y, np.log(p / (1 - p))) == pytest.approx(expected_loss, rel=1e-14)
    assert normalized_entropy(y, p) == pytest.approx(expected_loss / expected_h, rel=1e-14)
    assert calibration(y, p) == pytest.approx(1.5, rel=1e-14)
    assert auc(y, p) == pytest.approx(5 / 6, rel=1e-14)


@pytest.mark.parametrize("ctr", [0.03, 0.25, 0.5])
def test_ne_of_base_rate_predictor_is_one(ctr):
    y = np.zeros(200)
    y[: int(ctr * 200)] = 1.0
    p = np.full(200, y.mean())
    assert normalized_entropy(y, p) == pytest.approx(1.0, rel=1e-12)
    logit = np.log(y.mean() / (1 - y.mean()))
    assert normalized_entropy_from_logits(y, np.full(200, logit)) == pytest.approx(1.0, rel=1e-12)
    assert calibration(y, p) == pytest.approx(1.0, rel=1e-12)


def test_ne_undefined_for_one_class():
    assert np.isnan(normalized_entropy(np.zeros(3), np.full(3, 0.1)))
    assert np.isnan(calibration(np.zeros(3), np.full(3, 0.1)))


def test_logloss_from_logits_agrees_and_stays_finite():
    rng = np.random.default_rng(1)
    z = rng.normal(scale=3.0, size=500)
    y = (rng.random(500) < sigmoid(z)).astype(np.float64)
    assert logloss_from_logits(y, z) == pytest.approx(logloss(y, sigmoid(z)), rel=1e-12)
    # Saturated logits: exact, where probabilities would need clipping.
    assert logloss_from_logits([1.0, 0.0], [1000.0, -1000.0]) == 0.0
    assert logloss_from_logits([0.0], [1000.0]) == pytest.approx(1000.0, rel=1e-15)
    # Clipping: a certain miss costs -log(eps), not infinity.
    assert logloss([1.0], [0.0], eps=1e-7) == pytest.approx(-np.log(1e-7), rel=1e-12)


# ---- bucketed AUC ----


def bucketed(labels, probs, num_buckets, weights=None):
    m = BucketedAUC(num_buckets)
    m.update(labels, probs, weights)
    return m.result()


@pytest.mark.parametrize("seed", range(3))
def test_bucketed_auc_within_its_bound(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    z = rng.normal(-1.5, 1.5, n)
    p = sigmoid(z)
    y = (rng.random(n) < sigmoid(1.5 * z)).astype(np.float64)
    exact = auc(y, p)
    bounds = []
    for k in [1, 10, 100, 1000, 100_000]:
        value, bound = bucketed(y, p, k)
        assert abs(exact - value) <= bound + 1e-12, k
        bounds.append(bound)
    assert bounds[0] == 0.5  # one bucket: every pair is a tie, the AUC reads 0.5
    assert all(a >= b for a, b in zip(bounds, bounds[1:]))  # finer buckets never loosen it
    assert bounds[-1] < 1e-3  # many buckets: the bound, hence the error, is small


def test_bucketed_auc_bound_is_attained():
    # Inside every bucket the positives score above the negatives, so each of the
    # sum_k pos_k neg_k same-bucket pairs is worth 1 exactly and 1/2 bucketed: equality.
    rng = np.random.default_rng(3)
    k = 10
    bucket = rng.integers(0, k, 400)
    y = rng.integers(0, 2, 400).astype(np.float64)
    p = (bucket + 0.25 + 0.5 * y) / k
    value, bound = bucketed(y, p, k)
    assert bound > 0.01
    assert auc(y, p) - value == pytest.approx(bound, abs=1e-12)


def test_bucketed_auc_equals_exact_in_distinct_buckets():
    rng = np.random.default_rng(4)
    k, n = 1000, 300
    p = (rng.permutation(k)[:n] + 0.5) / k  # one example per bucket
    y = rng.integers(0, 2, n)
    value, bound = bucketed(y, p, k)
    assert bound == 0.0
    assert value == pytest.approx(auc(y, p), abs=1e-12)


def test_bucketed_auc_is_brute_force_on_bucket_indices():
    # An independent statement of the bucketing: rank by floor(p K), clamped so p = 1 lands
    # in the last bucket; weighted.
    labels, _, rng = tied_data(5, n=400)
    p = rng.random(400)
    p[:5] = [0.0, 1.0, 1.0, 0.5, 0.05]
    w = rng.exponential(size=400)
    k = 20
    idx = np.minimum(np.floor(p * k), k - 1)
    assert bucketed(labels, p, k, w)[0] == pytest.approx(
        brute_force_auc(labels, idx, w), abs=1e-12)


def test_bucketed_auc_streams_and_merges():
    labels, _, rng = tied_data(6, n=900)
    p = rng.random(900)
    whole = bucketed(labels, p, 50)
    streamed, a, b = BucketedAUC(50), BucketedAUC(50), BucketedAUC(50)
    for lo in range(0, 900, 128):
        streamed.update(labels[lo:lo + 128], p[lo:lo + 128])
    a.update(labels[:400], p[:400])
    b.update(labels[400:], p[400:])
    a.merge(b)
    assert streamed.result() == pytest.approx(whole, abs=1e-12)
    assert a.result() == pytest.approx(whole, abs=1e-12)


def test_bucketed_auc_rejects_logits():
    with pytest.raises(ValueError, match="Were logits passed"):
        BucketedAUC(10).update([0, 1], [-2.0, 3.0])


# ---- running metrics ----


def model_outputs(seed, n):
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.0, 2.0, n).astype(np.float32)
    y = (rng.random(n) < sigmoid(z.astype(np.float64) + 0.3)).astype(np.float32)
    return y, z


@pytest.mark.parametrize("keep_predictions", [False, True])
def test_running_metrics_over_batches_equal_one_shot(keep_predictions):
    y, z = model_outputs(7, 1000)
    m = RunningMetrics(num_buckets=1000, keep_predictions=keep_predictions)
    for lo in range(0, 1000, 96):  # uneven last batch
        m.update(y[lo:lo + 96], z[lo:lo + 96])
    r = m.result()
    p = sigmoid(z.astype(np.float64))
    assert r["examples"] == 1000
    assert r["ctr"] == pytest.approx(y.mean(), rel=1e-12)
    assert r["logloss"] == pytest.approx(logloss_from_logits(y, z), rel=1e-12)
    assert r["ne"] == pytest.approx(normalized_entropy_from_logits(y, z), rel=1e-12)
    assert r["ne"] == pytest.approx(normalized_entropy(y, p), rel=1e-9)
    assert r["calibration"] == pytest.approx(calibration(y, p), rel=1e-12)
    if keep_predictions:
        assert r["auc"] == pytest.approx(auc(y, z), abs=1e-12)
        assert r["auc_error_bound"] == 0.0
    else:
        assert r["auc"] == pytest.approx(bucketed(y, p, 1000)[0], abs=1e-12)
        assert 0 < r["auc_error_bound"] < 0.01
        assert abs(r["auc"] - auc(y, z)) <= r["auc_error_bound"]


@pytest.mark.parametrize("keep_predictions", [False, True])
def test_running_metrics_n_valid_ignores_padding(keep_predictions):
    y, z = model_outputs(8, 64)
    padded_y = np.concatenate([y, np.ones(36, np.float32)])  # padding that would change CTR
    padded_z = np.concatenate([z, np.full(36, 50.0, np.float32)])
    masked, plain = (RunningMetrics(100, keep_predictions) for _ in range(2))
    masked.update(padded_y, padded_z, n_valid=64)
    plain.update(y, z)
    assert masked.result() == plain.result()
    with pytest.raises(ValueError, match="n_valid must be in"):
        masked.update(y, z, n_valid=65)


def test_running_metrics_result_and_reset_gives_intervals():
    y, z = model_outputs(9, 600)
    m, first, second = RunningMetrics(100), RunningMetrics(100), RunningMetrics(100)
    m.update(y[:300], z[:300])
    first.update(y[:300], z[:300])
    assert m.result_and_reset() == first.result()
    m.update(y[300:], z[300:])
    second.update(y[300:], z[300:])
    assert m.result() == second.result()


def test_running_metrics_merge_and_empty():
    y, z = model_outputs(10, 500)
    whole, a, b = (RunningMetrics(100, keep_predictions=True) for _ in range(3))
    whole.update(y, z)
    a.update(y[:200], z[:200])
    b.update(y[200:], z[200:])
    a.merge(b)
    assert a.result() == pytest.approx(whole.result(), rel=1e-12)
    empty = RunningMetrics(100).result()
    assert empty["examples"] == 0
    assert all(np.isnan(v) for k, v in empty.items() if k != "examples")


def test_running_metrics_keeps_copies_of_reused_buffers():
    y, z = model_outputs(11, 100)
    buf_y, buf_z = y.astype(np.float64), z.astype(np.float64)
    m = RunningMetrics(100, keep_predictions=True)
    m.update(buf_y, buf_z)
    expected = m.result()
    buf_y[:], buf_z[:] = 0.0, 0.0  # the loader refills its buffer for the next batch
    assert m.result() == expected
