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

Raw ids (`raw_ids`, the readers' ``raw_ids=True`` mode for dynamic-id embedding stores) are the
exact alternative to buckets: a token becomes a 64-bit id that names its field and its value, so
two different tokens collide only in the one case spelled out there (tokens of no exact form).
"""

from __future__ import annotations

import collections
import re
import zlib
from collections.abc import Iterator, Sequence

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


# ----------------------------------------------------------------------------- raw ids
#
# Layout of a raw id (an int64; bit 63 is always 0, so ids are non-negative):
#
#     bit  63     62 ........ 56   55 .. 53   52 ................ 0
#          0      field (7 bits)   tag (3)    value (53 bits)
#
# field: the salt `hash_tokens` would use (the field's index, or the index of the first field of
# a shared table), so equal tokens of fields sharing a table share an id. tag: which exact form
# the token has; each form's value is an injective function of the token:
#
#   TAG_MISSING  b""                                value 0
#   TAG_HEX8     exactly 8 lowercase hex digits     value int(token, 16) < 2**32 (Criteo's C*)
#   TAG_DECIMAL  canonical decimal integer          value v mod 2**53 (53-bit two's complement)
#                -?(0|[1-9][0-9]*), not "-0", with
#                -2**52 <= v < 2**52
#   TAG_HASHED   anything else                      value = top 53 bits of
#                                                   mix64(len(token) << 32 | crc32(token))
#
# The forms are tried in this order (a token of 8 decimal digits is TAG_HEX8). Tag 0 is never
# used, so no real id is 0: 0 stays the padding id of the batch contract. TAG_HASHED is the only
# form where two tokens can share an id (two such tokens of one field with equal length and
# crc32, or equal top 53 bits of the mix); the readers count those tokens per field.

RAW_FIELD_BITS, RAW_TAG_BITS, RAW_VALUE_BITS = 7, 3, 53
MAX_RAW_FIELDS = 1 << RAW_FIELD_BITS  # fields (salts) 0..127
TAG_MISSING, TAG_DECIMAL, TAG_HEX8, TAG_HASHED = 1, 2, 3, 4
_TAG_SHIFT, _FIELD_SHIFT = RAW_VALUE_BITS, RAW_VALUE_BITS + RAW_TAG_BITS
_VALUE_MASK = (1 << RAW_VALUE_BITS) - 1
_DECIMAL_RE = re.compile(rb"-?(?:0|[1-9][0-9]{0,15})")  # 2**52 has 16 digits
_DECIMAL_LIMIT = 1 << (RAW_VALUE_BITS - 1)
_HEX_DIGIT = np.full(256, 16, np.uint8)  # 16 = not a lowercase hex digit
_HEX_DIGIT[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX8_SHIFTS = np.arange(28, -1, -4, dtype=np.uint64)  # first digit is the most significant


def raw_ids(tokens: Sequence[bytes], field_index: int) -> np.ndarray:
    """Raw 64-bit id of each categorical token of one field (layout in the comment above).

    Args:
      tokens: the field's raw tokens (``b""`` = missing, its own id).
      field_index: as `hash_tokens`'s salt; in ``[0, MAX_RAW_FIELDS)``.

    Returns:
      i64[N] non-negative ids; equal tokens get equal ids, and different tokens different ids
      unless both are of the hashed form (`TAG_HASHED`).
    """
    if not 0 <= field_index < MAX_RAW_FIELDS:
        raise ValueError(f"raw ids hold {RAW_FIELD_BITS} bits of field, so field_index must be "
                         f"in [0, {MAX_RAW_FIELDS}), got {field_index}")
    n = len(tokens)
    lengths = np.fromiter(map(len, tokens), np.int64, n)
    tag = np.full(n, TAG_HASHED, np.uint64)
    value = np.zeros(n, np.uint64)
    tag[lengths == 0] = TAG_MISSING
    eight = np.flatnonzero(lengths == 8)
    if eight.size:  # one vectorised pass over all 8-byte tokens (all of Criteo's)
        joined = b"".join(tokens) if eight.size == n else b"".join([tokens[i] for i in eight])
        digits = _HEX_DIGIT[np.frombuffer(joined, np.uint8)].reshape(-1, 8)
        hexes = (digits < 16).all(axis=1)
        tag[eight[hexes]] = TAG_HEX8
        value[eight[hexes]] = (digits[hexes].astype(np.uint64) << _HEX8_SHIFTS).sum(axis=1)
    rest = np.flatnonzero(tag == TAG_HASHED)
    if rest.size:
        exact, ints = _decimals([tokens[i] for i in rest])
        tag[rest[exact]] = TAG_DECIMAL
        value[rest[exact]] = ints[exact].astype(np.uint64) & np.uint64(_VALUE_MASK)
        hashed = rest[~exact]
        if hashed.size:
            words = crc32_tokens([tokens[i] for i in hashed]).astype(np.uint64) | (
                lengths[hashed].astype(np.uint64) << np.uint64(32))
            value[hashed] = mix64(words) >> np.uint64(64 - RAW_VALUE_BITS)
    ids = (np.uint64(field_index) << np.uint64(_FIELD_SHIFT)) | (tag << np.uint64(_TAG_SHIFT)) | value
    return ids.view(np.int64)


def _decimals(tokens: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(bool[N] token is a canonical decimal in [-2**52, 2**52), its value i64[N] or 0)."""
    try:  # fast path, a column of integers (Avazu's C14..C21): canonical iff it prints back
        ints = list(map(int, tokens))
        if list(map(b"%d".__mod__, ints)) == tokens:
            values = np.array(ints, np.int64)
            if len(values) and values.min() >= -_DECIMAL_LIMIT and values.max() < _DECIMAL_LIMIT:
                return np.ones(len(tokens), bool), values
    except (ValueError, OverflowError):
        pass  # not all integers (int() also refuses > 4300 digits): token by token below
    exact, values = np.zeros(len(tokens), bool), np.zeros(len(tokens), np.int64)
    for i, t in enumerate(tokens):
        if _DECIMAL_RE.fullmatch(t) and t != b"-0" and -_DECIMAL_LIMIT <= (v := int(t)) < _DECIMAL_LIMIT:
            exact[i], values[i] = True, v
    return exact, values


def unpack_raw(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(field, tag, value) of raw ids, each i64[...] (a decimal value comes back in its 53-bit
    two's complement, i.e. ``v mod 2**53``)."""
    ids = np.asarray(ids, np.int64)
    return (ids >> _FIELD_SHIFT, (ids >> _TAG_SHIFT) & ((1 << RAW_TAG_BITS) - 1),
            ids & _VALUE_MASK)


class CategoricalIds:
    """Reader mixin: the ids of a categorical column, hashed buckets or (``raw_ids``) raw ids.

    Attributes (set by the reader):
      hash_buckets: buckets per hashed field (unused with raw ids).
      raw_ids: emit `raw_ids` (i64) instead of `hash_tokens` buckets (i32).
      raw_hashed: with raw ids, tokens of the most recent pass that had no exact form and were
        hashed (`TAG_HASHED`, the only ids that can collide), by field name. Counted before bad
        lines are dropped, like ``stats.truncated``.
    """

    hash_buckets: int
    raw_ids: bool

    def init_ids(self, hash_buckets: int, raw_ids: bool) -> None:
        self.hash_buckets, self.raw_ids = hash_buckets, raw_ids
        self.raw_hashed: collections.Counter = collections.Counter()

    def chunks(self) -> Iterator:
        self.raw_hashed = collections.Counter()  # of this pass, like the reader's stats
        yield from super().chunks()

    @property
    def id_dtype(self) -> type:
        return np.int64 if self.raw_ids else np.int32

    def categorical_ids(self, tokens: Sequence[bytes], field: str, salt: int) -> np.ndarray:
        """Ids of one field's tokens: i64 raw ids or i32 buckets in ``[0, hash_buckets)``."""
        if not self.raw_ids:
            return hash_tokens(tokens, salt, self.hash_buckets)
        ids = raw_ids(tokens, salt)
        n = int(np.count_nonzero(unpack_raw(ids)[1] == TAG_HASHED))
        if n:
            self.raw_hashed[field] += n
        return ids
