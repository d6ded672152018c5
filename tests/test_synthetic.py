"""The synthetic generator: determinism, the id law, the teacher, the Bayes-optimal predictor."""

import dataclasses
import json

import numpy as np
import pytest

from recjax.data.synthetic import PRESETS, SyntheticConfig, SyntheticSource, bayes_probs, preset
from recjax.metrics import normalized_entropy

SMALL = SyntheticConfig(name="t", n_dense=3, cardinalities=(5, 40, 300), n_train=70_000,
                        n_eval=20_000, noise=0.0)


def _all(src):
    cs = list(src.chunks())
    return (np.concatenate([c.dense for c in cs]), np.concatenate([c.ids for c in cs]),
            np.concatenate([c.label for c in cs]), np.concatenate([c.row for c in cs]))


def test_streams_are_deterministic_and_splits_differ():
    a, b = _all(SyntheticSource(SMALL)), _all(SyntheticSource(SMALL))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    ev = _all(SyntheticSource(SMALL, "eval"))
    assert not np.array_equal(a[1][: len(ev[1])], ev[1])
    np.testing.assert_array_equal(a[3], np.arange(SMALL.n_train))
    assert a[1].shape == (SMALL.n_train, 3, 1) and a[1].dtype == np.int32
    assert (a[1][:, :, 0] < np.asarray(SMALL.cardinalities)).all() and (a[1] >= 0).all()
    assert np.isfinite(a[0]).all() and set(np.unique(a[2])) <= {0.0, 1.0}


def test_ids_follow_the_zipf_law():
    """Frequencies sorted by rank match p_r proportional to (r+1)^-s (chi-square-ish bound)."""
    cfg = dataclasses.replace(SMALL, cardinalities=(50,), zipf=1.2, n_train=200_000)
    ids = _all(SyntheticSource(cfg))[1][:, 0, 0]
    counts = np.sort(np.bincount(ids, minlength=50))[::-1]
    p = np.arange(1, 51, dtype=float) ** -1.2
    expected = p / p.sum() * len(ids)
    np.testing.assert_allclose(counts[:10], expected[:10], rtol=0.05)


@pytest.mark.parametrize("card", [1, 2, 3, 17, 1000, 300_001])
@pytest.mark.parametrize("s", [0.5, 1.05, 2.0])
def test_zipf_guide_table_equals_binary_search(card, s):
    """The guide-table inverse CDF returns exactly searchsorted's ranks, at the CDF's own
    values (ties), just below them, at 0 and near 1."""
    from recjax.data.synthetic import _ZipfSampler

    z = _ZipfSampler(card, s, field=0, seed=0)
    rng = np.random.default_rng(card)
    cdf = z.cdf[:-1] if card > 1 else z.cdf[:0]
    u = np.concatenate([rng.random(50_000), [0.0, 1.0 - 2.0 ** -53], cdf[:2000],
                        np.nextafter(cdf[:2000], 0.0), cdf[-2000:], np.nextafter(cdf[-2000:], 0.0)])
    want = np.minimum(np.searchsorted(z.cdf, u, side="right"), card - 1)
    np.testing.assert_array_equal(z.ranks(u), want)


def test_bayes_probs_with_noise_match_monte_carlo():
    z = np.array([-3.0, -0.5, 0.0, 1.2, 4.0])
    rng = np.random.default_rng(0)
    eps = rng.normal(0, 1.3, (400_000, 1))
    mc = (1 / (1 + np.exp(-(z[None, :] + eps)))).mean(0)
    np.testing.assert_allclose(bayes_probs(z, 1.3), mc, atol=2e-3)
    np.testing.assert_allclose(bayes_probs(z, 0.0), 1 / (1 + np.exp(-z)))


def test_bayes_predictor_beats_perturbed_predictors():
    """p* is the best predictor: the teacher's probabilities, perturbed, lose NE on average."""
    cfg = dataclasses.replace(SMALL, noise=0.7)
    src = SyntheticSource(cfg, "eval")
    best = src.bayes_optimal()
    assert 0.5 < best["ne"] < 1.0 and best["auc"] > 0.6
    y, p = src.labels_and_bayes_probs()
    logit = np.log(p / (1 - p))
    assert normalized_entropy(y, p) == pytest.approx(best["ne"])
    for scale, shift in [(1.2, 0.0), (0.8, 0.0), (1.0, 0.2)]:
        assert normalized_entropy(y, 1 / (1 + np.exp(-(scale * logit + shift)))) > best["ne"]


def test_presets_and_unknown_name():
    assert preset("default") == PRESETS["default"]
    assert len(PRESETS["criteo"].cardinalities) == 26 and not PRESETS["criteo"].teacher
    with pytest.raises(ValueError, match="presets"):
        preset("nope")


def test_default_run_reaches_bayes_ne(tmp_path):
    """Issue acceptance: `python scripts/train.py` ends within 0.02 NE of the Bayes optimum."""
    from algorithms.train_main import main

    assert main(["--out", str(tmp_path), "--no-progress"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["model"] == "dlrm" and s["dataset"] == "synthetic:default"
    assert s["eval_ne_gap_to_bayes"] <= 0.02, (s["eval_ne"], s["bayes_eval_ne"])
