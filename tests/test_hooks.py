"""One set of run outputs for both drivers (`recjax.train.hooks`, issue 34 step 2): the
single/SPMD loop and the host-async engine write the same records through `RunOutputs`."""

import json
import types

import algorithms
from recjax.train.hooks import Cadence, RunOutputs
from tests.runtime_util import small_cfg


def test_cadence_is_the_multiples_after_the_start_short_of_the_end():
    c = Cadence(4, start=5)  # a run resumed at step 5: next multiple 8
    assert [s for s in range(5, 20) if c.due(s, end=16) and (c.done(s) or True)] == [8, 12]
    late = Cadence(4, start=0)  # a driver that looks at 3, then 9: records at 9, next 12
    assert not late.due(3, 100) and late.due(9, 100)
    late.done(9)
    assert late.next == 12 and not Cadence(0, 0).due(8, 100)


def _records(path, kind):
    with open(path / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_both_drivers_write_the_same_train_records(tmp_path):
    runs = {}
    for algo in ("single", "async"):
        out = tmp_path / algo
        algorithms.run(small_cfg(algo, steps=16, train={"out": str(out), "log_every": 4,
                                                        "eval_every": 8}))
        runs[algo] = out
    single, hogwild = (_records(runs[a], "train") for a in ("single", "async"))
    assert [r["step"] for r in single] == [r["step"] for r in hogwild] == [4, 8, 12, 16]
    rename = {"examples_per_virtual_sec": "examples_per_sec"}  # the virtual clock's rate
    for a, b in zip(single, hogwild):
        assert list(a) == [rename.get(k, k) for k in b if k != "virtual_seconds"]
    assert ([r["step"] for r in _records(runs["single"], "eval")]
            == [r["step"] for r in _records(runs["async"], "eval")] == [8, 16])


class _Stopper:  # what `RunOutputs.track` reads of an `EarlyStopper`
    def __init__(self, improves):
        self.improves, self.stopped_at, self.saved = improves, None, 0

    def update(self, step, ev):
        return self.improves

    should_stop = True

    def save_best(self, save):
        self.saved += 1
        save(None)


def test_a_run_is_early_stopped_at_a_mid_run_eval_never_at_its_final_one():
    cfg = small_cfg("single", train={"progress": False})
    out = RunOutputs(cfg, 0, 16, False, None, False, "t")
    out.stopper = _Stopper(improves=False)
    assert out.track(16, {}, save=lambda c: None, final=True) is False
    assert out.stopper.stopped_at is None
    assert out.track(8, {}, save=lambda c: None) is True and out.stopper.stopped_at == 8
    out.stopper = _Stopper(improves=True)
    got = []
    out.track(4, {}, save=got.append)
    assert out.stopper.saved == 1 and got == [None]
    out.stopper = types.SimpleNamespace(close=lambda: None)
    out.close()
