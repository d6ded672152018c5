"""algorithms/runtime/stragglers.py: the SPEC's documented behaviour, pinned term by term.

The module docstring is the specification: ``lognormal`` draws i.i.d. ``exp(sigma N(0, 1))``
(median 1), ``slow`` makes the same k workers ``factor`` x slower at every iteration, ``shift``
draws a fresh k workers in each window of ``period`` iterations, terms multiply, and a factor is
a pure function of ``(seed, worker, iteration)``. Each check below is written from that text
(counts, sets and moments computed in plain numpy over the factors), never from the module's
own draws; each docstring names the mutants it kills (the equivalent survivors:
docs/testing.md).
"""

import numpy as np
import pytest

from algorithms.runtime import stragglers


def _grid(m: stragglers.StragglerModel, workers: int, iters: int) -> np.ndarray:
    return np.array([[m.factor(w, i) for i in range(iters)] for w in range(workers)])


def _slow_sets(f: np.ndarray, factor: float) -> list[frozenset]:
    """Per iteration, the workers whose factor is `factor` (all others must be exactly 1)."""
    assert np.all((f == 1.0) | (f == factor)), "a factor is neither 1 nor the slow factor"
    return [frozenset(np.flatnonzero(f[:, i] == factor).tolist()) for i in range(f.shape[1])]


@pytest.mark.parametrize("spec,sigma", [("lognormal", 0.5), ("lognormal:sigma=0.2", 0.2),
                                        ("lognormal:sigma=1.5", 1.5)])
def test_lognormal_has_median_one_and_log_spread_sigma(spec, sigma):
    """log factor ~ N(0, sigma^2), i.i.d. over workers and iterations (default sigma 0.5): over
    8 x 500 draws the mean of the logs is 0 and their std sigma within 5 standard errors, and
    no two workers see the same sequence. Kills a changed default, ``sigma *`` -> ``/``, a
    dropped exp, and seeds that ignore the worker or the iteration."""
    f = _grid(stragglers.parse(spec, 8, seed=3), 8, 500)
    logs = np.log(f)
    n = logs.size
    assert abs(logs.mean()) < 5 * sigma / np.sqrt(n)
    assert abs(logs.std() - sigma) < 5 * sigma / np.sqrt(2 * n)
    assert len({tuple(r) for r in f}) == 8  # worker enters the draw
    assert len(set(f[0])) == 500  # iteration enters the draw


@pytest.mark.parametrize("k,want", [(0, 0), (1, 1), (3, 3), (5, 5), (9, 5), (-2, 0)])
def test_slow_picks_k_workers_for_the_whole_run(k, want):
    """``slow:k,factor``: exactly min(max(k, 0), N) workers, the same at every iteration, are
    `factor` x slower; everyone else runs at 1. Over 20 seeds (N = 5), so a draw with
    replacement (fewer distinct workers) or a clamp off by one shows."""
    for seed in range(20):
        f = _grid(stragglers.parse(f"slow:k={k},factor=2.5", 5, seed), 5, 30)
        sets = _slow_sets(f, 2.5)
        assert len(set(sets)) == 1 and len(sets[0]) == want


def test_slow_defaults_are_one_worker_four_times_slower():
    """``slow`` alone is ``k=1, factor=4`` (the docstring's defaults)."""
    f = _grid(stragglers.parse("slow", 4, seed=0), 4, 10)
    sets = _slow_sets(f, 4.0)
    assert len(set(sets)) == 1 and len(sets[0]) == 1


@pytest.mark.parametrize("period", [1, 3, 7])
def test_shift_draws_k_workers_per_window_of_period(period):
    """``shift:k=2,period=P``: exactly 2 of 6 workers are slow in every iteration, the set is
    constant inside each window [jP, (j+1)P) and changes across windows at least once (a fresh
    draw per window). Kills windows of the wrong length (``//`` -> ``*`` or ``%``, the ``max(P,
    1)`` floor changed) and a draw that ignores the window."""
    iters = 40 * period
    f = _grid(stragglers.parse(f"shift:k=2,factor=3,period={period}", 6, seed=1), 6, iters)
    sets = _slow_sets(f, 3.0)
    assert all(len(s) == 2 for s in sets)
    windows = [sets[j * period:(j + 1) * period] for j in range(40)]
    assert all(len(set(w)) == 1 for w in windows)
    assert len({w[0] for w in windows}) > 1


def test_shift_defaults_and_period_zero():
    """``shift`` alone is ``k=1, factor=4, period=100``; ``period=0`` means windows of one
    iteration (the floor of 1), not a division by zero."""
    sets = _slow_sets(_grid(stragglers.parse("shift", 4, seed=2), 4, 300), 4.0)
    assert all(len(s) == 1 for s in sets)
    assert [len(set(sets[j * 100:(j + 1) * 100])) for j in range(3)] == [1, 1, 1]
    assert len(set(sets)) > 1
    zero = _slow_sets(_grid(stragglers.parse("shift:period=0", 4, seed=2), 4, 60), 4.0)
    assert all(len(s) == 1 for s in zero)
    assert any(zero[i] != zero[i + 1] for i in range(0, 58, 2))  # changes inside a pair


@pytest.mark.parametrize("spec,base,factor", [
    ("lognormal:sigma=0.3+slow:k=1,factor=4", "lognormal:sigma=0.3", 4.0),
    ("slow:k=1,factor=4+lognormal:sigma=0.3", "none+lognormal:sigma=0.3", 4.0),
    ("lognormal:sigma=0.3+shift:k=1,factor=3,period=5", "lognormal:sigma=0.3", 3.0),
])
def test_terms_multiply(spec, base, factor):
    """Terms multiply: each factor of `spec` is the lognormal term's factor (the same draw as in
    `base`, where the lognormal term has the same index) times `factor` for the one slow worker
    of that iteration, times 1 for the others. Both orders, so an assignment (``f *= x`` ->
    ``f = x``) or a division in either term shows."""
    both = _grid(stragglers.parse(spec, 5, seed=7), 5, 40)
    alone = _grid(stragglers.parse(base, 5, seed=7), 5, 40)
    assert np.all(alone != 1.0)  # the lognormal draws are really there
    ratio = both / alone
    slow = np.abs(ratio - factor) < 1e-9
    assert np.all(slow | (np.abs(ratio - 1.0) < 1e-12))
    assert np.all(slow.sum(axis=0) == 1)  # one slow worker per iteration


@pytest.mark.parametrize("spec,active", [("none", False), ("", False), (None, False),
                                         ("none+none", False), ("none+slow", True),
                                         ("lognormal", True), ("shift:k=1", True)])
def test_active_unless_every_term_is_none(spec, active):
    """`active` (the runtime sleeps/multiplies only then) is False for none, the empty SPEC and
    None; every factor of an inactive model is exactly 1."""
    m = stragglers.parse(spec, 3, seed=0)
    assert m.active is active
    if not active:
        assert np.all(_grid(m, 3, 5) == 1.0)


def test_spec_spacing_and_empty_parameters():
    """Spaces around terms and parameters, and empty ``,`` items, are ignored:
    `` slow:k=2, factor=3 , + lognormal:sigma=0.1`` equals the tight SPEC."""
    loose = stragglers.parse(" slow:k=2, factor=3 ,,+ lognormal:sigma=0.1", 4, seed=5)
    tight = stragglers.parse("slow:k=2,factor=3+lognormal:sigma=0.1", 4, seed=5)
    assert loose == tight
    assert dict(loose.terms[0].params) == {"k": 2.0, "factor": 3.0}
    assert loose.terms[1] == stragglers.Term("lognormal", (("sigma", 0.1),))


@pytest.mark.parametrize("bad,match", [
    ("gamma", "unknown model 'gamma'"), ("slow:sigma=1", "slow takes k, factor, not 'sigma'"),
    ("none:k=1", "none takes no parameters, not 'k'"), ("shift:period=ten", "period='ten' is not"),
])
def test_bad_specs_say_what_is_wrong(bad, match):
    """Each refusal names the term and what to write instead."""
    with pytest.raises(ValueError, match=match):
        stragglers.parse(bad, 2, seed=0)


def test_the_slow_workers_are_drawn_per_seed_and_per_worker_count():
    """``slow`` chooses its k workers from the seed, among the run's workers: over 10 seeds
    at 32 workers (k = 3) the slow sets are not all one set and each holds 3 workers; an
    8-worker model asked after a 32-worker one of the same seed still slows 3 of its own 8.
    Kills a seed or a worker count left out of the draw or out of its cache (the draw is made
    once per window, not once per call)."""
    sets = [_slow_sets(_grid(stragglers.parse("slow:k=3,factor=8", 32, seed=s), 32, 2), 8.0)
            for s in range(10)]
    assert all(len(s[0]) == 3 and s[0] == s[1] for s in sets)
    assert len({s[0] for s in sets}) > 1
    for seed in range(5):
        _grid(stragglers.parse("slow:k=3,factor=8", 32, seed=seed), 32, 1)
        small = _slow_sets(_grid(stragglers.parse("slow:k=3,factor=8", 8, seed=seed), 8, 1), 8.0)
        assert len(small[0]) == 3


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1, 2**32, 5 * 2**40])
def test_lognormal_draws_are_numpys_seeded_generators(seed):
    """The lognormal term's draw for ``(seed, term, worker, iteration)`` is
    ``default_rng([seed, 17, term, worker, iteration]).standard_normal()`` (the draws every run
    so far made; a rerun repeats them), though they are made a block of iterations at a time
    from states computed in numpy: compared with default_rng itself, across block boundaries,
    at iterations near 2^32 and for seeds past one 32-bit word (drawn one by one). Kills a
    wrong SeedSequence constant, a word order or LCG step of PCG64's seeding, an off-by-one
    in a block's iterations and a block cached under the wrong worker or term."""
    its = [0, 1, 2, stragglers.BLOCK - 1, stragglers.BLOCK, 3 * stragglers.BLOCK + 5, 2**31,
           2**32 - stragglers.BLOCK - 1, 2**32 - 1]
    for term in (0, 3):
        for worker in (0, 1, 31):
            for it in its:
                want = float(np.random.default_rng([seed, 17, term, worker, it]).standard_normal())
                assert stragglers.normal(seed, term, worker, it) == want, (term, worker, it)
    m = stragglers.parse("slow:k=1,factor=2+lognormal:sigma=0.3", 4, seed=seed)
    got = m.factor(2, 77) / (2.0 if 2 in stragglers._choice(seed, 0, 0, 4, 1) else 1.0)
    assert got == float(np.exp(0.3 * np.random.default_rng([seed, 17, 1, 2, 77])
                               .standard_normal()))
