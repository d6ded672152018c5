"""scripts/bench_study.py (algorithms/tools/bench_study.py) at the quick size, one repeat: the
memo on and off run the same segments in two processes and score each alike to the last bit
(the benchmark raises otherwise); a memo that changed a value, or a child that ran other
segments, fails here."""

import pytest

from algorithms.tools import bench_study


@pytest.mark.slow
def test_the_memo_on_and_off_score_every_segment_alike():
    out = bench_study.bench_study(1, quick=True, log=lambda s: None)
    assert out["size"] == "quick" and out["segments"] == 2 * 3  # 2 arms x 3 chunks
    for key in ("all", "gba", "async"):
        assert out[key]["on_s"] > 0 and out[key]["off_s"] > 0 and out[key]["ratio"] > 0
