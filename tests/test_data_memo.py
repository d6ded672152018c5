"""recjax/data/memo.py: the synthetic teacher's chunks made once per process.

The memo may change what is kept, never a value: a source read through it gives the arrays a
source with no memo gives, bit for bit; a second source of the same config makes nothing
again; what it hands out is read-only; and its LRU keeps at most its budget, dropping the
least recently used first (against a hand-written trace).
"""

import threading

import numpy as np
import pytest

from recjax.data import memo
from recjax.data.synthetic import SyntheticConfig, SyntheticSource


def _arr(n_bytes: int, v: float = 0.0) -> np.ndarray:
    return np.full(n_bytes // 8, v, np.float64)


def test_the_lru_keeps_its_budget_and_drops_the_least_recently_used():
    m = memo.Memo(288)
    made = []

    def get(key, size=96):
        return m.get(key, lambda: made.append(key) or _arr(size, len(made)))

    get("a"), get("b"), get("c")  # 288 bytes: all kept
    get("a")  # a hit: a is now the most recent (order b, c, a)
    get("d")  # 384 > 288: b, the least recent, goes
    assert made == ["a", "b", "c", "d"] and m.nbytes == 288
    get("c"), get("a"), get("d")  # all kept: no new make
    assert made == ["a", "b", "c", "d"]
    get("b")  # made again; c, now least recent (d, c, a ... order c, a, d), goes
    assert made[-1] == "b" and m.nbytes == 288
    get("c")
    assert made[-1] == "c"
    big = get("huge", 1000)  # larger than the budget: made, handed out, not kept
    assert big.nbytes == 1000 and m.nbytes == 288 and not big.flags.writeable
    get("huge", 1000)
    assert made.count("huge") == 2
    assert (m.hits, m.misses) == (4, 8)


def test_what_it_hands_out_is_read_only_and_a_zero_budget_keeps_nothing():
    m = memo.Memo(1 << 20)
    got = m.get("k", lambda: ({"x": _arr(64)}, (_arr(64), None)))
    assert m.get("k", lambda: pytest.fail("made twice")) is got
    with pytest.raises(ValueError, match="read-only"):
        got[1][0][0] = 1.0
    off = memo.Memo(0)
    a, b = off.get("k", lambda: _arr(64)), off.get("k", lambda: _arr(64))
    assert a is not b and a.flags.writeable and off.nbytes == 0


def test_threads_that_ask_for_one_key_get_equal_values():
    m = memo.Memo(1 << 20)
    out = []

    def worker(i):
        for k in range(20):
            out.append((k, m.get(k, lambda k=k: _arr(800, k))))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 80 and all(float(v[0]) == k for k, v in out)
    assert m.nbytes == 20 * 800


CFG = SyntheticConfig(n_train=150_000, n_eval=70_000, seed=7)


def _pass(src):
    return [tuple(None if a is None else np.array(a) for a in c) for c in src.chunks()]


def test_a_source_through_the_memo_equals_one_without_it(monkeypatch):
    monkeypatch.setattr(memo, "SYNTHETIC", memo.Memo(0))
    want = {s: _pass(SyntheticSource(CFG, s)) for s in ("train", "eval")}
    bayes = SyntheticSource(CFG, "eval").labels_and_bayes_probs()
    best = SyntheticSource(CFG, "eval").bayes_optimal()
    made = []
    real = SyntheticSource._make
    monkeypatch.setattr(SyntheticSource, "_make",
                        lambda self, i, n: made.append((self.split, i)) or real(self, i, n))
    monkeypatch.setattr(memo, "SYNTHETIC", memo.Memo(1 << 30))
    for _ in range(2):  # a second source of the same config makes nothing again
        for split in ("train", "eval"):
            src = SyntheticSource(CFG, split, workers=2)
            got = _pass(src)
            assert len(got) == len(want[split]) and src.rows_read == src.num_rows
            for g, w in zip(got, want[split]):
                for a, b in zip(g, w):
                    assert (a is None and b is None) or (
                        a.dtype == b.dtype and np.array_equal(a, b))
        ev = SyntheticSource(CFG, "eval")
        y, p = ev.labels_and_bayes_probs()
        assert np.array_equal(y, bayes[0]) and np.array_equal(p, bayes[1])
        assert ev.bayes_optimal() == best
        # 150,000 rows = chunks of 65,536: 3 train, 2 eval, made once each in all
        assert sorted(made) == sorted([("train", i) for i in range(3)]
                                      + [("eval", i) for i in range(2)])
    # a seek into the middle reads the kept chunk (the rows it takes are still counted)
    src = SyntheticSource(CFG, "train")
    rows = src.take_rows(np.array([70_000, 3, 149_999]))
    assert np.array_equal(rows.row, [70_000, 3, 149_999]) and len(made) == 5
    with pytest.raises(ValueError, match="read-only"):
        next(iter(SyntheticSource(CFG, "eval").chunks())).ids[0, 0, 0] = 1
    other = SyntheticSource(SyntheticConfig(n_train=150_000, n_eval=70_000, seed=8), "eval")
    assert not np.array_equal(_pass(other)[0][1], want["eval"][0][1])  # another key


def test_a_study_turns_it_on_and_a_single_run_keeps_nothing(monkeypatch, tmp_path):
    from recjax.study import runner
    from tests.test_study_kit import STUDY, FakeRun

    monkeypatch.delenv(memo.ENV, raising=False)
    monkeypatch.setattr(memo.SYNTHETIC, "budget", memo._mb(0))
    assert memo.SYNTHETIC.budget == 0  # the default outside a study
    runner.run_study(STUDY, "quick", str(tmp_path / "a"), FakeRun(), log=lambda s: None)
    assert memo.SYNTHETIC.budget == memo.STUDY_MB * 2**20
    monkeypatch.setenv(memo.ENV, "0")  # the variable wins, in a study too
    runner.run_study(STUDY, "quick", str(tmp_path / "b"), FakeRun(), log=lambda s: None)
    assert memo.SYNTHETIC.budget == 0
    monkeypatch.setenv(memo.ENV, "64")
    assert memo._mb(0) == 64 * 2**20
