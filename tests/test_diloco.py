"""DiLoCo / local SGD (algorithms/diloco.py; Douillard et al. 2023, Alg. 1) on 8 fake CPU devices.

* its registry row, written here by hand (tests/test_registry.py covers the rows before it);
* the distributed steps equal their single-device reference (`inner_steps` / `outer_step`
  without a mesh), one and two replicas per device, Adam + Adagrad inside, Nesterov outside;
* the limiting case: H = 1, outer lr 1, momentum 0, SGD inside = ``--algo sync`` on the same
  global batch;
* two rounds of H = 3 against a hand-written numpy schedule of logistic regression;
* the CLI writes a summary with an AUC; a stop (on or inside a round) and ``--resume`` is
  bitwise the uninterrupted run when the checkpoint loses nothing (momentum 0, SGD inside).
"""

import dataclasses
import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import algorithms
from algorithms.diloco import (
    DilocoSetup,
    DilocoStrategy,
    init,
    inner_steps,
    outer_optimizer,
    outer_step,
    replica_batch,
)
from algorithms.sync import SyncSetup, SyncStrategy
from recjax import registry
from recjax.config import DenseOptimConfig, DilocoConfig
from recjax.embeddings import SparseOptimConfig
from tests.conftest import ROOT
from tests.runtime_util import small_cfg
from tests.test_sharding_helpers import ONE_HOT, build_spec, random_batch, tiny_cfg


def _cfg(model="deepfm", k=0, h=2, lr=0.7, momentum=0.9, dense=("adam", 0.01),
         sparse=("adagrad", 0.1), batch=16):
    cfg = tiny_cfg(model, sparse=sparse[0], batch=batch)
    return dataclasses.replace(
        cfg, dense=DenseOptimConfig(name=dense[0], lr=dense[1], b1=0.9),
        sparse=SparseOptimConfig(name=sparse[0], lr=sparse[1]),
        diloco=DilocoConfig(replicas=k, inner_steps=h, outer_lr=lr, outer_momentum=momentum))


def _run_strategy(cfg, devices, batches):
    model, tx, sopt, state = build_spec(cfg, ONE_HOT)
    strat = DilocoStrategy(DilocoSetup.from_config(cfg, devices, ONE_HOT), model, tx, sopt)
    s = strat.prepare(jax.tree.map(np.asarray, state))
    for b in batches:
        s, m = strat.train_step(s, strat.put_batch(b))
    return strat, s


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def test_registry_row():
    """Written from docs/diloco.md: SPMD, its own section and the mesh's, in-loop evals only."""
    row = registry.REGISTRY["diloco"]
    assert (row.kind, row.run, row.sections) == ("spmd", "algorithms.diloco:run",
                                                 ("spmd", "diloco"))
    assert row.supports == {"in_loop_eval"}
    for change, able in ((dict(model={"dropout": 0.1}), "single or sync"),
                         (dict(embed={"store": "lru"}), "async, shadow, fr, gba or persia"),
                         (dict(embed={"dims": "C1:4"}), "single")):
        (section, kw), = change.items()
        cfg = small_cfg("diloco", steps=2)
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **kw)})
        with pytest.raises(ValueError, match=f"runs with --algo {able}[ ,].*--algo diloco "):
            algorithms.run(cfg)


# two replicas a device (vmap inside shard_map) runs with `make test-all` (slow)
@pytest.mark.parametrize("devices,k", [(8, 8), pytest.param(4, 8, marks=pytest.mark.slow)])
def test_distributed_steps_equal_the_single_device_reference(devices, k):
    """Two rounds of H = 2, Adam dense + Adagrad sparse inside, Nesterov (0.7, 0.9) outside:
    theta, every replica's params, tables and optimizer states after them, against the same
    pure functions on one device. Each replica gets other rows, so a misplaced one fails."""
    cfg = _cfg(k=k)
    batches = [random_batch(ONE_HOT, 16, seed=s) for s in range(4)]
    strat, got = _run_strategy(cfg, devices, batches)
    assert strat.outer_steps == 2

    model, tx, sopt, state = build_spec(cfg, ONE_HOT)
    otx = outer_optimizer(0.7, 0.9)
    ref = init(state, k, otx)
    inner_j = jax.jit(lambda i, b: inner_steps(model, tx, sopt, i, b))
    outer_j = jax.jit(lambda p, t, o, i: outer_step(otx, p, t, o, i))
    params, tables, opt, inner = ref.params, ref.tables, ref.outer_opt_state, ref.inner
    for s, b in enumerate(batches):
        inner, _ = inner_j(inner, replica_batch(b, k))
        if (s + 1) % 2 == 0:
            params, tables, opt, inner = outer_j(params, tables, opt, inner)
    want = _host((params, tables, opt, inner))
    have = _host((got.params, got.tables, got.outer_opt_state, got.inner))
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(have)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_h1_outer_sgd_lr1_no_momentum_is_sync():
    """Local SGD with period 1 (Lin et al. 2018): each replica's SGD step on its B/k rows,
    averaged, is the SGD step on the global batch's mean loss. 3 steps on 4 devices."""
    cfg = _cfg("dlrm", h=1, lr=1.0, momentum=0.0, dense=("sgd", 0.1), sparse=("sgd", 0.1))
    batches = [random_batch(ONE_HOT, 16, seed=s) for s in range(3)]
    strat, got = _run_strategy(cfg, 4, batches)
    model, tx, sopt, state = build_spec(cfg, ONE_HOT)
    sync = SyncStrategy(SyncSetup.from_config(cfg, 4, ONE_HOT), model, tx, sopt)
    s = sync.prepare(jax.tree.map(np.asarray, state))
    for b in batches:
        s, _ = sync.train_step(s, sync.put_batch(b))
    want, have = sync.unshard(s), strat.unshard(got)
    assert int(have.step) == int(want.step) == 3
    for part in ("params", "tables"):
        for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(getattr(want, part))[0],
                                jax.tree.leaves(getattr(have, part))):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6,
                                       err_msg=part + jax.tree_util.keystr(path))


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def test_two_rounds_of_h3_equal_a_hand_written_schedule():
    """Logistic regression (logit = b + sum_f w_f[id_f] + x . u), k = 4 replicas on 4 devices,
    H = 3, two rounds. Inside: dense SGD with momentum 0.9 (m <- g + 0.9 m; theta -= 0.1 m),
    sparse Adagrad (per touched row: a += G^2; w -= 0.1 G / (sqrt(a) + 1e-8)), each replica's
    m and a kept across rounds. Outside: Nesterov SGD, lr 0.7, mu 0.9 (M <- D + mu M;
    theta -= 0.7 (D + mu M)) on D = theta - mean_i theta_i. Written out in float64 numpy."""
    k, h, b = 4, 3, 16
    cfg = _cfg("lr", k=k, h=h, dense=("momentum", 0.1), sparse=("adagrad", 0.1), batch=b)
    batches = [random_batch(ONE_HOT, b, seed=10 + s) for s in range(2 * h)]
    _, got = _run_strategy(cfg, 4, batches)

    _, _, _, state = build_spec(cfg, ONE_HOT)
    tables0 = {name: np.asarray(t, np.float64)[:, 0] for name, t in state.tables.items()}
    table_of = [f"wide/{f.table}" for f in ONE_HOT.fields]
    theta = {"bias": 0.0, "u": np.zeros(ONE_HOT.n_dense), **tables0}  # LR starts at zeros
    mom = {key: np.zeros_like(v) for key, v in theta.items()}  # outer Nesterov momentum M
    reps = [{"m_bias": 0.0, "m_u": np.zeros(ONE_HOT.n_dense),
             "acc": {n: np.zeros_like(t) for n, t in tables0.items()}} for _ in range(k)]
    n = b // k
    for rnd in range(2):
        ends = []
        for i, r in enumerate(reps):
            w = {key: np.copy(v) for key, v in theta.items()}  # theta_i <- theta
            for step in range(rnd * h, (rnd + 1) * h):
                bt = batches[step]
                rows = slice(i * n, (i + 1) * n)
                x, ids, y = bt.dense[rows].astype(np.float64), bt.ids[rows, :, 0], bt.label[rows]
                z = w["bias"] + x @ w["u"] + sum(w[table_of[f]][ids[:, f]]
                                                 for f in range(len(table_of)))
                dz = (_sigmoid(z) - y) / n  # d mean BCE / d logit
                r["m_bias"] = dz.sum() + 0.9 * r["m_bias"]
                r["m_u"] = x.T @ dz + 0.9 * r["m_u"]
                w["bias"] -= 0.1 * r["m_bias"]
                w["u"] = w["u"] - 0.1 * r["m_u"]
                grads = {name: np.zeros_like(t) for name, t in tables0.items()}
                touched = {name: np.zeros(t.shape, bool) for name, t in tables0.items()}
                for f, name in enumerate(table_of):
                    np.add.at(grads[name], ids[:, f], dz)
                    touched[name][ids[:, f]] = True
                for name, g in grads.items():
                    t = touched[name]
                    r["acc"][name][t] += g[t] ** 2
                    w[name][t] -= 0.1 * g[t] / (np.sqrt(r["acc"][name][t]) + 1e-8)
            ends.append(w)
        for key in theta:
            delta = theta[key] - np.mean([e[key] for e in ends], axis=0)
            mom[key] = delta + 0.9 * mom[key]
            theta[key] = theta[key] - 0.7 * (delta + 0.9 * mom[key])

    np.testing.assert_allclose(float(got.params["bias"]), theta["bias"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got.params["dense_w"]), theta["u"], rtol=1e-5, atol=1e-6)
    for name in tables0:
        np.testing.assert_allclose(np.asarray(got.tables[name])[:, 0], theta[name], rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    trace_params, _ = got.outer_opt_state[0].trace  # over theta = (params, tables)
    np.testing.assert_allclose(float(trace_params["bias"]), mom["bias"], rtol=1e-5, atol=1e-6)


def test_cli_writes_a_summary_with_an_auc(tmp_path):
    r = subprocess.run([sys.executable, "scripts/train.py", "--algo", "diloco", "--devices", "4",
                        "--config", "smoke", "--steps", "24", "--diloco.inner_steps", "8",
                        "--out", str(tmp_path), "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["algorithm"] == "diloco" and s["steps"] == 24 and 0.5 < s["eval_auc"] < 1
    assert (s["diloco_replicas"], s["diloco_inner_steps"], s["outer_steps"]) == (4, 8, 3)
    assert 0 < s["comm_bytes_per_inner_step"] < s["comm_bytes_per_outer_step"]


def _resume_cfg(tmp_path, **train):
    cfg = small_cfg("diloco", steps=16, train={"devices": 4, "out": str(tmp_path),
                                               "ckpt_every": 8, **train})
    return dataclasses.replace(cfg, diloco=DilocoConfig(inner_steps=4, outer_lr=0.7,
                                                        outer_momentum=0.0))


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


@pytest.mark.parametrize("stop", [pytest.param(8, marks=pytest.mark.slow), 10])
def test_stop_and_resume_is_bitwise(tmp_path, stop):
    """SGD inside, outer momentum 0: the checkpoint (theta at a round's start) loses nothing.
    A stop at 10 is inside the round of steps 9-12: its checkpoint is step 8's, and the
    resumed run replays steps 9 and 10."""
    straight = algorithms.run(_resume_cfg(tmp_path / "a"))
    stopped = algorithms.run(_resume_cfg(tmp_path / "b", stop_after=stop))
    assert stopped["stopped_at"] == stop
    ckpts = sorted(int(p.name) for p in (tmp_path / "b" / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert ckpts == [8]
    resumed = algorithms.run(_resume_cfg(tmp_path / "b", resume=True))
    assert resumed["resumed_from_step"] == 8 and resumed["steps"] == 16
    for x, y in zip(_leaves(straight["final_state"]), _leaves(resumed["final_state"])):
        np.testing.assert_array_equal(x, y)
    assert straight["eval_ne"] == resumed["eval_ne"] and straight["eval_auc"] == resumed["eval_auc"]


@pytest.mark.parametrize("change,msg", [
    (dict(diloco={"replicas": 6}), "not a multiple of the 4 devices"),
    (dict(train={"batch_size": 63}), "does not split into diloco.replicas=4"),
    (dict(train={"ckpt_every": 6}), "train.ckpt_every=6 is not a multiple of diloco.inner_steps=4"),
    (dict(spmd={"mesh": "data=2,model=2"}), "keeps every replica whole"),
])
def test_refusals_name_the_setting(change, msg):
    cfg = _resume_cfg("")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=""))
    (section, kw), = change.items()
    cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **kw)})
    with pytest.raises(ValueError, match=msg):
        DilocoSetup.from_config(cfg, 4)
