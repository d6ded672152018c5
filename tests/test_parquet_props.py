"""Converted datasets, property-tested: for random files the chunks of ``parquet:DIR`` are the
chunks of the text reader it was converted from (ids hashed with random bucket counts, or raw;
dense values, labels, masks, rows, chunk sizes), and a file the text reader refuses is refused
by the converter with the same message.

Tokens are drawn from every form the id schemes tell apart (recjax/data/hashing.py): empty,
8 hex digits, canonical and odd decimals (``-0``, leading zeros, beyond 2**52), text of any
Unicode, bytes that are not UTF-8, NUL bytes and spaces around a token (the last three are bad
lines). Row groups and chunks are a few rows, so every pass crosses both.
"""

import os
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax.data import hashing
from recjax.data.avazu import COLUMNS as AVAZU_COLUMNS
from recjax.data.base import DataError, all_skipped_error
from recjax.data.convert import convert
from recjax.data.sources import open_source
from tests.test_parquet import assert_same_chunks

PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=60)
SEP = b",\n\r^"  # bytes no token may hold (they would split the line, or a sequence)

hex8 = st.integers(0, 2**32 - 1).map(lambda v: b"%08x" % v)
decimal = st.one_of(st.integers(-(2**60), 2**60).map(lambda v: b"%d" % v),
                    st.sampled_from([b"-0", b"007", b"0", b"-1", b"4503599627370496"]))
text = st.text(st.characters(blacklist_characters=",\n\r^", blacklist_categories=("Cs",)),
               min_size=1, max_size=12).map(str.encode)
raw_bytes = st.binary(min_size=1, max_size=8).map(lambda b: bytes(c for c in b if c not in SEP))
good = st.one_of(st.just(b""), hex8, decimal, text, st.just(b"x" * 40))
token = st.one_of(good, raw_bytes, st.sampled_from([b" 79", b"a\x00b", b"\xff\xfe"]))
clean = st.integers(0, 4).map(bool)  # 4 lines in 5 draw good tokens only, so most files read


def _round_trip(kind: str, data: bytes, *, options: list[dict], convert_kw: dict | None = None
                ) -> None:
    """Convert `data` as `kind` (with and without skipping bad lines) and compare."""
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "in.txt")
        with open(f, "wb") as fh:
            fh.write(data)
        for skip in (False, True):
            out = os.path.join(d, f"pq{skip}")
            text = open_source(f"{kind}:{f}", skip_bad_lines=skip)
            try:
                list(text.chunks())
                err = all_skipped_error(f, text.stats)  # what a run says of such a file
                text_error = None if err is None else str(err)
            except DataError as e:
                text_error = str(e)
            if text_error is not None:
                with pytest.raises(DataError) as e:
                    convert([f"{kind}:{f}"], out, skip_bad_lines=skip, rows_per_group=4,
                            **(convert_kw or {}))
                assert str(e.value) == text_error
                continue
            convert([f"{kind}:{f}"], out, skip_bad_lines=skip, rows_per_group=4,
                    **(convert_kw or {}))
            for opts in options:
                assert_same_chunks(
                    open_source(f"{kind}:{f}", skip_bad_lines=skip, chunk_rows=3, **opts),
                    open_source(f"parquet:{out}", chunk_rows=3, **opts))


@st.composite
def avazu_file(draw) -> bytes:
    n = draw(st.integers(1, 12))
    lines = [",".join(AVAZU_COLUMNS).encode()] if draw(st.booleans()) else []
    for _ in range(n):
        ok = draw(clean)
        click = draw(st.sampled_from([b"0", b"1"] if ok else [b"0", b"2"]))
        hour = draw(st.sampled_from([b"14102100", b"14103023", b"14102917"] + [b"14109999"] * (not ok)))
        cats = [draw(good if ok else token) for _ in AVAZU_COLUMNS[3:]]
        lines.append(b",".join([b"%d" % draw(st.integers(0, 10**19)), click, hour, *cats]))
    return b"\n".join(lines) + draw(st.sampled_from([b"\n", b""]))


@PROPS
@given(avazu_file(), st.integers(1, 2**31 - 1))
def test_avazu_tokens_of_every_form(data, buckets):
    _round_trip("avazu", data, options=[{"hash_buckets": buckets}, {"raw_ids": True}])


@st.composite
def criteo_file(draw) -> bytes:
    hexes = st.text("0123456789abcdef", max_size=10).map(str.encode)
    ints = st.one_of(st.just(b""), st.integers(-5, 10**12).map(lambda v: b"%d" % v))
    lines = []
    for _ in range(draw(st.integers(1, 8))):  # 40 fields a line: drawing them is the test's cost
        ok = draw(clean)
        label = draw(st.sampled_from([b"0", b"1"] if ok else [b"1", b"x"]))
        dense = [draw(ints) for _ in range(13)]
        cats = [draw(st.one_of(hexes, st.just(b"") if ok else st.sampled_from([b"", b"G1"])))
                for _ in range(26)]
        lines.append(b"\t".join([label, *dense, *cats]))
    return b"\n".join(lines) + b"\n"


@settings(PROPS, max_examples=40)
@given(criteo_file(), st.integers(1, 2**31 - 1))
def test_criteo_hex_of_any_length(data, buckets):
    _round_trip("criteo", data, options=[{"hash_buckets": buckets}, {"raw_ids": True}])


TAOBAO_HEADER = (b"clk,time_stamp,userid,adgroup_id,pid,cate_id,campaign_id,customer,brand,price,"
                 b"cms_segid,cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,"
                 b"occupation,new_user_class_level,click_sequence")


@st.composite
def taobao_file(draw) -> bytes:
    lines = [TAOBAO_HEADER]
    for _ in range(draw(st.integers(1, 10))):
        seq = draw(st.lists(st.one_of(decimal, text), max_size=8))
        cats = [draw(good if draw(clean) else token) for _ in range(8)]
        cats += [draw(st.sampled_from([b"1", b"", b"7"]))] * 8
        lines.append(b",".join([draw(st.sampled_from([b"0", b"1"])), b"2017-05-06 13:00:00",
                                *cats[:7], draw(st.sampled_from([b"3.9", b"", b"12"])),
                                *cats[7:15], b"^".join(seq)]))
    return b"\n".join(lines) + b"\n"


@PROPS
@given(taobao_file(), st.integers(2, 6), st.data())
def test_taobao_sequences_of_any_length(data, keep, draw):
    """Any run-time length up to the converter's; longer only when no sequence was cut."""
    lengths = [len(line.rsplit(b",", 1)[1].split(b"^")) for line in data.splitlines()[1:]]
    longest = max(lengths)
    run_len = draw.draw(st.integers(2, keep if longest > keep else keep + 3))
    _round_trip("taobao", data, convert_kw={"multi_hot_len": keep},
                options=[{"hash_buckets": 97, "multi_hot_len": run_len},
                         {"raw_ids": True, "multi_hot_len": run_len}])


def _splitmix_bucket(key: int, salt: int, buckets: int) -> int:
    """The documented scheme with Python integers (as tests/test_readers_props.py writes it)."""
    m = 2**64 - 1
    z = (((salt << 32) | key) + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return (z ^ (z >> 31)) % buckets


@PROPS
@given(st.lists(st.integers(0, 2**32 - 1), max_size=40), st.integers(0, 2**32 - 1),
       st.integers(1, 2**31 - 1), st.integers(1, 7), st.booleans())
def test_hash_keys_in_blocks_is_the_scheme(keys, salt, buckets, block, compiled):
    """The blocked hash_keys (blocks of 1..7 keys here), numpy's in-place passes or the
    compiled loop, is splitmix64 % buckets, into a new array or a strided column of a wider
    one."""
    old = hashing._BLOCK
    hashing._BLOCK = block
    try:
        arr = np.array(keys, np.uint32)
        want = [_splitmix_bucket(k, salt, buckets) for k in keys]
        assert hashing.hash_keys(arr, salt, buckets, compiled=compiled).tolist() == want
        out = np.zeros((len(keys), 3, 2), np.int64)
        hashing.hash_keys(arr, salt, buckets, out=out[:, 1, 0], compiled=compiled)
        assert out[:, 1, 0].tolist() == want and not out[:, [0, 2]].any()
    finally:
        hashing._BLOCK = old
    tokens = [b"%d" % k for k in keys]
    assert hashing.hash_tokens(tokens, salt, buckets).tolist() == [
        _splitmix_bucket(zlib.crc32(t), salt, buckets) for t in tokens]
