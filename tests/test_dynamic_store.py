"""`LruStore` (recjax/embeddings/dynamic.py) against references that share none of its code.

* `RefLru`: a plain-Python LRU (an OrderedDict, least recent first) at batch granularity: a
  pull first marks its hits, evicts the oldest rows it did not touch, admits its new ids in
  order, then moves every row it touched to the recent end in pull order. SGD in float32.
  Hypothesis drives both with random pulls, pushes and snapshot/restores over a small id
  universe (so rows get evicted and re-admitted), random capacities and admit probabilities.
* With room for every id, the store equals one fixed numpy table initialised with
  `init_rows` and updated by the same sparse optimizer (sgd, adagrad, adam, ...).

`RefLru` shares one function with the store, `admission_draws`, checked on its own for its rate
and determinism; the store's hash map (`IdIndex`) is also checked against a dict.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recjax.checkpoint import Checkpointer
from recjax.embeddings import SparseOptimConfig, init_rows, make_sparse_optimizer
from recjax.embeddings.dynamic import IdIndex, LruStore, admission_draws

DIM = 4
LR = 0.1
SGD = make_sparse_optimizer(SparseOptimConfig("sgd", lr=LR))
ADAGRAD = make_sparse_optimizer(SparseOptimConfig("adagrad", lr=LR, initial_accumulator=0.1))
# raw 64-bit ids, extremes included (-1 is filler, never an id)
UNIVERSE = np.array([0, 1, 7, 2**31, -(2**31) - 5, 2**40 + 3, 2**62 + 11, 2**63 - 1, -(2**63),
                     -2, 123456789012345, -987654321987], np.int64)


class RefLru:
    """The store's contract, one id at a time (see the module docstring)."""

    def __init__(self, name, capacity, seed, p):
        self.name, self.capacity, self.seed, self.p = name, capacity, seed, p
        self.rows = collections.OrderedDict()  # id -> f32[DIM], least recently pulled first
        self.counters = collections.Counter()

    def init(self, i):
        return init_rows(self.seed, self.name, np.array([i], np.int64), DIM, self.capacity)[0]

    def pull(self, ids, admit=True):
        real = [int(i) for i in ids if i != -1]
        if admit:
            self.counters["pulls"] += 1
            hits = {i for i in real if i in self.rows}
            new = [i for i in real if i not in self.rows]
            cand = [i for i in new
                    if admission_draws(self.seed, self.name, np.array([i], np.int64))[0] < self.p]
            free = self.capacity - len(self.rows)
            evict = min(max(len(cand) - free, 0), len(self.rows) - len(hits))
            for victim in [i for i in self.rows if i not in hits][:evict]:
                del self.rows[victim]
            for i in cand[:free + evict]:
                self.rows[i] = self.init(i)
            for i in real:
                if i in self.rows:
                    self.rows.move_to_end(i)
            self.counters["admitted"] += len(cand[:free + evict])
            self.counters["evicted"] += evict
            self.counters["not_admitted"] += len(new) - len(cand[:free + evict])
        return np.array([np.zeros(DIM, np.float32) if i == -1 else
                         self.rows[int(i)] if int(i) in self.rows else self.init(int(i))
                         for i in ids], np.float32).reshape(len(ids), DIM)

    def push(self, ids, grads):
        self.counters["pushes"] += 1
        for i, g in zip(ids, grads):
            if i == -1:
                continue
            if int(i) in self.rows:
                self.rows[int(i)] = self.rows[int(i)] + (-np.float32(LR) * g)
            else:
                self.counters["dropped_gradients"] += 1


def lru_rows(store):
    """[(id, row)] of the store, least recently used first (from its snapshot)."""
    snap = store.snapshot()
    order = snap["order"][:int(snap["size"])]
    return [(int(snap["keys"][s]), snap["values"][s]) for s in order]


def assert_same(store, ref):
    got = lru_rows(store)
    assert [k for k, _ in got] == list(ref.rows), "residency / LRU order"
    for (k, v), r in zip(got, ref.rows.values()):
        np.testing.assert_allclose(v, r, rtol=0, atol=1e-6, err_msg=f"row of id {k}")
    assert store.size == len(ref.rows)
    assert {k: v for k, v in store.counters.items() if v} == {k: v for k, v in ref.counters.items() if v}


def with_filler(ids, n):
    return np.concatenate([np.asarray(ids, np.int64), np.full(n, -1, np.int64)])


_ids = st.lists(st.sampled_from(list(UNIVERSE)), unique=True, max_size=7)
_pull = st.tuples(st.just("pull"), _ids.filter(len), st.sampled_from([True, True, True, False]),
                  st.integers(0, 2))  # (ids, admit, filler)
_op = st.one_of(_pull, _pull,
                st.tuples(st.just("push"), _ids, st.integers(0, 2**31), st.integers(0, 2)),
                st.tuples(st.just("restore")))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(1, 5), p=st.sampled_from([1.0, 0.7, 0.3]), seed=st.integers(0, 3),
       ops=st.lists(_op, min_size=3, max_size=20))
def test_matches_reference_lru(capacity, p, seed, ops):
    store = LruStore("emb/t", DIM, capacity, SGD, seed=seed, admit_probability=p)
    ref = RefLru("emb/t", capacity, seed, p)
    for op in ops:
        if op[0] == "pull":
            _, ids, admit, filler = op
            ids = with_filler(ids, filler)
            np.testing.assert_allclose(store.pull(ids, admit=admit), ref.pull(ids, admit),
                                       rtol=0, atol=1e-6)
        elif op[0] == "push":
            _, ids, gseed, filler = op
            ids = with_filler(ids, filler)
            grads = np.random.default_rng(gseed).normal(size=(ids.size, DIM)).astype(np.float32)
            store.push(ids, grads, step=0)
            ref.push(ids, grads)
        else:  # a fresh store restored from a snapshot carries on as the old one
            fresh = LruStore("emb/t", DIM, capacity, SGD, seed=seed, admit_probability=p)
            fresh.restore(store.snapshot())
            store = fresh
        assert_same(store, ref)


@pytest.mark.parametrize("p", [1.0, 0.6])
def test_matches_reference_lru_on_a_long_run(p):
    """400 random pulls/pushes of 1..40 of 120 ids into 50 rows: thousands of evictions."""
    rng = np.random.default_rng(7)
    universe = np.unique(rng.integers(-(2**63), 2**63 - 1, 120, dtype=np.int64))
    store = LruStore("emb/t", DIM, 50, SGD, seed=2, admit_probability=p)
    ref = RefLru("emb/t", 50, 2, p)
    pending = []  # pushes lag their pull by up to 3 batches, as with the engine's staleness
    for t in range(400):
        ids = rng.permutation(universe[rng.random(universe.size) < rng.uniform(0.01, 0.33)])
        ids = with_filler(ids, int(rng.integers(0, 3)))
        admit = rng.random() < 0.9
        np.testing.assert_allclose(store.pull(ids, admit), ref.pull(ids, admit), rtol=0, atol=1e-6)
        pending.append((ids, rng.normal(size=(ids.size, DIM)).astype(np.float32)))
        while pending and (len(pending) > 3 or rng.random() < 0.3):
            ids, grads = pending.pop(0)
            store.push(ids, grads, t)
            ref.push(ids, grads)
        if t % 100 == 99:
            assert_same(store, ref)
    assert_same(store, ref)
    assert min(ref.counters["evicted"], ref.counters["dropped_gradients"]) > 500


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"])
def test_with_room_for_every_id_equals_a_fixed_table(name):
    """Capacity >= ids: the store is a fixed table over those ids (init_rows, same optimizer).

    1,500 ids in batches of 300 also cross the store's first allocation (1,024 rows) and
    grow its arrays and hash index.
    """
    opt = make_sparse_optimizer(SparseOptimConfig(name, lr=0.05))
    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(-(2**63), 2**63 - 1, 1500, dtype=np.int64))
    ids = ids[ids != -1]
    store = LruStore("emb/C1", DIM, 2000, opt, seed=5, init=0.1)
    table = jnp.asarray(init_rows(5, "emb/C1", ids, DIM, num_embeddings=2000, scale=0.1))
    slots = opt.init(table)
    row_of = {int(k): r for r, k in enumerate(ids)}
    for step in range(8):
        batch = rng.permutation(ids)[:300]
        rows = np.array([row_of[int(i)] for i in batch])
        np.testing.assert_allclose(store.pull(with_filler(batch, 5)),
                                   np.concatenate([np.asarray(table)[rows], np.zeros((5, DIM))]),
                                   rtol=0, atol=1e-6)
        grads = rng.normal(size=(300, DIM)).astype(np.float32)
        store.push(with_filler(batch, 5), np.concatenate([grads, np.ones((5, DIM), np.float32)]),
                   step)
        table, slots = opt.update(table, slots, rows.astype(np.int32), grads, np.int32(step))
    assert store.counters["evicted"] == 0
    np.testing.assert_allclose(store.pull(ids, admit=False), np.asarray(table), rtol=0, atol=1e-6)
    snap = store.snapshot()
    order = np.argsort(snap["keys"][:store.size])  # store slots -> sorted-id order of `ids`
    for got, want in zip(jax.tree.leaves(snap["slots"]), jax.tree.leaves(slots)):
        rows = np.array([row_of[int(k)] for k in snap["keys"][:store.size][order]])
        np.testing.assert_allclose(got[:store.size][order], np.asarray(want)[rows], rtol=1e-6,
                                   atol=1e-6)  # accumulators grow to ~10: a few ulps


def test_evicted_id_restarts_from_init_row_and_fresh_slots():
    a, b, c = np.int64(2**62 + 1), np.int64(-5), np.int64(17)
    store = LruStore("emb/x", DIM, 2, ADAGRAD, seed=0)
    init_a = store.pull(np.array([a]))[0]
    store.push(np.array([a]), np.ones((1, DIM), np.float32), step=0)
    assert not np.allclose(store.pull(np.array([a]))[0], init_a)
    store.pull(np.array([b]))
    store.pull(np.array([c]))  # full: evicts a, the least recently pulled
    assert store.counters["evicted"] == 1 and {k for k, _ in lru_rows(store)} == {b, c}
    store.push(np.array([a, b]), np.ones((2, DIM), np.float32), step=1)
    assert store.counters["dropped_gradients"] == 1
    np.testing.assert_array_equal(store.pull(np.array([a]))[0], init_a)  # evicts b
    snap = store.snapshot()
    slot_a = int(np.flatnonzero(snap["keys"][:2] == a)[0])
    np.testing.assert_array_equal(snap["slots"][slot_a], np.full(DIM, 0.1, np.float32))


def test_one_pull_never_evicts_its_own_rows_and_drops_its_excess():
    store = LruStore("emb/x", DIM, 3, SGD, seed=0)
    store.pull(np.array([1, 2, 3, 4, 5], np.int64))  # 3 fit: 4 and 5 are not admitted
    assert [k for k, _ in lru_rows(store)] == [1, 2, 3]
    assert store.counters["not_admitted"] == 2
    store.pull(np.array([3, 6, 7, 8], np.int64))  # 3 is touched: evict 1, 2; 8 does not fit
    assert [k for k, _ in lru_rows(store)] == [3, 6, 7]
    assert dict(store.counters, pulls=0, pushes=0) == {
        "admitted": 5, "evicted": 2, "not_admitted": 3, "dropped_gradients": 0, "pulls": 0,
        "pushes": 0}
    assert store.snapshot()["stamps"][:3].tolist() == [2, 2, 2]


def test_push_after_a_pull_whose_id_was_admitted_later():
    """The push of a pull's ids finds rows admitted after that pull (push reuses its slots)."""
    store = LruStore("emb/x", DIM, 1, SGD, seed=0)
    first = np.array([5, 6], np.int64)
    store.pull(first)  # 5 admitted into slot 0, 6 does not fit
    store.pull(np.array([6], np.int64))  # evicts 5: 6 now in slot 0
    before = store.pull(np.array([6], np.int64), admit=False)
    store.push(first, np.ones((2, DIM), np.float32), step=0)
    assert store.counters["dropped_gradients"] == 1  # 5's
    np.testing.assert_allclose(store.pull(np.array([6], np.int64), admit=False), before - LR)


def test_filler_reads_zero_and_takes_no_gradient():
    store = LruStore("emb/x", DIM, 4, SGD, seed=0)
    out = store.pull(np.array([9, -1, -1], np.int64))
    np.testing.assert_array_equal(out[1:], 0.0)
    before = store.snapshot()
    store.push(np.array([-1, -1], np.int64), np.ones((2, DIM), np.float32), step=0)
    np.testing.assert_array_equal(store.snapshot()["values"], before["values"])
    assert store.counters["dropped_gradients"] == 0 and store.counters["admitted"] == 1


def test_eval_pull_changes_nothing():
    store = LruStore("emb/x", DIM, 2, ADAGRAD, seed=3, admit_probability=0.5)
    store.pull(UNIVERSE[:6])
    before = store.snapshot()
    counters = dict(store.counters)
    out = store.pull(UNIVERSE, admit=False)
    after = store.snapshot()
    assert jax.tree.all(jax.tree.map(np.array_equal, before, after))
    assert store.counters == counters
    resident = dict(lru_rows(store))
    for i, row in zip(UNIVERSE, out):
        want = resident.get(int(i), init_rows(3, "emb/x", np.array([i]), DIM, 2)[0])
        np.testing.assert_array_equal(row, want)


def test_snapshot_round_trips_through_checkpointer_bitwise(tmp_path):
    """Inside a pytree, jax x64 off: int64 ids survive exactly; the restored store then evicts,
    admits and updates exactly as the original."""
    assert not jax.config.jax_enable_x64
    store = LruStore("emb/x", DIM, 5, ADAGRAD, seed=1, admit_probability=0.8)
    rng = np.random.default_rng(0)
    batches = [rng.permutation(UNIVERSE)[:4] for _ in range(12)]
    for t, ids in enumerate(batches[:6]):
        store.pull(ids)
        store.push(ids, rng.normal(size=(4, DIM)).astype(np.float32), t)
    snap = store.snapshot()
    ck = Checkpointer(str(tmp_path / "ck"))
    ck.save(3, {"dense": np.zeros(2, np.float32), "emb": snap}, {"k": 1})
    fresh = LruStore("emb/x", DIM, 5, ADAGRAD, seed=1, admit_probability=0.8)
    got, _ = ck.restore({"dense": np.zeros(2, np.float32), "emb": fresh.snapshot()})
    ck.close()
    assert jax.tree.all(jax.tree.map(lambda a, b: a.dtype == b.dtype and np.array_equal(a, b),
                                     got["emb"], snap))
    assert set(snap["keys"][:5].tolist()) <= set(UNIVERSE.tolist())
    fresh.restore(got["emb"])
    for t, ids in enumerate(batches[6:], start=6):
        g = rng.normal(size=(4, DIM)).astype(np.float32)
        for s in (store, fresh):
            s.pull(ids)
            s.push(ids, g, t)
        assert jax.tree.all(jax.tree.map(np.array_equal, store.snapshot(), fresh.snapshot()))


def test_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        LruStore("emb/x", DIM, 0, SGD, seed=0)
    store = LruStore("emb/x", DIM, 4, SGD, seed=0)
    with pytest.raises(TypeError, match="int64"):
        store.pull(np.array([1, 2], np.int32))
    with pytest.raises(TypeError, match="int64"):
        store.push(np.array([1.0]), np.zeros((1, DIM), np.float32), 0)
    with pytest.raises(ValueError, match=r"grads must be \[len\(ids\), dim\] = \[2, 4\]"):
        store.push(np.array([1, 2], np.int64), np.zeros((2, DIM + 1), np.float32), 0)
    with pytest.raises(ValueError, match="admit_probability"):
        LruStore("emb/x", DIM, 4, SGD, seed=0, admit_probability=0.0)
    with pytest.raises(ValueError, match=r"this store is \[capacity, dim\] = \[4, 4\]"):
        store.restore(LruStore("emb/x", DIM, 5, SGD, seed=0).snapshot())
    snap = store.snapshot()
    with pytest.raises(TypeError, match="keys are int32"):
        store.restore(dict(snap, keys=snap["keys"].astype(np.int32)))


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9])
def test_admission_draws_rate_and_determinism(p):
    ids = np.arange(200_000, dtype=np.int64) * 7919 - 10**9
    u = admission_draws(4, "emb/C3", ids)
    assert ((u >= 0) & (u < 1)).all()
    rate = (u < p).mean()
    assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / ids.size)
    np.testing.assert_array_equal(u, admission_draws(4, "emb/C3", ids))
    for other in (admission_draws(5, "emb/C3", ids), admission_draws(4, "emb/C4", ids)):
        both = ((u < p) & (other < p)).mean()  # independent streams: P(both) = p^2
        assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / ids.size)


def test_id_index_matches_a_dict_through_removes_and_rebuilds():
    rng = np.random.default_rng(1)
    index, want = IdIndex(500), {}
    free = list(range(500))
    for _ in range(60):
        if want:  # remove a random part, then insert new keys into the freed slots
            gone = rng.choice(list(want.values()), size=min(len(want), 150), replace=False)
            index.remove(gone)
            want = {k: s for k, s in want.items() if s not in set(gone.tolist())}
            free += gone.tolist()
        keys = np.unique(rng.integers(-(2**63), 2**63 - 1, len(free), dtype=np.int64))
        keys = keys[[int(k) not in want for k in keys]]
        slots = np.array(free[:keys.size], np.int64)
        free = free[keys.size:]
        index.insert(keys, slots)
        want.update(zip(keys.tolist(), slots.tolist()))
        probe = np.concatenate([np.array(list(want), np.int64),
                                rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64)])
        np.testing.assert_array_equal(index.lookup(probe), [want.get(int(k), -1) for k in probe])
