"""GBA's one aggregation function (`algorithms.gba.aggregation`, `admits`) on hand-made
buffers, each expected value written from the paper's rule (Sec. 4.1, Eq. 1, App. B Alg. 2,
Sec. 5.1), not from the code: when each mode updates, what it keeps and what it divides by."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.gba import MODES, admits, aggregation
from algorithms.gba_rows import tree_sum as _tree_sum


@dataclasses.dataclass
class G:  # the fields of a Grad the rule reads
    index: int
    token: int
    version: int


def gc(iota=1, dense_mean="all", embedding_staleness="id"):
    return types.SimpleNamespace(iota=iota, dense_mean=dense_mean,
                                 embedding_staleness=embedding_staleness)


# k = 5; tokens 3, 4, 5 (k - t = 2, 1, 0); pushed out of data-list order
BUF = [G(index=11, token=4, version=4), G(index=10, token=3, version=2),
       G(index=12, token=5, version=5)]


def test_gba_keeps_by_eq1_and_divides_by_M_in_data_list_order():
    u = aggregation(MODES["gba"], gc(iota=1), 5, BUF, 3)
    assert [e.index for e in u.entries] == [10, 11, 12]  # summed in data-list order
    assert u.keep == (False, True, True)  # k - t = 2 > iota = 1: dropped (Eq. 1)
    assert u.denominator == 3  # l. 22: the kept sum over M, the dropped one counted
    assert u.per_id  # l. 21: rows judged by their id's tag
    assert aggregation(MODES["gba"], gc(iota=1, dense_mean="kept"), 5, BUF, 3).denominator == 2
    assert not aggregation(MODES["gba"], gc(embedding_staleness="token"), 5, BUF, 3).per_id
    assert aggregation(MODES["gba"], gc(iota=2), 5, BUF, 3).keep == (True, True, True)


def test_a_buffer_short_of_its_size_waits_and_the_end_takes_what_is_left():
    assert aggregation(MODES["gba"], gc(), 5, BUF, 4) is None
    assert aggregation(MODES["gba"], gc(), 5, [], 0) is None  # nothing left: no update
    assert len(aggregation(MODES["gba"], gc(), 5, BUF, 0).entries) == 3


@pytest.mark.parametrize("mode", ["sync", "async", "hop_bs", "bsp"])
def test_the_baselines_keep_everything_and_divide_by_what_they_aggregate(mode):
    u = aggregation(MODES[mode], gc(iota=0), 5, BUF, 3)
    assert u.keep == (True, True, True) and u.denominator == 3 and not u.per_id


def test_hop_bw_counts_only_the_gradients_of_the_current_round():
    rule = MODES["hop_bw"]
    assert not admits(rule, 4, 5) and admits(rule, 5, 5)  # a backup's gradient of round 4
    assert all(admits(MODES[m], 4, 5) for m in ("gba", "sync", "async", "hop_bs", "bsp"))
    at_k = [G(index=20, token=6, version=5), G(index=21, token=6, version=5)]
    assert aggregation(rule, gc(), 5, at_k + [G(index=19, token=6, version=4)], 3) is None
    u = aggregation(rule, gc(), 5, at_k, 2)
    assert [e.index for e in u.entries] == [20, 21] and u.denominator == 2


def test_the_dense_sum_adds_in_buffer_order_leaf_by_leaf():
    """The update's dense sum (Alg. 2 l. 22, before the division by M) is
    ``((g0 + g1) + g2) + ...`` in float32, leaf by leaf, in the buffer's order: bit for bit the
    fold of ``np.add`` over the trees, for numpy and jax leaves and a 0-d one, and the
    gradients it sums are left as they were. Kills a sum in another order (a pairwise or
    reversed sum rounds differently on these values) and an accumulation into a gradient."""
    rng = np.random.default_rng(0)
    trees = [{"w": (rng.standard_normal((5, 3)) * 10.0 ** rng.integers(-4, 4, (5, 3)))
              .astype(np.float32), "b": np.float32(rng.standard_normal()),
              "v": jnp.asarray(rng.standard_normal(7).astype(np.float32) * 1e3)}
             for _ in range(33)]
    copies = jax.tree.map(np.array, trees)
    want = trees[0]
    for t in trees[1:]:
        want = jax.tree.map(np.add, want, t)
    got = _tree_sum(trees)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        assert np.asarray(a).dtype == np.asarray(b).dtype == np.float32
        assert np.array_equal(np.asarray(a), np.asarray(b))
    backwards = trees[-1]
    for t in trees[-2::-1]:
        backwards = jax.tree.map(np.add, backwards, t)
    assert not np.array_equal(backwards["w"], got["w"])  # the order is seen
    for a, b in zip(jax.tree.leaves(copies), jax.tree.leaves(trees)):
        assert np.array_equal(a, np.asarray(b))
    assert _tree_sum(trees[:1]) is trees[0]
