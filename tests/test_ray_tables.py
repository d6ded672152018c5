"""Issue 38's memory under Ray: no table passes through the driver after set-up (evaluation
pulls rows from the shard actors; checkpoints are written by them as parts,
recjax/checkpoint_parts.py), nor on a resume (each shard actor reads its own). Split from
tests/test_ray_backend.py; the helpers are tests/runtime_util.py's."""

import dataclasses
import os
import pathlib

import jax
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from algorithms import async_ps  # noqa: E402
from algorithms.runtime import ray_ps  # noqa: E402
from recjax import checkpoint_parts  # noqa: E402
from recjax.checkpoint import Checkpointer  # noqa: E402
from tests.runtime_util import (  # noqa: E402
    assert_trees,
    on_ray,
    on_threads,
    reference,
    small_cfg,
    worker_batches,
)


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["driver", "actors"])
def test_evaluation_pulls_rows_and_the_driver_gathers_no_table(cluster, monkeypatch, roles,
                                                                 tmp_path):
    """Issue 38's memory: under Ray evaluation pulls each eval batch's rows from the shard
    actors (as the workers do) instead of gathering every table into the driver, and with
    ``ray.final_tables`` false (what scripts/train.py sets) the driver gathers none at all,
    its checkpoints and out/best included (each shard actor writes its part,
    recjax/checkpoint_parts.py).
    The pulled-row eval equals the single trainer's predict on the whole final tables; the
    run without gathering (the PS's snapshot made to fail) has the same trajectory and eval."""
    from recjax.train import contract
    from recjax.train.data import open_data
    from recjax.train.setup import build
    from recjax.train.step import jit_predict

    base = small_cfg("async", steps=12, sparse=("adagrad", 0.05), trainers=1,
                     workers_per_trainer=1)
    base = dataclasses.replace(base, train=dataclasses.replace(base.train, eval_every=6))
    gathered = async_ps.run(on_ray(base, roles=roles))
    data = open_data(base)
    model = build(base, data.spec, tables=False)[0]
    st = gathered["final_state"]
    want, _ = contract.evaluate(base, data, jit_predict(model), st.params, st.tables)
    for k in ("auc", "logloss", "ne"):
        assert gathered[f"eval_{k}"] == want[k], k

    def no_gather(self):
        raise AssertionError("the driver gathered the tables")

    monkeypatch.setattr(ray_ps.RayEmbeddingPS, "snapshot", no_gather)
    out = tmp_path / "run"  # and its checkpoints: each shard actor writes its own tables
    kept = async_ps.run(on_ray(dataclasses.replace(base, train=dataclasses.replace(
        base.train, out=str(out), ckpt_every=6, keep_best=True)), roles=roles,
        final_tables=False))
    assert kept["final_state"].tables == {} and int(kept["final_state"].step) == 12
    assert_trees(kept["final_state"].params, st.params)
    for k in ("auc", "logloss", "ne"):
        assert kept[f"eval_{k}"] == gathered[f"eval_{k}"], k
    ck = Checkpointer(str(out / "checkpoints"))
    assert ck.all_steps() == [6, 12]
    assert [p["item"] for p in ck.meta(12)["integrity"]["parts"]] == ["tables_0", "tables_1"]
    saved, _ = ck.restore(jax.tree.map(np.asarray, st))
    assert_trees(saved, st)  # the checkpoint, read on one process, is the gathered state
    # out/best (keep_best): written by the shard actors too, the state of its eval's step
    best = Checkpointer(str(out / "best"))
    (step,) = best.all_steps()
    assert step == kept["best_step"] and "parts" in best.meta(step)["integrity"]
    assert_trees(best.restore(jax.tree.map(np.asarray, st))[0],
                 ck.restore(jax.tree.map(np.asarray, st), step=step)[0])


@pytest.mark.slow
def test_checkpoint_resumes_on_threads_and_back(cluster, tmp_path, monkeypatch, capsys):
    """A Ray run's checkpoint (its tables written by the shard actors as parts) resumes on
    threads, and Ray continues a threaded one and its own; each equals the state the run
    ended with. A Ray resume reads no table in the driver: each shard actor reads its own,
    and one that finds its part damaged sends the resume to the step before."""
    out = str(tmp_path / "run")
    base = small_cfg("async", steps=10, trainers=1, workers_per_trainer=1,
                     train={"out": out, "keep_ckpts": 3})
    first = async_ps.run(on_ray(base))["final_state"]
    cont = dataclasses.replace(base, train=dataclasses.replace(base.train, steps=20, resume=True))
    second = async_ps.run(on_threads(cont))
    assert second["start_step"] == 10 if "start_step" in second else True
    # one worker, synchronous pushes: 10 Ray steps + 10 threaded steps = 20 steps of train_step
    want = reference(base, worker_batches(base, 0, 1, 20))
    assert_trees(second["final_state"].params, want.params, rtol=1e-5, atol=1e-7)
    assert_trees(second["final_state"].tables, want.tables, rtol=1e-5, atol=1e-7)
    read = []  # what the driver reads of a checkpoint (this process is the driver)
    item = Checkpointer._restore_item
    monkeypatch.setattr(Checkpointer, "_restore_item", lambda self, step, name, like, strict=True:
                        read.append((name, like)) or item(self, step, name, like, strict))
    rest = checkpoint_parts.read_rest
    monkeypatch.setattr(checkpoint_parts, "read_rest",
                        lambda d, like: read.append(("state(partial)", like)) or rest(d, like))
    for steps in (25, 30):  # from the threaded step (saved whole), then from Ray's (parts)
        run = async_ps.run(on_ray(dataclasses.replace(cont, train=dataclasses.replace(
            cont.train, steps=steps))))
        want = reference(base, worker_batches(base, 0, 1, steps))
        assert int(run["final_state"].step) == steps
        assert_trees(run["final_state"].params, want.params, rtol=1e-5, atol=1e-7)
        assert_trees(run["final_state"].tables, want.tables, rtol=1e-5, atol=1e-7)
    # the resumes (and the saves' checks): the state's other arrays, partially from the
    # threaded step, which holds the tables too; no part, and no table
    states = [like for name, like in read if name.startswith("state")]
    assert [name for name, _ in read].count("state(partial)") == 1 and len(states) >= 3
    assert not any(like.tables or like.slots for like in states)
    assert not [name for name, _ in read if name.startswith("tables_")]
    assert first is not None
    # the Ray steps' tables were written by the shard actors (parts), the threaded one's whole
    ck = Checkpointer(os.path.join(out, "checkpoints"))
    assert [("parts" in ck.meta(s)["integrity"]) for s in ck.all_steps()] == [False, True, True]
    # bytes flipped in a part of the newest step: its shard actor says so, the resume goes on
    # from step 25
    part = max((f for f in pathlib.Path(out, "checkpoints", "30", "tables_1").rglob("*")
                if f.is_file()), key=lambda f: f.stat().st_size)
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 64] = bytes(b ^ 0xFF for b in raw[len(raw) // 2:][:64])
    part.write_bytes(bytes(raw))
    capsys.readouterr()
    run = async_ps.run(on_ray(dataclasses.replace(cont, train=dataclasses.replace(
        cont.train, steps=35))))
    assert "skipped damaged checkpoint step 30" in capsys.readouterr().out
    assert run["resumed_from_step"] == 25
    want = reference(base, worker_batches(base, 0, 1, 35))
    assert_trees(run["final_state"].tables, want.tables, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_an_lru_store_never_comes_to_the_driver(cluster, tmp_path, monkeypatch):
    """Dynamic-id tables (``embed.store=lru``) under Ray: the driver takes the stores' shapes
    from the shard actors, evaluation pulls rows, and each actor writes its stores into the
    checkpoints and reads them back on a resume; nothing gathers them (the PS's snapshot made
    to fail). One worker (synchronous pushes): the checkpoint at the run's end, stopped and
    resumed halfway on Ray, equals the state of the same run on threads."""
    def lru(cfg, **train):
        return dataclasses.replace(cfg, embed=dataclasses.replace(cfg.embed, store="lru",
                                                                   capacity=60),
                                   train=dataclasses.replace(cfg.train, **train))

    base = small_cfg("async", steps=12, sparse=("adagrad", 0.05), trainers=1,
                     workers_per_trainer=1)
    want = async_ps.run(on_threads(lru(base)))["final_state"]
    assert want.tables and want.slots["emb/C1"]["keys"].dtype == np.int64

    def no_gather(self):
        raise AssertionError("the driver gathered the stores")

    monkeypatch.setattr(ray_ps.RayEmbeddingPS, "snapshot", no_gather)
    out = str(tmp_path / "run")
    first = async_ps.run(on_ray(lru(base, out=out, stop_after=6), final_tables=False))
    assert first["steps"] == 6
    second = async_ps.run(on_ray(lru(base, out=out, resume=True), final_tables=False))
    assert second["steps"] == 12 and second["lru"]["total"]["evicted"] > 0
    ck = Checkpointer(os.path.join(out, "checkpoints"))
    assert ck.all_steps() == [6, 12] and "parts" in ck.meta(12)["integrity"]
    got, _ = ck.restore(jax.tree.map(np.asarray, want))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        if np.issubdtype(b.dtype, np.integer):  # the stores' ids, recency, counters: exact
            np.testing.assert_array_equal(a, b)
        else:  # (another process's XLA: 1 of 480 rows' values 1.3e-5 apart, seen)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
