"""Stable hashing of categorical tokens to embedding-table buckets.

The bucket of a token must be the same in every process, on every machine and in every Python
version, or a checkpoint trained on one box looks up the wrong rows on another. Python's
``hash()`` is salted per process (``PYTHONHASHSEED``), so it is never used here.

Scheme (a change of it changes every bucket, so the golden values in the tests pin it):

1. ``crc32(token bytes)`` (``zlib``, C speed, one call per token) gives a 32-bit key. Tokens are
   hashed as raw bytes, so no decoding is needed and ``b""`` (a missing value) is a category too.
2. The key and a salt (the field's or table's index) are packed into one 64-bit word,
   ``salt << 32 | crc``, and mixed with the splitmix64 finaliser (vectorised numpy ``uint64``
   arithmetic, which wraps modulo 2**64). The salt makes the same token land in different
   buckets in different fields, so two fields of one shared table do not collide by design.
3. ``bucket = mix % buckets``.

32 bits of crc are plenty: with 10M distinct tokens in one field about 12k pairs share a crc,
far fewer than the collisions that ``buckets`` (typically 2**17..2**24) itself causes.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64 increment (2**64 / golden ratio)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MAX_BUCKETS = 2**31 - 1  # ids are int32


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of a ``uint64`` array: a bijection whose output bits look random.

    Args:
      x: u64[...] keys.

    Returns:
      u64[...] mixed keys.

    References:
      Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014.
    """
    # Wrap-around modulo 2**64 is the point; numpy warns about it only for scalars.
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def crc32_tokens(tokens: Sequence[bytes]) -> np.ndarray:
    """u32[N]: ``zlib.crc32`` of each token (raw bytes, no decoding)."""
    return np.fromiter(map(zlib.crc32, tokens), dtype=np.uint32, count=len(tokens))


def hash_keys(keys: np.ndarray, salt: int, buckets: int) -> np.ndarray:
    """Buckets of 32-bit keys (crc32 of tokens, or small non-negative integer ids).

    Args:
      keys: integer array with values in ``[0, 2**32)``.
      salt: the field's (or shared table's) index; different salts give independent buckets.
      buckets: number of buckets, ``1 <= buckets < 2**31``.

    Returns:
      i32[...] buckets in ``[0, buckets)``.
    """
    if not 1 <= buckets <= _MAX_BUCKETS:
        raise ValueError(f"buckets must be in [1, 2**31 - 1], got {buckets}")
    if not 0 <= salt < 2**32:
        raise ValueError(f"salt must be in [0, 2**32), got {salt}")
    word = np.asarray(keys).astype(np.uint64) | (np.uint64(salt) << np.uint64(32))
    return (mix64(word) % np.uint64(buckets)).astype(np.int32)


def hash_tokens(tokens: Sequence[bytes], field_index: int, buckets: int) -> np.ndarray:
    """Bucket of each categorical token of one field.

    Args:
      tokens: the field's raw tokens, e.g. ``[b"68fd1e64", b"", ...]`` (``b""`` = missing, its
        own category).
      field_index: salt, the index of the field (or of the table it shares) in the FeatureSpec.
      buckets: the field's ``vocab_size``.

    Returns:
      i32[N] ids in ``[0, buckets)``; identical across processes and machines.
    """
    return hash_keys(crc32_tokens(tokens), field_index, buckets)


def uniform01(seed: int, keys: np.ndarray) -> np.ndarray:
    """f64[...] in [0, 1): a stable pseudo-random number per (seed, key), e.g. per example row.

    Used for seeded hold-out splits: the same (seed, row) gives the same number everywhere.
    """
    s = mix64(np.uint64(seed % 2**64))
    z = mix64(np.asarray(keys).astype(np.uint64) ^ s)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
