"""recjax/tools/suite_schedule.py: its replay of xdist's schedulers against hand-worked queues,
and against what pytest-xdist itself does with tests of known durations."""

import re
import subprocess
import sys

import pytest

from recjax.tools import suite_schedule as ts


def test_durations_sum_a_test_s_phases_and_order_keeps_the_collection():
    log = ["============ slowest durations ============",
           "2.50s call     tests/test_a.py::test_x[1-2 3]",
           "0.50s setup    tests/test_a.py::test_x[1-2 3]",
           "0.01s teardown tests/test_b.py::test_y",
           "(12 durations < 0.005s hidden.  Use -vv to show these durations.)"]
    assert ts.durations(log) == {"tests/test_a.py::test_x[1-2 3]": 3.0, "tests/test_b.py::test_y": 0.01}
    listing = ["tests/test_b.py::test_y", "tests/test_a.py::test_x[1-2 3]", "",
               "2 tests collected in 0.1s"]
    assert ts.order(listing) == ["tests/test_b.py::test_y", "tests/test_a.py::test_x[1-2 3]"]


def test_worksteal_takes_the_later_half_of_the_longest_queue():
    # 2 workers: [0..3] and [4..7]. Worker 1 runs 4, 5, 6 (1 s each); at t=3 it holds only 7,
    # takes 2 and 3 from worker 0 (which keeps 0, running, and 1); at t=5 it holds 3 and
    # worker 0 only 2 tests: nothing more to take.
    d = [10, 1, 1, 1, 1, 1, 1, 1]
    assert ts.worksteal(d) == [[0, 1], [4, 5, 6, 7, 2, 3]]
    assert ts.busy(d, ts.worksteal(d)) == [11, 6]
    # the test that ends next is the one whose end comes first (worker 1's 4, 5, 6 end at 5, 6,
    # 7), not the one on the worker that started first (worker 0's 0 ends at 10; taken first,
    # worker 1 would find [1, 2, 3] there and take only 3)
    assert ts.worksteal([10, 1, 1, 1, 5, 1, 1, 1]) == [[0, 1], [4, 5, 6, 7, 2, 3]]


def test_load_keeps_what_it_sent_a_worker_there():
    # 12 tests, 2 workers: a first run of 2 each ([0, 1], [2, 3]); then a worker left with 1
    # queued is filled to max(2, 8 // 2 // 2) = 2, one test at a time, the two taking turns.
    d = [0.02] * 8 + [1.0] * 4
    assert ts.load(d) == [[0, 1, 4, 6, 8, 10], [2, 3, 5, 7, 9, 11]]
    # the long tests first: worker 0 holds both for 2 s, worker 1 runs all the rest meanwhile
    assert ts.load([1.0, 1.0] + [0.02] * 10) == [[0, 1], list(range(2, 12))]
    # 40 tests of 1 s: first runs of 5 ([0..4], [5..9]), 30 pending. At t=3 each holds 2, under
    # max(2, 30 // 2 // 4) = 3, but a test of >= 0.1 s just ended with 2 left: it waits. At t=4
    # worker 0 holds 1 and is filled to max(2, 30 // 2 // 2) = 7: tests 10-15; worker 1 then to
    # max(2, 24 // 2 // 2) = 6: tests 16-20.
    ran = ts.load([1.0] * 40)
    assert ran[0][:11] == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15]
    assert ran[1][:10] == [5, 6, 7, 8, 9, 16, 17, 18, 19, 20]


_SLEEPS = [0.05, 0.07, 0.09, 0.11, 0.13, 0.15, 0.17, 0.19, 0.9, 1.3, 1.1, 1.5]


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["load", "worksteal"])
def test_the_replay_sends_each_test_to_the_worker_xdist_does(tmp_path, dist):
    """pytest-xdist itself, on 12 tests that sleep known times (the long ones last), runs the
    same tests on each worker, in the same order, as the replay says."""
    body = "import time\nimport pytest\n\n@pytest.mark.parametrize('i', range(12))\n" \
           f"def test_t(i):\n    time.sleep({_SLEEPS}[i])\n"
    (tmp_path / "test_sleeps.py").write_text(body)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", dist, "-v",
                          "-p", "no:cacheprovider", "-p", "no:randomly", "test_sleeps.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    got: dict[str, list[int]] = {}
    for worker, i in re.findall(r"\[(gw\d)\] .*PASSED test_sleeps\.py::test_t\[(\d+)\]", run.stdout):
        got.setdefault(worker, []).append(int(i))
    replay = getattr(ts, dist)(_SLEEPS)
    assert sorted(got.values()) == sorted(replay), (got, replay)
