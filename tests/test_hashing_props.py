"""Hashed categorical ids of the readers vs the documented scheme, written out independently.

recjax/data/hashing.py documents the bucket of a token in field (or shared table) ``salt``:

    key    = crc32(token bytes)                       (zlib, 32 bits)
    word   = salt << 32 | key                         (64 bits)
    mix    = splitmix64 finaliser of word             (Steele et al. 2014; mod 2**64)
    bucket = mix % buckets

`bucket` below computes that with Python integers, not with recjax's numpy code, so a reader
that salts every field alike, drops the salt, or mixes another way fails here.
"""

import os
import tempfile
import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax.data import hashing
from recjax.data.avazu import AvazuSource
from recjax.data.criteo import CAT_NAMES, CriteoSource
from recjax.data.taobao import COLUMNS as TAOBAO_COLUMNS
from recjax.data.taobao import TaobaoSource

# derandomize: the same examples on every run, so CI never flips; no example database on disk.
PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=60)
MASK = 2**64 - 1


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def bucket(token: bytes, salt: int, buckets: int) -> int:
    return splitmix64((salt << 32) | zlib.crc32(token)) % buckets


def test_splitmix64_reference_is_the_published_one():
    """Our Python splitmix64 against the published sequence (Vigna's splitmix64.c, seed 0:
    the first output is the finaliser of 0x9E3779B97F4A7C15), so `bucket` is a real reference."""
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def _read(source_cls, lines: list[bytes], **kw):
    fd, path = tempfile.mkstemp(suffix=".txt")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(lines))
        src = source_cls(path, **kw)
        chunks = list(src.chunks())
        return src, np.concatenate([c.ids for c in chunks])
    finally:
        os.remove(path)


def _criteo_line(cats: list[bytes], label: bytes = b"1") -> bytes:
    return b"\t".join([label, *[b"3"] * 13, *cats]) + b"\n"


def test_criteo_known_value_in_known_field():
    """C3 = 68fd1e64 lands in bucket splitmix64(2 << 32 | crc32) % 2**17, and the same token in
    C1 and C26 in theirs (salts 0 and 25): the values pin the scheme, not just its properties.

    Bug reproduction (issue 14): the Criteo reader hashed every field with the same salt,

        criteo.CriteoSource.convert:  hash_tokens(tokens, 0, self.hash_buckets)   # was: k

    and every test passed, the AUC acceptance test included (every id is re-mapped, but
    consistently). Here C3's id is 92,844 instead of 20,641.
    """
    token = b"68fd1e64"
    cats = [b"0"] * 26
    cats[0] = cats[2] = cats[25] = token
    _, ids = _read(CriteoSource, [_criteo_line(cats)], hash_buckets=1 << 17)
    assert zlib.crc32(token) == 0xA130A0A3
    assert bucket(token, 2, 1 << 17) == 20_641  # by hand from the formulas above
    assert ids[0, 2, 0] == 20_641
    assert ids[0, 0, 0] == bucket(token, 0, 1 << 17) == 92_844
    assert ids[0, 25, 0] == bucket(token, 25, 1 << 17)
    assert len({ids[0, 0, 0], ids[0, 2, 0], ids[0, 25, 0]}) == 3


hex_token = st.binary(min_size=0, max_size=10).map(lambda b: b.hex().encode()[:12])


@PROPS
@given(tokens=st.lists(hex_token, min_size=3, max_size=8, unique=True),
       buckets=st.sampled_from([1 << 17, 1 << 20, 2**31 - 1]))
def test_criteo_fields_never_share_a_bucket_sequence(tokens, buckets):
    """The same token column put in all 26 categorical fields gives 26 different id sequences,
    each the documented bucket of its own field's salt."""
    _, ids = _read(CriteoSource, [_criteo_line([t] * 26) for t in tokens], hash_buckets=buckets)
    seqs = {tuple(ids[:, k, 0]) for k in range(len(CAT_NAMES))}
    assert len(seqs) == len(CAT_NAMES)
    want = [[bucket(t, k, buckets) for t in tokens] for k in range(len(CAT_NAMES))]
    np.testing.assert_array_equal(ids[:, :, 0].T, want)


@PROPS
@given(keys=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20),
       salt=st.integers(0, 2**32 - 1), buckets=st.integers(1, 2**31 - 1))
def test_hash_keys_matches_the_documented_scheme(keys, salt, buckets):
    got = hashing.hash_keys(np.array(keys, np.uint64), salt, buckets)
    assert got.dtype == np.int32
    assert got.tolist() == [splitmix64((salt << 32) | k) % buckets for k in keys]


@PROPS
@given(tokens=st.lists(st.binary(max_size=16), min_size=1, max_size=20),
       salt=st.integers(0, 1000), buckets=st.integers(1, 2**31 - 1))
def test_hash_tokens_matches_the_documented_scheme(tokens, salt, buckets):
    got = hashing.hash_tokens(tokens, salt, buckets)
    assert got.tolist() == [bucket(t, salt, buckets) for t in tokens]


@PROPS
@given(tokens=st.lists(st.text("abcxyz019_", min_size=1, max_size=6).map(str.encode),
                       min_size=3, max_size=6, unique=True))
def test_avazu_fields_never_share_a_bucket_sequence(tokens):
    """Avazu's 21 hashed columns (salt = the field's index in the spec, 2..22), each its own."""
    buckets = 1 << 20
    lines = [b",".join([b"1", b"0", b"14102100", *[t] * 21]) + b"\n" for t in tokens]
    _, ids = _read(AvazuSource, lines, hash_buckets=buckets)
    cats = ids[:, 2:, 0]
    assert len({tuple(c) for c in cats.T}) == 21
    want = [[bucket(t, k, buckets) for t in tokens] for k in range(2, 2 + 21)]
    np.testing.assert_array_equal(cats.T, want)


@PROPS
@given(tokens=st.lists(st.text("0123456789", min_size=1, max_size=6).map(str.encode),
                       min_size=3, max_size=6, unique=True))
def test_taobao_shared_table_shares_buckets_other_fields_do_not(tokens):
    """click_sequence shares the adgroup_id table, so a clicked id is in the ad group's bucket
    (salt = adgroup_id's field index); the other 14 one-hot fields have their own salts."""
    buckets = 1 << 20
    header = b",".join(c.encode() for c in TAOBAO_COLUMNS) + b"\n"
    lines = []
    for t in tokens:
        row = [b"1", b"2017-05-08 10:11:12"] + [t] * 16 + [t + b"^" + t]
        row[TAOBAO_COLUMNS.index("price")] = b"1.5"
        lines.append(b",".join(row) + b"\n")
    src, ids = _read(TaobaoSource, [header, *lines], hash_buckets=buckets, multi_hot_len=3)
    names = [f.name for f in src.spec.fields]
    ad = names.index("adgroup_id")
    seq = ids[:, names.index("click_sequence"), :2]
    np.testing.assert_array_equal(seq[:, 0], ids[:, ad, 0])
    np.testing.assert_array_equal(seq[:, 1], ids[:, ad, 0])
    one_hot = [k for k, n in enumerate(names) if n not in ("hour_of_day", "weekday", "click_sequence")]
    assert len({tuple(ids[:, k, 0]) for k in one_hot}) == len(one_hot) == 15
    for k in one_hot:
        assert ids[:, k, 0].tolist() == [bucket(t, k, buckets) for t in tokens], names[k]
