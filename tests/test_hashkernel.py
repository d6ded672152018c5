"""The compiled hash loop (recjax/data/hashkernel.py) vs the documented scheme in Python integers.

The loop replaces numpy's ``%`` by a multiply-high and one correction (its docstring proves the
bound); here every bucket it gives is compared with ``splitmix64(salt << 32 | key) % buckets``
computed with Python's exact integers, over hypothesis-drawn keys, salts and bucket counts that
include 1, powers of two, odd numbers and the largest allowed (2**31 - 1), and the modulo alone
over the whole u64 range of numerators and divisors.
"""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax.data import hashing, hashkernel

PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=200)
MASK = 2**64 - 1
fill = hashkernel.kernel()
needs_numba = pytest.mark.skipif(fill is None, reason="numba is not installed")


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


BUCKETS = st.one_of(st.integers(1, 2**31 - 1), st.sampled_from([1, 2, 3, 2**17, 2**17 + 1, 2**20,
                                                                 2**31 - 2, 2**31 - 1]),
                    st.integers(0, 30).map(lambda e: 2**e), st.integers(2**30, 2**31 - 1))
KEYS = st.lists(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**32 - 1])),
                min_size=1, max_size=64)


@needs_numba
@PROPS
@given(keys=KEYS, salt=st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 200)),
       buckets=BUCKETS, dtype=st.sampled_from([np.uint32, np.int64, np.uint64]))
def test_compiled_buckets_are_the_scheme(keys, salt, buckets, dtype):
    want = [splitmix64((salt << 32) | k) % buckets for k in keys]
    got = hashing.hash_keys(np.array(keys, dtype), salt, buckets)
    assert got.dtype == np.int32 and got.tolist() == want
    assert hashing.hash_keys(np.array(keys, dtype), salt, buckets, compiled=False).tolist() == want


def _mod_by_magic(z: int, d: int) -> int:
    """The kernel's modulo, in Python integers (the docstring's two lines and the correction)."""
    q = (z * hashkernel.divisor_magic(d)) >> 64
    r = z - q * d
    assert 0 <= r < 2 * d  # the bound the docstring proves
    return r - d if r >= d else r


@PROPS
@given(z=st.one_of(st.integers(0, MASK), st.sampled_from([0, 1, MASK, MASK - 1, 2**63])),
       d=st.one_of(st.integers(1, MASK), st.integers(1, 2**31 - 1),
                   st.integers(0, 63).map(lambda e: 2**e), st.sampled_from([1, 3, MASK])))
def test_modulo_by_multiply_high_is_exact(z, d):
    assert _mod_by_magic(z, d) == z % d


@needs_numba
def test_compiled_and_numpy_agree_on_a_large_block():
    """Many blocks, a strided out, and a last partial block: the loop and numpy alike."""
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**32, 3 * hashing._BLOCK + 5, dtype=np.uint64).astype(np.uint32)
    for buckets in (1, 2**17, 1_000_003, 2**31 - 1):
        out = np.zeros((keys.size, 4, 1), np.int32)
        hashing.hash_keys(keys, 7, buckets, out=out[:, 2, 0])
        np.testing.assert_array_equal(out[:, 2, 0], hashing.hash_keys(keys, 7, buckets,
                                                                      compiled=False))
        assert not out[:, [0, 1, 3]].any()


def test_without_numba_hash_keys_is_numpy(monkeypatch):
    """No numba: `kernel()` is None and `hash_keys` gives the same buckets by numpy."""
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba now raises ImportError
    hashkernel.kernel.cache_clear()
    try:
        assert hashkernel.kernel() is None
        keys = np.arange(1000, dtype=np.uint32) * np.uint32(2654435761)
        assert hashing.hash_keys(keys, 3, 1000).tolist() == [
            splitmix64((3 << 32) | int(k)) % 1000 for k in keys]
    finally:
        hashkernel.kernel.cache_clear()
