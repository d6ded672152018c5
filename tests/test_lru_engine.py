"""The dynamic-id LRU store inside the host-async engine (``--embed.store lru``).

The reference for "a store that holds every id" is the fixed-table run started from the same
rows (``embed.init_by_id``): the two must train identically. Resume goes through orbax.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import pytest

import algorithms
from algorithms import async_ps, gba, persia
from tests.runtime_util import small_cfg

VOCAB = 1000  # the largest field of the smoke preset (10, 50, 200, 1000)


def _cfg(algo="async", steps=16, capacity=VOCAB, train=None, **fields):
    c = small_cfg(algo, steps=steps, sparse=("adagrad", 0.05), train=train, **fields)
    # a normal init does not depend on the table size, so a capacity-row store and the
    # fixed tables draw the same rows for the same ids
    return dataclasses.replace(c, embed=dataclasses.replace(c.embed, init="0.05", store="lru",
                                                            capacity=capacity))


def _fixed(cfg):
    return dataclasses.replace(cfg, embed=dataclasses.replace(cfg.embed, store="fixed",
                                                              init_by_id=True))


def _leaves(state):
    return jax.tree.leaves(state.params)


def _same_params(a, b, tol=0.0) -> bool:
    return all(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) <= tol
               for x, y in zip(_leaves(a), _leaves(b)))


def _fixed_rows_equal_store(fixed_state, lru_state, tol=0.0) -> None:
    """Every resident row of the store equals the fixed table's row of its id."""
    for name, table in fixed_state.tables.items():
        slots = lru_state.slots[name]
        n = int(slots["size"])
        keys = np.asarray(slots["keys"])[:n]
        rows = np.asarray(lru_state.tables[name])[:n]
        np.testing.assert_allclose(rows, np.asarray(table)[keys], atol=tol, rtol=0)


@pytest.mark.parametrize("run,fields", [
    (async_ps.run, {"trainers": 1, "workers_per_trainer": 1}),
    (async_ps.run, {"trainers": 2, "workers_per_trainer": 2}),
])
def test_a_store_holding_every_id_is_the_fixed_table_run(run, fields):
    cfg = _cfg(**fields)
    lru, fixed = run(cfg), run(_fixed(cfg))
    assert lru["lru"]["total"]["evicted"] == 0
    assert lru["lru"]["total"]["dropped_gradients"] == 0
    assert _same_params(lru["final_state"], fixed["final_state"])
    _fixed_rows_equal_store(fixed["final_state"], lru["final_state"])
    assert lru["eval_auc"] == fixed["eval_auc"]


@pytest.mark.slow  # ~26 s
def test_gba_and_persia_with_a_store_holding_every_id():
    for algo, run in (("gba", gba.run), ("persia", persia.run)):
        cfg = _cfg(algo)
        lru, fixed = run(cfg), run(_fixed(cfg))
        assert _same_params(lru["final_state"], fixed["final_state"], tol=1e-6), algo
        _fixed_rows_equal_store(fixed["final_state"], lru["final_state"], tol=1e-6)


def test_a_small_store_evicts_drops_and_counts():
    got = async_ps.run(_cfg(steps=40, capacity=60, trainers=2, workers_per_trainer=2))
    tot = got["lru"]["total"]
    assert tot["evicted"] > 0 and tot["dropped_gradients"] > 0
    # every admitted row is resident or was evicted
    assert tot["admitted"] - tot["evicted"] == tot["resident"]
    assert all(t["resident"] <= 60 for t in got["lru"]["per_table"].values())
    assert np.isfinite(got["eval_ne"]) and got["eval_auc"] > 0.5


def test_admission_probability_refuses_some_new_ids():
    cfg = _cfg(steps=20, trainers=1, workers_per_trainer=1)
    cfg = dataclasses.replace(cfg, embed=dataclasses.replace(cfg.embed, admit_probability=0.5))
    tot = async_ps.run(cfg)["lru"]["total"]
    assert tot["not_admitted"] > 0 and tot["dropped_gradients"] > 0


def test_lru_checkpoint_resume_is_the_uninterrupted_run(tmp_path):
    """16 steps, then --resume to 32 == 32 steps at once: the stores' keys, rows, slots and
    recency all went through orbax and came back."""
    once = async_ps.run(_cfg(steps=32, capacity=120, trainers=1, workers_per_trainer=1))
    out = str(tmp_path / "run")
    first = _cfg(steps=16, capacity=120, trainers=1, workers_per_trainer=1, train={"out": out})
    async_ps.run(first)
    assert os.path.isdir(os.path.join(out, "checkpoints", "16"))
    second = _cfg(steps=32, capacity=120, trainers=1, workers_per_trainer=1,
                  train={"out": out, "resume": True})
    resumed = async_ps.run(second)
    assert resumed["lru"]["total"]["evicted"] > 0
    assert _same_params(once["final_state"], resumed["final_state"])
    for name in once["final_state"].tables:
        a, b = once["final_state"].slots[name], resumed["final_state"].slots[name]
        np.testing.assert_array_equal(np.asarray(a["keys"]), np.asarray(b["keys"]))
        np.testing.assert_array_equal(np.asarray(once["final_state"].tables[name]),
                                      np.asarray(resumed["final_state"].tables[name]))


def test_lru_needs_a_host_async_algorithm():
    cfg = dataclasses.replace(_cfg(), train=dataclasses.replace(_cfg().train, algo="single"))
    with pytest.raises(ValueError, match="host-async algorithms"):
        algorithms.run(cfg)


@pytest.mark.parametrize("mode", ["gba", "sync", "async", "hop_bs", "bsp", "hop_bw"])
def test_gba_modes_run_on_ids_beyond_the_store_capacity(mode):
    """Ids of up to 1000 in a 60-row store (as Criteo's raw 64-bit tokens are beyond any
    capacity): GBA's per-id tags are keyed by id, not by row index (it indexed an array of
    `capacity` entries with the raw id: IndexError)."""
    cfg = _cfg("gba", steps=12, capacity=60, mode=mode, workers=4, local_batch_size=16,
               embedding_staleness="id", iota=1, stragglers="slow:k=1,factor=3")
    got = gba.run(cfg)
    assert got["lru"]["total"]["evicted"] > 0
    assert got["tagged_ids"] > 4 * 60  # more ids were tagged than one table's store holds
    assert np.isfinite(got["eval_ne"])


def test_gba_tags_by_raw_id_equal_tags_by_row_index():
    """A store holding every id, and the fixed tables: the same ids are tagged at the same
    steps, so the per-row staleness histogram and the dropped rows agree exactly."""
    cfg = _cfg("gba", steps=12, mode="gba", workers=4, local_batch_size=16,
               embedding_staleness="id", iota=0, stragglers="slow:k=1,factor=3")
    lru, fixed = gba.run(cfg), gba.run(_fixed(cfg))
    assert lru["embedding_staleness"] == fixed["embedding_staleness"]
    assert lru["embedding_staleness"]["max"] > 0
    assert lru["dropped_embedding_rows"] == fixed["dropped_embedding_rows"]
    assert lru["tagged_ids"] == fixed["tagged_ids"] > 0
