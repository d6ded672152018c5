"""A host-async summary's counters cover the whole run (issue 34 step 2): across periodic
checkpoint intervals and a --resume, not the last interval only (ShadowSync's:
tests/test_shadowsync_checkpoints.py)."""

import algorithms
from recjax.train.contract import add_counts, subtract_counts
from tests.runtime_util import small_cfg


def test_add_counts_adds_integers_and_histograms_bin_by_bin():
    a = {"n": 3, "h": {"0": 2, "5": 1}}
    b = {"n": 4, "h": {"5": 2, "7": 1}, "m": 1}
    assert add_counts(a, b) == {"n": 7, "h": {"0": 2, "5": 3, "7": 1}, "m": 1}
    assert add_counts({}, b) == b and a == {"n": 3, "h": {"0": 2, "5": 1}}


def _cfg(tmp_path, algo, name, **train):
    return small_cfg(algo, steps=16, train={"out": str(tmp_path / name), "ckpt_every": 8,
                                            **train})


def test_async_counts_every_push_of_the_run(tmp_path):
    whole = algorithms.run(_cfg(tmp_path, "async", "w"))
    pushes = sum(whole["staleness_histogram"].values())
    assert pushes == 16  # one push a global step, both intervals (the last one alone: 8)
    algorithms.run(_cfg(tmp_path, "async", "p", stop_after=8))
    resumed = algorithms.run(_cfg(tmp_path, "async", "p", resume=True))
    assert resumed["staleness_histogram"] == whole["staleness_histogram"]
    assert resumed["dense_ps_bytes"] == whole["dense_ps_bytes"]


def test_gba_counts_every_update_of_the_run(tmp_path):
    whole = algorithms.run(_cfg(tmp_path, "gba", "w"))
    assert whole["updates"] == 16  # one update a global step in mode gba, both intervals
    assert sum(whole["dense_staleness"]["histogram"].values()) == whole["gradients_applied"]
    assert whole["gradients_applied"] + whole["dropped_gradients"] == 16 * whole["gba_M"]
    algorithms.run(_cfg(tmp_path, "gba", "p", stop_after=8))
    resumed = algorithms.run(_cfg(tmp_path, "gba", "p", resume=True))
    for k in ("updates", "gradients_applied", "dropped_gradients", "tokens_handed_out",
              "dense_staleness", "embedding_staleness"):
        assert resumed[k] == whole[k], k


def test_persia_counts_every_embedding_update_of_the_run(tmp_path):
    whole = algorithms.run(_cfg(tmp_path, "persia", "w"))
    assert whole["embedding_updates"] == 16  # one a global step, both intervals
    assert sum(whole["embedding_staleness"]["histogram"].values()) == 16
    algorithms.run(_cfg(tmp_path, "persia", "p", stop_after=8))
    resumed = algorithms.run(_cfg(tmp_path, "persia", "p", resume=True))
    for k in ("embedding_updates", "embedding_staleness", "bytes", "dense_allreduce_seconds"):
        assert resumed[k] == whole[k], k


def test_subtract_counts_undoes_add_counts():
    a = {"n": 3, "h": {"0": 2, "5": 1}}
    b = {"n": 4, "h": {"5": 2, "7": 1}, "m": 1}
    assert subtract_counts(add_counts(a, b), a) == {"n": 4, "h": {"5": 2, "7": 1}, "m": 1}
    assert subtract_counts(add_counts(a, b), b) == {"n": 3, "h": {"0": 2, "5": 1}, "m": 0}


def test_a_switch_keeps_each_algorithms_counts_apart(tmp_path):
    """GBA then Persia in one directory: both count 'embedding_staleness', with different
    meanings; Persia's summary counts its own 8 steps, not GBA's 8 added."""
    out = str(tmp_path / "s")
    algorithms.run(small_cfg("gba", steps=8, train={"out": out}))
    persia = algorithms.run(small_cfg("persia", steps=16, train={"out": out, "resume": True}))
    assert persia["embedding_updates"] == 8
    assert sum(persia["embedding_staleness"]["histogram"].values()) == 8
