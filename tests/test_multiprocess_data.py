"""One block per process (issue 36 step 2): under ``scripts/launch.py`` (2 processes, gloo)
each process reads only its half of every global batch, and the run equals 1 process with 2
devices bit for bit (`tests/test_multiprocess.py` for the comparison itself).

Counted: the summary (process 0 writes ``--out``) says how many training examples the run
read, and each process (`sharding.spmd.run_rows_read`). The text sample is held in memory; the
default shuffle buffer takes the whole epoch in, so one process reads all 7,200 examples for
its first step, and each process of two reads 4 x 32, the rows of its block of the 4 global
batches and no other.
"""

import json
import sys

import numpy as np
import pytest

from tests.conftest import data_path
from tests.test_multiprocess import COMMON, _run

TRAIN = data_path("criteo_kaggle_8k", "train.tsv")
VALID = data_path("criteo_kaggle_8k", "valid.tsv")


@pytest.mark.slow  # ~90 s under load: two launches
def test_two_processes_read_their_blocks_and_equal_one(tmp_path):
    train = [sys.executable, "scripts/train.py", *COMMON, "--algo", "sync", "--model", "dlrm",
             "--data", f"criteo:{TRAIN}", "--eval-data", f"criteo:{VALID}",
             "--data.hash_buckets=1000"]
    _run([sys.executable, "scripts/launch.py", "--num-processes", "2", "--timeout", "100", "--"]
         + train + ["--out", str(tmp_path / "two")])
    _run(train + ["--devices", "2", "--out", str(tmp_path / "one")])
    one, two = (np.load(tmp_path / d / "final_state.npz") for d in ("one", "two"))
    assert sorted(one.files) == sorted(two.files) and len(one.files) > 5
    for k in one.files:
        np.testing.assert_array_equal(two[k], one[k], err_msg=k)
    reads = [json.loads((tmp_path / d / "summary.json").read_text())["data_rows_read"]
             for d in ("one", "two")]
    assert reads[0]["train"] == 7200
    # each process: steps x its half of B = 64; the run: both
    assert [p["train"] for p in reads[1]["by_process"]] == [4 * 32, 4 * 32]
    assert reads[1]["train"] == 4 * 64


def test_the_runs_reads_are_counted_past_32_bits():
    """`run_rows_read` sends the counts through a JAX collective (int32 without x64): a count
    past 2^31 (Criteo-1TB's 4.4B rows) is not cut, and an uncounted source stays None."""
    from sharding.spmd import run_rows_read

    got = run_rows_read({"train": 4_400_000_123, "eval": None})
    assert got == {"train": 4_400_000_123, "eval": None,
                   "by_process": [{"train": 4_400_000_123, "eval": None}]}
