"""One block per process (issue 36 step 2): under ``scripts/launch.py`` (2 processes, gloo)
each process reads only its half of every global batch, and the run equals 1 process with 2
devices bit for bit (`tests/test_multiprocess.py` for the comparison itself).

Counted: process 0's summary (it writes ``--out``) says how many training examples it read.
The text sample is held in memory; the default shuffle buffer takes the whole epoch in, so one
process reads all 7,200 examples for its first step, and a process of two reads 4 x 32, the
rows of its block of the 4 global batches and no other.
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
    assert reads[1]["train"] == 4 * 32  # steps x its half of B = 64
