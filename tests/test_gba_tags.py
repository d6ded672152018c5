"""GBA's per-id tags (`algorithms.gba_tags.RowTags`) against a plain dict, raw ids and fixed."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.gba_tags import RowTags


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), updates=st.integers(1, 12), per=st.integers(1, 900),
       pool=st.sampled_from([50, 3000, 2**62]))
def test_raw_id_tags_match_a_dict(seed, updates, per, pool):
    """Raw 64-bit ids, any count (the map grows past its first 1024 ids), repeats in a lookup:
    every tag is the step of the id's last `set`, -1 for an id never set."""
    rng = np.random.default_rng(seed)
    tags, want = RowTags([("a", 10), ("b", 10)], raw_ids=True), {"a": {}, "b": {}}
    for k in range(updates):
        name = "ab"[k % 2]
        ids = np.unique(rng.integers(-pool, pool, per, dtype=np.int64))
        tags.set(name, ids, k)
        want[name].update(dict.fromkeys(ids.tolist(), k))
        probe = np.concatenate([ids, rng.integers(-pool, pool, 200, dtype=np.int64), ids[:5]])
        for n in "ab":
            np.testing.assert_array_equal(tags.get(n, probe),
                                          [want[n].get(int(i), -1) for i in probe])
    assert tags.count() == len(want["a"]) + len(want["b"])
    tags.reset()
    assert tags.count() == 0 and (tags.get("a", probe) == -1).all()


def test_fixed_tags_are_row_indices():
    tags = RowTags([("a", 5)], raw_ids=False)
    tags.set("a", np.array([1, 3]), 7)
    np.testing.assert_array_equal(tags.get("a", np.array([0, 1, 3, 3])), [-1, 7, 7, 7])
    assert tags.count() == 2
