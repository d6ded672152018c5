"""Issue 38's memory under Ray: no table passes through the driver after set-up (evaluation
pulls rows from the shard actors; checkpoints are written by them as parts,
recjax/checkpoint_parts.py). Split from tests/test_ray_backend.py, whose helpers it uses."""

import dataclasses

import jax
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from algorithms import async_ps  # noqa: E402
from algorithms.runtime import ray_backend, ray_ps  # noqa: E402
from recjax.checkpoint import Checkpointer  # noqa: E402
from recjax.config import RayConfig  # noqa: E402
from tests.runtime_util import assert_trees, on_ray, small_cfg  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    c = ray_backend.Cluster(RayConfig(num_cpus=2))
    yield c
    c.stop()


@pytest.mark.slow
@pytest.mark.parametrize("roles", ["driver", "actors"])
def test_evaluation_pulls_rows_and_the_driver_gathers_no_table(cluster, monkeypatch, roles,
                                                                 tmp_path):
    """Issue 38's memory: under Ray evaluation pulls each eval batch's rows from the shard
    actors (as the workers do) instead of gathering every table into the driver, and with
    ``ray.final_tables`` false (what scripts/train.py sets) the driver gathers none at all,
    its checkpoints included (each shard actor writes its part, recjax/checkpoint_parts.py).
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
        base.train, out=str(out), ckpt_every=6)), roles=roles, final_tables=False))
    assert kept["final_state"].tables == {} and int(kept["final_state"].step) == 12
    assert_trees(kept["final_state"].params, st.params)
    for k in ("auc", "logloss", "ne"):
        assert kept[f"eval_{k}"] == gathered[f"eval_{k}"], k
    ck = Checkpointer(str(out / "checkpoints"))
    assert ck.all_steps() == [6, 12]
    assert [p["item"] for p in ck.meta(12)["integrity"]["parts"]] == ["tables_0", "tables_1"]
    saved, _ = ck.restore(jax.tree.map(np.asarray, st))
    assert_trees(saved, st)  # the checkpoint, read on one process, is the gathered state
