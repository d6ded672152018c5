"""recjax/data/hashing.py: the cases mutation testing found unpinned (docs/testing.md).

References are written independently of the module: splitmix64 with Python integers
(tests/test_hashing_props.py, checked there against the published sequence) and the raw-id
layout of tests/test_raw_ids.py. Each docstring names the mutants it kills.
"""

import warnings
import zlib

import numpy as np
import pytest

from recjax.data import hashing
from recjax.data.avazu import CAT_NAMES as AVAZU_CATS
from recjax.data.avazu import AvazuSource
from tests.test_hashing_props import MASK, splitmix64
from tests.test_raw_ids import reference


def _uniform01(seed: int, key: int) -> float:
    """The documented draw: splitmix64(key ^ splitmix64(seed mod 2**64)), top 53 bits / 2**53."""
    return (splitmix64(key ^ splitmix64(seed & MASK)) >> 11) * 2.0**-53


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 + 5, -1, -(2**40)])
def test_uniform01_is_splitmix_of_key_and_seed(seed):
    """uniform01 (the seeded hold-out split's number per row) equals the scheme written with
    Python integers, for seeds past 2**63 and negative ones (taken mod 2**64). Kills
    ``seed % 2**64`` -> ``seed / 2**64`` and the other changes of that line (hashing.py:104),
    which no reader test reaches."""
    keys = np.array([0, 1, 2, 7, 2**32 + 3, 2**63 + 11, 2**64 - 1], np.uint64)
    got = hashing.uniform01(seed, keys)
    assert got.dtype == np.float64
    assert got.tolist() == [_uniform01(seed, int(k)) for k in keys]
    assert np.all((got >= 0) & (got < 1))


def test_uniform01_is_uniform():
    """10^5 rows: mean 1/2 and variance 1/12 within 5 standard errors, each decile within 5
    binomial standard deviations of 10^4."""
    u = hashing.uniform01(3, np.arange(100_000))
    n = u.size
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / n)
    counts = np.bincount((u * 10).astype(int), minlength=10)
    assert np.all(np.abs(counts - n / 10) < 5 * np.sqrt(n * 0.1 * 0.9))


def test_all_integer_column_respects_the_decimal_range():
    """A column of canonical integers only (Avazu's C14..C21 take the fast path of
    `_decimals`) with values just outside [-2**52, 2**52): those are hashed, the rest exact,
    as for the same tokens in a mixed column. Kills ``min() >= -L and max() < L`` ->
    ``or`` and ``len(values) and`` -> ``or`` (hashing.py:191), which accept the whole column
    as exact decimals."""
    low, high = -(2**52), 2**52
    for edge in (low - 1, high, low - 10**6, high + 10**6):
        tokens = [b"%d" % v for v in (0, 17, -3, edge, low, high - 1)]
        ids = hashing.raw_ids(tokens, 9)
        assert ids.tolist() == [reference(t, 9) for t in tokens]
        tags = hashing.unpack_raw(ids)[1].tolist()
        assert tags == [2, 2, 2, 4, 2, 2]


def test_unpack_raw_returns_int64_for_any_integer_input():
    """``(field, tag, value)``, each i64, also when the ids arrive as uint64 (mix64's dtype)
    or a list. Kills ``np.asarray(ids, np.int64)`` -> dtype None / dropped (hashing.py:205),
    which hand back uint64."""
    tokens = [b"68fd1e64", b"", b"-12", b"abc"]
    ids = hashing.raw_ids(tokens, 3)
    want = [(3, 3, 0x68FD1E64), (3, 1, 0), (3, 2, 2**53 - 12)]
    for form in (ids, ids.view(np.uint64), ids.tolist()):
        parts = hashing.unpack_raw(form)
        assert all(p.dtype == np.int64 for p in parts)
        assert [tuple(int(p[i]) for p in parts) for i in range(3)] == want
        assert parts[1][3] == hashing.TAG_HASHED


def test_mix64_of_scalars_and_int64_keys():
    """mix64 is splitmix64's finaliser for numpy scalars (the seeds of uniform01 and of the
    embedding initialisers), int64 arrays (row numbers) and Python ints alike, and wraps mod
    2**64 without a warning. Kills ``np.errstate(over="ignore")`` -> ``over=None`` (scalar
    multiplies then warn) and ``np.asarray(x, dtype=np.uint64)`` -> dtype None / dropped
    (int64 + uint64 is float64 in numpy), hashing.py:53-54."""
    keys = [0, 1, 5, 2**31 + 7, 2**62 + 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scalar = hashing.mix64(np.uint64(2**63 + 5))
        assert int(scalar) == splitmix64(2**63 + 5)
        for form in (np.array(keys, np.int64), keys, np.array(keys, np.uint64)):
            out = hashing.mix64(form)
            assert out.dtype == np.uint64
            assert out.tolist() == [splitmix64(k) for k in keys]


def test_crc32_tokens_are_uint32():
    """``u32[N]`` as documented, with zlib's values (kills ``dtype=np.uint32`` -> None,
    hashing.py:62, which gives float64)."""
    toks = [b"", b"68fd1e64", b"\xff" * 9]
    got = hashing.crc32_tokens(toks)
    assert got.dtype == np.uint32
    assert got.tolist() == [zlib.crc32(t) for t in toks]


@pytest.mark.parametrize("salt", [-1, 2**32, 2**32 + 5, 3**20 * 2**10])
def test_salt_must_fit_in_32_bits(salt):
    """A salt of 2**32 or more would be shifted out of the 64-bit word (2**32 << 32 wraps to 0,
    colliding with salt 0), so it is refused. Kills ``salt < 2**32`` -> ``<=``, ``< 3**32``,
    ``< 2**33`` (hashing.py:78)."""
    with pytest.raises(ValueError, match=r"salt must be in \[0, 2\*\*32\)"):
        hashing.hash_keys(np.array([1, 2], np.uint32), salt, 100)


def test_raw_hashed_counts_every_chunk_of_a_pass(tmp_path):
    """``raw_hashed`` (tokens hashed for lack of an exact form) is empty before any pass, sums
    over all chunks of a pass, and starts again with the next pass. Kills ``raw_hashed[field]
    += n`` -> ``= n`` (hashing.py:243: only the last chunk counted) and ``raw_hashed = None``
    in init_ids (hashing.py:226)."""
    path = tmp_path / "avazu.csv"
    path.write_bytes(b"".join(b",".join([b"1", b"0", b"14102100", *[b"a_b"] * 21]) + b"\n"
                              for _ in range(5)))
    src = AvazuSource(path, raw_ids=True, chunk_rows=2)
    assert src.raw_hashed == {}
    for _ in range(2):
        assert sum(c.ids.shape[0] for c in src.chunks()) == 5
        assert src.raw_hashed == {name: 5 for name in AVAZU_CATS}
