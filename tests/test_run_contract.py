"""The run contract every trainer shares (recjax/train/contract.py): issue 16's items 1, 2, 4, 9.

Each test fails on the code before the contract: the host-async runtime kept an old checkpoint
in a reused --out and resumed under any config; no trainer noticed a NaN loss; two runs could
write one --out at once.
"""

import json
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from algorithms import async_ps, gba, shadowsync
from recjax.checkpoint import Checkpointer
from recjax.train import contract, loop
from tests.runtime_util import small_cfg


def test_host_async_refuses_a_used_out_on_a_fresh_run(tmp_path):
    """Item 1: a second fresh run into the same --out kept the first run's checkpoint, and a
    later --resume continued the wrong run. Now it is refused before anything is written."""
    out = {"out": str(tmp_path)}
    kw = dict(sync="easgd", trainers=2, workers_per_trainer=1)
    shadowsync.run(small_cfg("shadow", steps=8, train=out, **kw))
    with pytest.raises(ValueError, match="already holds checkpoints"):
        shadowsync.run(small_cfg("shadow", steps=8, train={**out, "seed": 2}, **kw))
    ck = Checkpointer(str(tmp_path / "checkpoints"))
    assert ck.latest_step() == 8
    ck.close()


def test_host_async_resume_checks_the_config_and_carries_train_ne(tmp_path):
    """Item 2: --resume with another batch size, seed or learning rate was accepted; Train NE
    covered only the last segment."""
    out = {"out": str(tmp_path)}
    one = small_cfg("async", steps=6, trainers=1, workers_per_trainer=1, train=out)
    async_ps.run(one)
    for bad in ({"batch_size": 32}, {"seed": 7}):
        with pytest.raises(ValueError, match="cannot --resume"):
            async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1,
                                   train={**out, "resume": True, **bad}))
    with pytest.raises(ValueError, match="dense.lr"):
        async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1,
                               dense=("sgd", 0.5), train={**out, "resume": True}))
    resumed = async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1,
                                     train={**out, "resume": True}))
    straight = async_ps.run(small_cfg("async", steps=12, trainers=1, workers_per_trainer=1))
    assert resumed["steps"] == 12 and resumed["train_examples_scored"] == 12 * 64
    assert resumed["train_ne"] == pytest.approx(straight["train_ne"], rel=1e-6)


@pytest.mark.parametrize("algo", ["single", "async"])
def test_a_resume_at_the_end_evaluates_and_past_it_is_refused(tmp_path, algo):
    """Every trainer alike: a --resume from a checkpoint at the requested steps trains nothing
    and evaluates it (the same summary); one past them is an error, not a summary of a later
    step than asked for (the single trainer evaluated step 16 when asked for 8)."""
    def cfg(steps, resume=False):
        return small_cfg(algo, steps=steps, trainers=2, workers_per_trainer=1,
                         train={"out": str(tmp_path), "resume": resume})

    run = loop.run if algo == "single" else async_ps.run
    first = run(cfg(16))
    again = run(cfg(16, resume=True))
    assert again["steps"] == 16 and again["eval_ne"] == first["eval_ne"]
    with pytest.raises(ValueError, match="at step 16, past the requested 8 steps"):
        run(cfg(8, resume=True))


@pytest.mark.parametrize("algo", ["single", "gba"])
def test_a_nan_loss_stops_the_run_and_is_never_checkpointed(tmp_path, algo):
    """Item 4: --dense.lr=1e30 trained on NaN to the end (and the host-async runs saved it)."""
    train = {"out": str(tmp_path), "log_every": 2, "ckpt_every": 2}
    if algo == "single":
        cfg = small_cfg("single", steps=12, dense=("sgd", 1e30), train=train)
        run = loop.run
    else:
        cfg = small_cfg("gba", steps=12, dense=("sgd", 1e30), train=train, workers=2,
                        local_batch_size=32)
        run = gba.run
    with pytest.raises(contract.DivergedError, match="NaN or infinite") as e:
        run(cfg)
    assert "--dense.lr" in str(e.value)
    assert not (tmp_path / "summary.json").exists()
    ck = Checkpointer(str(tmp_path / "checkpoints"))
    for step in ck._mngr.all_steps():
        state, _ = ck.restore(_like(cfg), step)
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))
    ck.close()


def _like(cfg):
    from recjax.data.synthetic import SyntheticSource
    from recjax.train.setup import build

    return build(cfg, SyntheticSource(cfg.synthetic).spec)[3]


def test_two_runs_cannot_share_an_out(tmp_path):
    """Item 9: two runs on one --out 0.3 s apart corrupted each other. The second is refused
    while the first holds out/.lock (a process that holds it, here a stand-in)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time; f = open(sys.argv[1] + '/.lock', 'a+');"
         "fcntl.flock(f, fcntl.LOCK_EX); f.write('pid 1234 (test)'); f.flush();"
         "print('locked', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match="in use by another run"):
            loop.run(small_cfg("single", steps=2, train={"out": str(tmp_path)}))
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    s = loop.run(small_cfg("single", steps=2, train={"out": str(tmp_path)}))  # free again
    assert s["steps"] == 2
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl"])
def test_a_run_never_writes_through_a_planted_symlink(tmp_path, name):
    """Issue 40 item 5: ``ln -s FILE OUT/.lock`` (or metrics.jsonl) made a run truncate FILE."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    cfg = small_cfg("single", steps=2, train={"out": str(out)})
    with pytest.raises(ValueError, match="is a symbolic link"):
        loop.run(cfg)
    assert victim.read_text() == "precious\n"


def test_no_checkpoint_holds_a_non_finite_optimizer_slot(tmp_path):
    """Issue 40 item 9: with a finite loss, the Adagrad slots overflowed (lr 1e8) and step 2
    was checkpointed with inf in them, then named the last good checkpoint."""
    cfg = small_cfg("single", steps=40, dense=("sgd", 1e6), sparse=("adagrad", 1e8),
                    train={"out": str(tmp_path), "ckpt_every": 2, "log_every": 20})
    with pytest.raises(contract.DivergedError, match=r"NaN or infinite values in .*slots"):
        loop.run(cfg)
    ck = Checkpointer(str(tmp_path / "checkpoints"))
    for step in ck._mngr.all_steps():
        state, _ = ck.restore(_like(cfg), step)
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))
    ck.close()


def test_non_finite_leaves_names_the_paths():
    state = {"a": np.ones(3, np.float32), "b": {"c": np.array([1.0, np.inf], np.float32)},
             "n": np.array([2**40], np.int64), "d": np.array([np.nan])}
    assert contract.non_finite_leaves(state) == ["['b']['c']", "['d']"]
