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

from recjax.data import hashkernel

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


def crc32_tokens(tokens: Sequence[bytes] | Tokens) -> np.ndarray:
    """u32[N]: ``zlib.crc32`` of each token (raw bytes, no decoding)."""
    if isinstance(tokens, Tokens):
        return tokens.crc32()
    return np.fromiter(map(zlib.crc32, tokens), dtype=np.uint32, count=len(tokens))


def _crc_tables() -> np.ndarray:
    """u32[8, 256]: slicing-by-8 tables of zlib's CRC-32 (reflected, polynomial 0xEDB88320)."""
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0xEDB88320), t >> 1).astype(np.uint32)
    tables = [t]
    for _ in range(7):
        prev = tables[-1]
        tables.append((prev >> 8) ^ t[prev & 0xFF])
    return np.stack(tables)


_CRC8 = _crc_tables()


def crc32_8(words: np.ndarray) -> np.ndarray:
    """u32[N]: ``zlib.crc32`` of N 8-byte tokens, each given as the u64 its bytes make in
    little-endian order, vectorised (slicing-by-8: eight table lookups per token instead of
    eight dependent steps)."""
    t = _CRC8
    c = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32) ^ np.uint32(0xFFFFFFFF)
    h = (words >> np.uint64(32)).astype(np.uint32)
    crc = t[7].take(c & 0xFF)
    crc ^= t[6].take((c >> 8) & 0xFF)
    crc ^= t[5].take((c >> 16) & 0xFF)
    crc ^= t[4].take(c >> 24)
    crc ^= t[3].take(h & 0xFF)
    crc ^= t[2].take((h >> 8) & 0xFF)
    crc ^= t[1].take((h >> 16) & 0xFF)
    crc ^= t[0].take(h >> 24)
    return crc ^ np.uint32(0xFFFFFFFF)


class Tokens:
    """A column of tokens as one byte buffer and offsets (e.g. a pyarrow binary column's
    buffers, no Python object per token), which `crc32_tokens`, `hash_tokens` and `raw_ids`
    take as they take a list of bytes, with the same results.

    8-byte tokens (all of Criteo's) are hashed and read as hex without a Python call per
    token; others go through the per-token code.

    Attributes:
      data: u8[...] the bytes.
      offsets: i64[N + 1]: token i is ``data[offsets[i]:offsets[i + 1]]``.
    """

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, np.asarray(offsets, np.int64)
        self.lengths = np.diff(self.offsets)

    def __len__(self) -> int:
        return self.lengths.size

    def tolist(self, index: np.ndarray | None = None) -> list[bytes]:
        """The tokens (those at `index`) as bytes."""
        raw, off = self.data.tobytes(), self.offsets.tolist()  # Python ints: no numpy scalars
        if index is None:
            return [raw[a:b] for a, b in zip(off, off[1:])]
        return [raw[off[i]:off[i + 1]] for i in np.asarray(index).tolist()]

    def eight(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions of the 8-byte tokens, their bytes as little-endian u64[M])."""
        at = np.flatnonzero(self.lengths == 8)
        n = self.data.size - 7
        if not at.size or n < 1:
            return at, np.zeros(0, np.uint64)
        # every byte offset of the buffer as the start of an (unaligned) 8-byte word
        words = np.ndarray((n,), "<u8", buffer=self.data, offset=0, strides=(1,))
        return at, words[self.offsets[at]]

    def crc32(self) -> np.ndarray:
        out = np.zeros(len(self), np.uint32)  # crc32(b"") == 0
        at, words = self.eight()
        out[at] = crc32_8(words)
        rest = np.flatnonzero((self.lengths != 8) & (self.lengths != 0))
        if rest.size:
            out[rest] = np.fromiter(map(zlib.crc32, self.tolist(rest)), np.uint32, rest.size)
        return out


_BLOCK = 16384  # keys hashed at once by `hash_keys`: its scratch words stay in the CPU cache


def hash_keys(keys: np.ndarray, salt: int, buckets: int, out: np.ndarray | None = None,
              compiled: bool = True) -> np.ndarray:
    """Buckets of 32-bit keys (crc32 of tokens, or small non-negative integer ids).

    ``mix64(salt << 32 | key) % buckets``. With numba installed it is one compiled loop
    (`recjax.data.hashkernel`, ~0.6 ns an id); otherwise, or with ``compiled=False``, numpy in
    cache-sized blocks with in-place operations and the remainder as ``x - (x // b) * b``
    (numpy divides by a scalar with libdivide, ~8x faster than its ``%``; ~3.5 ns an id). Both
    give the values of the plain expression (the golden tests pin them). The columnar reader
    hashes every id this way.

    Args:
      keys: integer array with values in ``[0, 2**32)``.
      salt: the field's (or shared table's) index; different salts give independent buckets.
      buckets: number of buckets, ``1 <= buckets < 2**31``.
      out: optional array of ``keys``' shape to write into (any integer dtype, strided views
        such as ``ids[:, f, 0]`` included); a new i32 array when None.
      compiled: use the compiled loop when numba is installed (False: always numpy; the
        benchmark and the tests compare the two).

    Returns:
      i32[...] buckets in ``[0, buckets)`` (``out`` when given).
    """
    if not 1 <= buckets <= _MAX_BUCKETS:
        raise ValueError(f"buckets must be in [1, 2**31 - 1], got {buckets}")
    if not 0 <= salt < 2**32:
        raise ValueError(f"salt must be in [0, 2**32), got {salt}")
    keys = np.asarray(keys)
    if out is None:
        out = np.empty(keys.shape, np.int32)
    elif out.shape != keys.shape:
        raise ValueError(f"out has shape {out.shape}, keys {keys.shape}")
    flat_keys = keys.reshape(-1)
    flat_out = out.reshape(-1) if out.ndim != 1 else out  # a 1-D strided view stays a view
    if not np.shares_memory(flat_out, out) and out.size:
        raise ValueError("out must be reshapeable to 1-D without a copy")
    fill = hashkernel.kernel() if compiled and keys.dtype.kind in "iu" else None
    if fill is not None:
        _hash_compiled(fill, flat_keys, salt, buckets, flat_out)
    else:
        _hash_numpy(flat_keys, salt, buckets, flat_out)
    return out


def _hash_compiled(fill, keys: np.ndarray, salt: int, buckets: int, out: np.ndarray) -> None:
    """`hash_keys` by the compiled loop: straight into a contiguous ``out``, else through a
    cache-sized contiguous block (a strided store stops the loop's vectorisation: ~1.4 ns an id
    against ~1 ns for block + copy)."""
    d, m = np.uint64(buckets), np.uint64(hashkernel.divisor_magic(buckets))
    if out.flags.c_contiguous and out.dtype.kind in "iu":
        fill(keys, salt, d, m, out)
        return
    block = np.empty(min(_BLOCK, keys.size), np.int32)
    for start in range(0, keys.size, _BLOCK):
        k = keys[start:start + _BLOCK]
        fill(k, salt, d, m, block[:k.size])
        out[start:start + k.size] = block[:k.size]


def _hash_numpy(keys: np.ndarray, salt: int, buckets: int, out: np.ndarray) -> None:
    """`hash_keys` in numpy (the module docstring's scheme, 13 in-place passes a block)."""
    high, b = np.uint64(salt) << np.uint64(32), np.uint64(buckets)
    n = min(_BLOCK, keys.size)
    z, t = np.empty(n, np.uint64), np.empty(n, np.uint64)
    with np.errstate(over="ignore"):  # wrap-around modulo 2**64 is the point (see mix64)
        for start in range(0, keys.size, _BLOCK):
            k = keys[start:start + _BLOCK]
            zv, tv = z[:k.size], t[:k.size]
            np.copyto(zv, k, casting="unsafe")  # as astype(np.uint64)
            np.bitwise_or(zv, high, out=zv)  # salt << 32 | key
            np.add(zv, _GOLDEN, out=zv)  # mix64, as above, in place
            np.right_shift(zv, np.uint64(30), out=tv)
            np.bitwise_xor(zv, tv, out=zv)
            np.multiply(zv, _M1, out=zv)
            np.right_shift(zv, np.uint64(27), out=tv)
            np.bitwise_xor(zv, tv, out=zv)
            np.multiply(zv, _M2, out=zv)
            np.right_shift(zv, np.uint64(31), out=tv)
            np.bitwise_xor(zv, tv, out=zv)
            np.floor_divide(zv, b, out=tv)  # z % b
            np.multiply(tv, b, out=tv)
            np.subtract(zv, tv, out=zv)
            out[start:start + k.size] = zv


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


def raw_ids(tokens: Sequence[bytes] | Tokens, field_index: int) -> np.ndarray:
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
    column = tokens if isinstance(tokens, Tokens) else None
    lengths = column.lengths if column is not None else np.fromiter(map(len, tokens), np.int64, n)
    tag = np.full(n, TAG_HASHED, np.uint64)
    value = np.zeros(n, np.uint64)
    tag[lengths == 0] = TAG_MISSING
    if column is not None:
        eight, words = column.eight()
    else:
        eight = np.flatnonzero(lengths == 8)
        joined = b"".join(tokens) if eight.size == n else b"".join([tokens[i] for i in eight])
        words = np.frombuffer(joined, "<u8")
    if eight.size:  # one vectorised pass over all 8-byte tokens (all of Criteo's)
        hexes, values = _hex8(words)
        tag[eight[hexes]] = TAG_HEX8
        value[eight[hexes]] = values[hexes]
    rest = np.flatnonzero(tag == TAG_HASHED)
    if rest.size:
        rest_tokens = column.tolist(rest) if column is not None else [tokens[i] for i in rest]
        exact, ints = _decimals(rest_tokens)
        tag[rest[exact]] = TAG_DECIMAL
        value[rest[exact]] = ints[exact].astype(np.uint64) & np.uint64(_VALUE_MASK)
        hashed = rest[~exact]
        if hashed.size:
            hashed_tokens = [rest_tokens[i] for i in np.flatnonzero(~exact)]
            words = crc32_tokens(hashed_tokens).astype(np.uint64) | (
                lengths[hashed].astype(np.uint64) << np.uint64(32))
            value[hashed] = mix64(words) >> np.uint64(64 - RAW_VALUE_BITS)
    ids = (np.uint64(field_index) << np.uint64(_FIELD_SHIFT)) | (tag << np.uint64(_TAG_SHIFT)) | value
    return ids.view(np.int64)


def add_field(ids: np.ndarray, field_index: int, out: np.ndarray | None = None) -> np.ndarray:
    """Raw ids of a field from its tokens' raw ids without field bits (``raw_ids(tokens, 0)``,
    as the columnar format stores them): ``raw_ids(tokens, f) == add_field(raw_ids(tokens, 0),
    f)``.

    Args:
      ids: i64[...] raw ids with field 0.
      field_index: as in `raw_ids`; in ``[0, MAX_RAW_FIELDS)``.
      out: optional array of ``ids``' shape to write into (e.g. ``ids[:, f, 0]`` of a chunk).
    """
    if not 0 <= field_index < MAX_RAW_FIELDS:
        raise ValueError(f"raw ids hold {RAW_FIELD_BITS} bits of field, so field_index must be "
                         f"in [0, {MAX_RAW_FIELDS}), got {field_index}")
    return np.bitwise_or(ids, np.int64(field_index << _FIELD_SHIFT), out=out)


def _hex8(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool[M] the 8-byte token is 8 lowercase hex digits, u64[M] its value) of tokens given as
    little-endian u64 words: each byte to its digit, then the digits packed pairwise in place
    (SWAR), no loop over the 8 positions."""
    x = _HEX_DIGIT[words.view(np.uint8)].view("<u8")  # byte i: digit i (16: not a digit)
    ok = (x & np.uint64(0xF0F0F0F0F0F0F0F0)) == 0
    x = ((x & np.uint64(0x000F000F000F000F)) << np.uint64(4)) | (
        (x & np.uint64(0x0F000F000F000F00)) >> np.uint64(8))  # 16-bit lanes: 2 digits
    x = ((x & np.uint64(0x000000FF000000FF)) << np.uint64(8)) | (
        (x & np.uint64(0x00FF000000FF0000)) >> np.uint64(16))  # 32-bit lanes: 4 digits
    x = ((x & np.uint64(0xFFFF)) << np.uint64(16)) | (
        (x & np.uint64(0x0000FFFF00000000)) >> np.uint64(32))  # the first digit most significant
    return ok, x


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


class TokenCapture:
    """The conversion mode of `CategoricalIds` (recjax/data/convert.py): tokens are kept, not
    turned into ids, so that hashing and raw ids stay a choice of the run that reads them.

    Each token that goes through `CategoricalIds.categorical_ids` is kept as its crc32 (hashed
    ids are ``hash_keys(crc, salt, buckets)``, as `hash_tokens` computes them) and its raw id
    without the field bits (``raw_ids(tokens, 0)``; the raw id is that OR ``salt << 56``), and
    the reader gets back each token's 1-based index in the capture instead of an id. The reader
    places, validates and drops lines as ever, so a chunk it yields holds, in ``ids``, the
    indices of exactly its tokens (0 = padding), in their places. `take` hands over the tokens
    captured since the last call, for the chunk just yielded (the readers parse no further than
    the chunk they yield).

    Attributes:
      salts: field name -> the salt its tokens were captured with.
    """

    def __init__(self):
        self.salts: dict[str, int] = {}
        self._crc: list[np.ndarray] = []
        self._raw: list[np.ndarray] = []
        self._n = 0

    def add(self, tokens: Sequence[bytes], field: str, salt: int) -> np.ndarray:
        """i64[N] the tokens' 1-based indices in this capture."""
        if self.salts.setdefault(field, salt) != salt:
            raise ValueError(f"field {field!r} captured with salts {self.salts[field]} and {salt}")
        self._crc.append(crc32_tokens(tokens))
        self._raw.append(raw_ids(tokens, 0))
        start, self._n = self._n, self._n + len(tokens)
        return np.arange(start + 1, self._n + 1, dtype=np.int64)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """(crc u32[n + 1], raw i64[n + 1]) of the tokens captured since the last call, indexed
        by the indices `add` returned (entry 0 is padding); the capture starts again empty."""
        crc = np.concatenate([np.zeros(1, np.uint32), *self._crc])
        raw = np.concatenate([np.zeros(1, np.int64), *self._raw])
        self._crc, self._raw, self._n = [], [], 0
        return crc, raw


class CategoricalIds:
    """Reader mixin: the ids of a categorical column, hashed buckets or (``raw_ids``) raw ids.

    Attributes (set by the reader):
      hash_buckets: buckets per hashed field (unused with raw ids).
      raw_ids: emit `raw_ids` (i64) instead of `hash_tokens` buckets (i32).
      raw_hashed: with raw ids, tokens of the most recent pass that had no exact form and were
        hashed (`TAG_HASHED`, the only ids that can collide), by field name. Counted before bad
        lines are dropped, like ``stats.truncated``.
      capture: None, or a `TokenCapture` (conversion mode, which needs ``raw_ids``: the
        indices it returns are i64).
    """

    hash_buckets: int
    raw_ids: bool
    capture: TokenCapture | None = None

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
        """Ids of one field's tokens: i64 raw ids or i32 buckets in ``[0, hash_buckets)``.

        Every reader turns a field's tokens into ids here and nowhere else, which is what lets
        the converter capture them (`TokenCapture`)."""
        if self.capture is not None:
            return self.capture.add(tokens, field, salt)
        if not self.raw_ids:
            return hash_tokens(tokens, salt, self.hash_buckets)
        ids = raw_ids(tokens, salt)
        n = int(np.count_nonzero(unpack_raw(ids)[1] == TAG_HASHED))
        if n:
            self.raw_hashed[field] += n
        return ids
