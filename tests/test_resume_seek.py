"""``--resume`` from a mid-epoch checkpoint reads no example of the batches already trained on
and ends bitwise where the uninterrupted run ends (issue 36 step 1), for the single trainer,
sync on 2 devices and deterministic host-async runs (async, GBA).

The count is the run's ``data_rows_read`` (summary.json): examples its training source read.
A text sample is parsed into memory at open (not counted) and the default shuffle buffer holds
the whole epoch (a full permutation), so a run that seeks reads exactly the examples the epoch
has left: ``train rows - k x B`` after k steps; one that replayed the epoch would read them all.
A Parquet dataset too large for the memory cache (``--data.cache_rows 0``), in file order,
decodes row groups from the one holding the cursor on.
"""

import jax
import numpy as np
import pytest

import algorithms
from recjax import cli
from recjax.data.convert import convert
from tests.conftest import data_path

B = 64
TRAIN = data_path("criteo_kaggle_8k", "train.tsv")
VALID = data_path("criteo_kaggle_8k", "valid.tsv")


def _run(out, *args, **over):
    argv = ["--config", "smoke", "--model", "dlrm", "--batch-size", str(B), "--no-progress",
            "--data.hash_buckets=1000", "--out", str(out), *args]
    argv += [f"--{k}={v}" for k, v in over.items()]
    cfg, _ = cli.parse(argv, "test")
    return algorithms.run(cfg)


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves((state.params, state.opt_state, state.tables,
                                                    state.slots))]


def _check(tmp_path, args, steps, stop, bitwise=True):
    straight = _run(tmp_path / "a", *args, "--steps", str(steps))
    stopped = _run(tmp_path / "b", *args, "--steps", str(stop))
    assert stopped["steps"] == stop
    resumed = _run(tmp_path / "b", *args, "--steps", str(steps), "--resume")
    assert resumed["resumed_from_step"] == stop and resumed["steps"] == steps
    if bitwise:
        for x, y in zip(_leaves(straight["final_state"]), _leaves(resumed["final_state"])):
            np.testing.assert_array_equal(x, y)
        assert straight["eval_ne"] == resumed["eval_ne"]
    return straight["data_rows_read"], resumed["data_rows_read"]


TEXT = ["--data", f"criteo:{TRAIN}", "--eval-data", f"criteo:{VALID}"]
ALGOS = {"single": [], "sync": ["--algo", "sync", "--devices", "2"],
         "async": ["--algo", "async", "--trainers", "1", "--workers-per-trainer", "1",
                   "--deterministic"],
         "gba": ["--algo", "gba", "--gba.workers=1", "--gba.local_batch_size=32",
                 "--deterministic"],
         # two workers: each reads its own half; the run is not bitwise across a resume (the
         # workers' in-flight pulls and pushes at step 20 are not checkpointed: the same
         # difference as before resumes seeked), so only the reads are compared
         "async-2-workers": ["--algo", "async", "--trainers", "1", "--workers-per-trainer", "2",
                             "--deterministic"]}
# examples each reader reads, straight and resumed: the epoch's remaining ones, none of the
# first 20 steps' (the default buffer takes the whole epoch in; 2 async workers: a half each);
# the host-async engine's placement profile reads its 20 batches of epoch 0, and only those
READS = {"single": ({}, {}),
         "sync": ({}, {}),
         "async": ({"worker 0": 7200, "profile": 20 * B},
                   {"worker 0": 7200 - 20 * B, "profile": 20 * B}),
         "gba": ({"data list": 7200, "profile": 20 * 32},
                 {"data list": 7200 - 20 * B, "profile": 20 * 32}),
         "async-2-workers": ({"worker 0": 3600, "worker 1": 3600, "profile": 20 * B},
                             {"worker 0": 3600 - 10 * B, "worker 1": 3600 - 10 * B,
                              "profile": 20 * B})}


@pytest.mark.slow  # three runs each, 40-55 s under load; make test runs the Parquet one below
@pytest.mark.parametrize("algo", list(ALGOS))
def test_resume_reads_only_what_the_epoch_has_left(tmp_path, algo):
    n = 7200  # examples of the training file (no hold-out: eval is the other file)
    straight, resumed = _check(tmp_path, TEXT + ALGOS[algo], steps=40, stop=20,
                               bitwise=algo != "async-2-workers")
    want_straight, want_resumed = READS[algo]
    assert straight.get("by_reader", {}) == want_straight
    assert resumed.get("by_reader", {}) == want_resumed
    profile = want_straight.get("profile", 0)
    assert straight["train"] == n + profile
    assert resumed["train"] == n - 20 * B + profile


def test_parquet_resume_decodes_from_the_cursors_row_group(tmp_path):
    pq = tmp_path / "pq"
    convert([f"criteo:{TRAIN}"], str(pq), rows_per_group=256)
    args = ["--data", f"parquet:{pq}", "--eval-data", f"criteo:{VALID}",
            "--data.cache_rows=0", "--data.shuffle_buffer=0"]
    straight, resumed = _check(tmp_path, args, steps=60, stop=37)
    assert straight["train"] == 7200  # the 65,536-row chunk covers the file: a pass reads it all
    # the 37 x 64 = 2,368 rows before the cursor are in groups 0-9 (2,560 rows); group 9 holds
    # the cursor and is decoded whole, groups 0-8 (2,304 rows) are not
    assert resumed["train"] == 7200 - 2304
