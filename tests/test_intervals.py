"""A host-async run's checkpoint intervals go on in memory, on one runtime
(algorithms/runtime/intervals.py; issue 34: checkpoints without tearing the run down).

Each interval must go on exactly as a ``--resume`` from the checkpoint it just wrote would:
the references here are chains of real resumptions (a new process state each time: the
checkpoint read back from disk, the runtime built afresh), compared bit for bit with one run
that checkpoints at the same steps. The cases carry state beyond the train state (FR-BMUF's
BMUF states, S-EASGD's replicas and wPS, an LRU store's resident rows and clock), an optimizer
whose update reads the PS's step (sparse Adam), and GBA's M pushes per global step.
"""

import dataclasses
import json
import os

import pytest

import algorithms
from algorithms.runtime import supply
from recjax.checkpoint import Checkpointer
from recjax.embeddings.sparse_optim import SparseOptimConfig
from tests.runtime_util import assert_trees, small_cfg

HOST_ASYNC = ("async", "shadow", "fr", "gba", "persia")


def _cfg(tmp_path, algo, name, steps=24, sparse="sgd", **fields):
    train = {k: fields.pop(k) for k in ("stop_after", "resume") if k in fields}
    cfg = small_cfg(algo, steps=steps, train={"out": str(tmp_path / name), "ckpt_every": 8,
                                              "save_predictions": True, **train}, **fields)
    if sparse != "sgd":
        cfg = dataclasses.replace(cfg, sparse=SparseOptimConfig(name=sparse, lr=0.01))
    return cfg


@pytest.mark.parametrize("algo", HOST_ASYNC)
def test_a_periodic_run_builds_its_runtime_once(tmp_path, algo, monkeypatch):
    built = []
    init = supply.Feed.__init__

    def counting(self, *a, **k):  # the data is opened once per runtime build
        built.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(supply.Feed, "__init__", counting)
    out = algorithms.run(_cfg(tmp_path, algo, "run"))
    assert out["steps"] == 24
    assert Checkpointer(str(tmp_path / "run" / "checkpoints"), 5).all_steps()[-2:] == [16, 24]
    assert len(built) == 1, "each checkpoint interval rebuilt the runtime"
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        records = [json.loads(ln) for ln in f]
    assert {8, 16, 24} <= {r["step"] for r in records if r.get("kind") == "train"}


def _chain(tmp_path, algo, **fields):
    """The run as three processes' worth of resumptions: stop at 8, resume to 16, resume."""
    algorithms.run(_cfg(tmp_path, algo, "chain", stop_after=8, **fields))
    algorithms.run(_cfg(tmp_path, algo, "chain", stop_after=16, resume=True, **fields))
    return algorithms.run(_cfg(tmp_path, algo, "chain", resume=True, **fields))


def _predictions(tmp_path, name):
    with open(os.path.join(tmp_path, name, "predictions.csv"), "rb") as f:
        return f.read()


@pytest.mark.parametrize("algo,fields", [
    ("fr", dict(sync="bmuf", sparse="adam")),  # BMUF states in `own`; sparse Adam reads step
    ("shadow", dict(sparse="adam")),  # S-EASGD: replicas and wPS in `own`
    # GBA's async mode pushes each of the M gradients of a global step: the PS's optimizer
    # step runs ahead of the global step, and each interval starts it at the checkpoint's
    ("gba", dict(sparse="adam", mode="async", stragglers="lognormal:sigma=0.5+slow:k=1,factor=3")),
    ("persia", dict(sparse="adam")),
])
def test_in_memory_intervals_equal_a_chain_of_resumptions(tmp_path, algo, fields):
    whole = algorithms.run(_cfg(tmp_path, algo, "whole", **fields))
    chain = _chain(tmp_path, algo, **fields)
    assert chain["steps"] == whole["steps"] == 24
    assert_trees(chain["final_state"], whole["final_state"])
    assert _predictions(tmp_path, "chain") == _predictions(tmp_path, "whole")
    assert chain["eval_ne"] == whole["eval_ne"] and chain["train_ne"] == whole["train_ne"]


@pytest.mark.parametrize("algo", [a if a == "async" else pytest.param(a, marks=pytest.mark.slow)
                                  for a in HOST_ASYNC])
def test_a_resume_at_the_runs_end_evaluates_its_checkpoint(tmp_path, algo):
    """A ``--resume`` from a checkpoint at the run's end (its summary.json lost after the last
    checkpoint, or the same command run twice) trains nothing and writes the summary the run
    wrote, as the single trainer does; a checkpoint past the requested steps is refused."""
    first = algorithms.run(_cfg(tmp_path, algo, "run", steps=16))
    path = tmp_path / "run" / "summary.json"
    before = json.loads(path.read_text())
    path.unlink()
    again = algorithms.run(_cfg(tmp_path, algo, "run", steps=16, resume=True))
    assert again["resumed_from_step"] == 16 and again["worker_iterations"] == 0
    after = json.loads(path.read_text())
    for key in ("steps", "examples", "train_ne", "eval_ne", "eval_auc", "eval_logloss"):
        assert after[key] == before[key], key
    assert_trees(again["final_state"], first["final_state"])
    assert Checkpointer(str(tmp_path / "run" / "checkpoints"), 5).all_steps() == [8, 16]
    with pytest.raises(ValueError, match="at step 16, past the requested 8 steps"):
        algorithms.run(_cfg(tmp_path, algo, "run", steps=8, resume=True))


def test_an_lru_store_goes_on_as_from_its_checkpoint(tmp_path):
    from recjax.config import EmbedConfig

    def lru(cfg):
        return dataclasses.replace(cfg, embed=EmbedConfig(store="lru", capacity=300))

    whole = algorithms.run(lru(_cfg(tmp_path, "async", "whole")))
    algorithms.run(lru(_cfg(tmp_path, "async", "chain", stop_after=8)))
    algorithms.run(lru(_cfg(tmp_path, "async", "chain", stop_after=16, resume=True)))
    chain = algorithms.run(lru(_cfg(tmp_path, "async", "chain", resume=True)))
    assert _predictions(tmp_path, "chain") == _predictions(tmp_path, "whole")
    assert chain["lru"] == whole["lru"] and chain["lru"]["total"]["admitted"] > 0
    assert_trees(chain["final_state"], whole["final_state"])


@pytest.mark.slow
def test_under_ray_the_intervals_share_one_instance_and_its_processes(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from algorithms.runtime import ray_backend

    made, spawned = [], []
    init, spawn = ray_backend.Cluster.__init__, ray_backend.Cluster.spawn

    def counting_init(self, *a, **k):
        made.append(1)
        init(self, *a, **k)

    def counting_spawn(self, cls, *a, **k):
        spawned.append(cls.__name__)
        return spawn(self, cls, *a, **k)

    monkeypatch.setattr(ray_backend.Cluster, "__init__", counting_init)
    monkeypatch.setattr(ray_backend.Cluster, "spawn", counting_spawn)

    def on_ray(name, ckpt_every):
        cfg = _cfg(tmp_path, "gba", name)
        return dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, deterministic=False, ckpt_every=ckpt_every),
            runtime=dataclasses.replace(cfg.runtime, backend="ray"))

    algorithms.run(on_ray("one", 0))  # one interval: the actors a run starts
    one = sorted(spawned)
    made.clear(), spawned.clear()
    out = algorithms.run(on_ray("three", 8))
    assert out["steps"] == 24 and out["backend"] == "ray"
    assert Checkpointer(str(tmp_path / "three" / "checkpoints"), 5).all_steps()[-2:] == [16, 24]
    assert len(made) == 1  # one Ray instance for the three intervals
    assert "_Host" in one  # PS0: each interval's is built in the first one's process
    assert sorted(spawned) == one  # no actor started again (PS shards, worker groups, PS0)
