"""The study kit's paired statistics and verdict rule (recjax/study/stats.py) on hand-made
numbers, each verdict reached both ways."""

import math

import pytest

from recjax.study.stats import HELD, NOT_HELD, UNRESOLVED, paired, verdict

T975_3, T80_3 = 3.182446305, 0.978472312  # Student t quantiles, 3 degrees of freedom
T95_3 = 2.353363435  # 0.95 quantile: the 90% interval of the equivalence test


def test_interval_and_mde_by_hand():
    # d = -1, -2, -3, -4 (x 1e-3): mean -2.5e-3, sd sqrt(5/3) e-3, se sd / 2
    p = paired([-1e-3, -2e-3, -3e-3, -4e-3])
    se = math.sqrt(5 / 3) * 1e-3 / 2
    assert p.n == 4 and p.mean == pytest.approx(-2.5e-3)
    assert p.sd == pytest.approx(math.sqrt(5 / 3) * 1e-3)
    assert (p.lo, p.hi) == (pytest.approx(-2.5e-3 - T975_3 * se), pytest.approx(-2.5e-3 + T975_3 * se))
    assert p.mde == pytest.approx((T975_3 + T80_3) * se)


def test_one_seed_is_always_unresolved():
    p = paired([0.5])
    assert (p.lo, p.hi, p.mde) == (-math.inf, math.inf, math.inf) and math.isnan(p.sd)
    for kind, effect in (("less", -0.01), ("greater", 0.01), ("within", 0.001)):
        assert verdict(kind, effect, [0.5])[0] == UNRESOLVED


@pytest.mark.parametrize("diffs,want", [
    ([-0.004, -0.005, -0.003, -0.004], HELD),        # interval [-0.0053, -0.0027]: below 0
    ([0.0001, -0.0002, 0.0002, 0.0], NOT_HELD),      # [-0.0003, 0.0003] excludes -0.0034
    ([-0.004, 0.002, -0.006, 0.001], UNRESOLVED),    # [-0.0078, 0.0043]: 0 and -0.0034 inside
])
def test_a_less_claim(diffs, want):
    assert verdict("less", -0.0034, diffs)[0] == want
    # the mirror image: a greater claim on the negated differences
    assert verdict("greater", 0.0034, [-d for d in diffs])[0] == want


def test_a_resolved_effect_far_smaller_than_the_papers_did_not_hold():
    # the paper's sign but a tenth of its size, resolved: the interval excludes both 0 and the
    # paper's effect; the claim is the effect's size, so it did not hold
    v, p = verdict("less", -0.0034, [-0.0003, -0.0004, -0.0003, -0.0004])
    assert v == NOT_HELD and p.hi < 0 and p.lo > -0.0034
    # an interval that reaches the paper's effect and excludes 0: held
    v, p = verdict("less", -0.0034, [-0.001, -0.004, -0.0025, -0.0032])
    assert v == HELD and p.lo < -0.0034 < p.hi < 0


@pytest.mark.parametrize("diffs,want", [
    ([0.0002, 0.0001, 0.0003, 0.0002], HELD),        # 90% interval [0.00009, 0.00031] in +-0.001
    ([0.003, 0.0032, 0.0029, 0.0031], NOT_HELD),     # wholly above +0.001
    ([0.0005, -0.0009, 0.0012, -0.0002], UNRESOLVED),
])
def test_a_within_claim_is_an_equivalence_test(diffs, want):
    v, p = verdict("within", 0.001, diffs)
    assert v == want
    if want == HELD:  # the 90% interval, not the 95% one, decides equivalence
        se = p.sd / 2
        assert p.mean - T95_3 * se > -0.001 and p.mean + T95_3 * se < 0.001


def test_equivalence_uses_the_90_percent_interval():
    # inside +-0.001 at 90% but not at 95%: held (a 95% rule would call it unresolved)
    d = [0.0001, 0.0009, 0.000783, 0.000217]  # mean 0.0005, se ~0.0002
    p95 = paired(d)
    assert p95.hi > 0.001
    assert verdict("within", 0.001, d)[0] == HELD


def test_bad_claims_are_refused():
    with pytest.raises(ValueError, match="kind"):
        verdict("equal", 0.1, [0.0, 0.1])
    with pytest.raises(ValueError, match="effect < 0"):
        verdict("less", 0.1, [0.0, 0.1])
    with pytest.raises(ValueError, match="no differences"):
        paired([])
