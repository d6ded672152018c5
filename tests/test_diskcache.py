"""The on-disk parse cache replays exactly what the reader produced, and never stale data."""

import os
import pathlib

import numpy as np
import pytest

from recjax.data.base import DataError
from recjax.data.diskcache import DiskCachedSource
from recjax.data.sources import open_source

LINES = [
    "1\t1\t2\t\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13" + "\tab12cd34" * 26,
    "0\t\t-1\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13" + "\t0000ffff" * 25 + "\t",
    "0\tx\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13" + "\tab12cd34" * 26,  # bad: I1 = x
] * 40


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")


def _collect(src):
    return [tuple(None if a is None else np.array(a) for a in c) for c in src.chunks()]


def test_replay_equals_parse_and_keeps_stats(tmp_path):
    f = tmp_path / "d.tsv"
    _write(f, LINES)
    opts = {"hash_buckets": 97, "skip_bad_lines": True, "multi_hot_len": 20}
    make = lambda: DiskCachedSource(open_source(f"criteo:{f}", chunk_rows=16, **opts),
                                    str(tmp_path / "cache"), opts)
    first = make()
    assert not first.is_cached
    parsed = _collect(first)
    assert first.is_cached and first.stats.rows == 80 and sum(first.stats.skipped.values()) == 40
    again = make()  # a new run: replays from disk
    assert again.is_cached
    replayed = _collect(again)
    assert len(parsed) == len(replayed) == 5
    for a, b in zip(parsed, replayed):
        for x, y in zip(a, b):
            assert (x is None and y is None) or np.array_equal(x, y)
    assert again.stats.rows == 80 and sum(again.stats.skipped.values()) == 40
    assert again.stats.first_skipped == first.stats.first_skipped


def test_changed_file_or_options_miss_the_cache(tmp_path):
    f = tmp_path / "d.tsv"
    _write(f, LINES[:2])
    opts = {"hash_buckets": 97, "skip_bad_lines": False, "multi_hot_len": 20}
    a = DiskCachedSource(open_source(f"criteo:{f}", **opts), str(tmp_path / "c"), opts)
    _collect(a)
    b = DiskCachedSource(open_source(f"criteo:{f}", hash_buckets=98), str(tmp_path / "c"),
                         dict(opts, hash_buckets=98))
    assert b.directory != a.directory and not b.is_cached
    _write(f, LINES[:2] * 2)
    os.utime(f, ns=(1, 1))
    c = DiskCachedSource(open_source(f"criteo:{f}", **opts), str(tmp_path / "c"), opts)
    assert c.directory != a.directory and not c.is_cached
    assert sum(ch.size for ch in c.chunks()) == 4


def test_interrupted_first_pass_leaves_no_cache(tmp_path):
    f = tmp_path / "d.tsv"
    _write(f, LINES[:2] * 50)
    opts = {"hash_buckets": 97, "skip_bad_lines": False, "multi_hot_len": 20}
    src = DiskCachedSource(open_source(f"criteo:{f}", chunk_rows=8, **opts),
                           str(tmp_path / "c"), opts)
    it = src.chunks()
    next(it)
    it.close()  # the consumer stops early (e.g. --steps reached mid-epoch)
    assert not src.is_cached and os.listdir(tmp_path / "c") == []


@pytest.mark.slow
def test_the_key_does_not_depend_on_the_process_hash_seed(tmp_path):
    """Issue 40 item 8: the key hashed its reader files in a set's order, which follows
    PYTHONHASHSEED: 8 processes gave 5 keys for one file (re-parses, duplicate caches)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    data = tmp_path / "t.tsv"
    _write(data, LINES)
    code = ("import sys; from recjax.data.diskcache import cache_key; "
            "from recjax.data.sources import open_source; "
            "print(cache_key(open_source('criteo:' + sys.argv[1]), {'a': 1}))")
    keys = {subprocess.run([sys.executable, "-c", code, str(data)], cwd=ROOT, check=True,
                           capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
            for seed in range(6)}
    assert len(keys) == 1, keys


def _cached(tmp_path):
    f = tmp_path / "d.tsv"
    _write(f, LINES[:2] * 8)
    opts = {"hash_buckets": 97, "skip_bad_lines": False, "multi_hot_len": 20}
    make = lambda: DiskCachedSource(open_source(f"criteo:{f}", chunk_rows=8, **opts),
                                    str(tmp_path / "cache"), opts)
    _collect(make())
    return make


def _rewrite(d, name, change, fix_crc=False):
    """Change array file `name` of cache `d`; with `fix_crc` also its manifest checksum (an
    edit that knows the format: only the range checks can catch it)."""
    import json
    import zlib

    a = np.load(d / name)
    a = change(a.copy())
    np.save(d / name, a)
    if fix_crc:
        m = json.loads((d / "manifest.json").read_text())
        chunk, field = int(name.split(".")[0]), name.split(".")[1]
        m["arrays"][chunk][field][2] = f"{zlib.crc32(np.ascontiguousarray(a).view(np.uint8)):08x}"
        (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage,words", [
    # issue 40 item 4: labels of 5.0 and ids of 10^9 trained silently
    (lambda d: _rewrite(d, "000000.label.npy", lambda a: a + 5.0, fix_crc=True),
     "labels other than 0 and 1"),
    (lambda d: _rewrite(d, "000001.ids.npy", lambda a: a + 10**9, fix_crc=True),
     "ids outside their fields' vocabularies"),
    (lambda d: _rewrite(d, "000000.dense.npy", lambda a: a * np.nan, fix_crc=True),
     "non-finite dense values"),
    (lambda d: _rewrite(d, "000000.label.npy", lambda a: 1.0 - a), "does not match its checksum"),
    (lambda d: (d / "000000.dense.npy").unlink(), "000000.dense.npy cannot be read"),  # TypeError
    (lambda d: (d / "000001.ids.npy").write_bytes((d / "000001.ids.npy").read_bytes()[:100]),
     "000001.ids.npy cannot be read"),
    (lambda d: (d / "manifest.json").write_text('{"chunks": 2'), "manifest.json cannot be read"),
    (lambda d: (d / "manifest.json").write_text('{"chunks": 2, "stats": {}}'),
     "manifest.json is malformed"),
])
def test_a_damaged_or_edited_cache_is_refused_and_named(tmp_path, damage, words):
    make = _cached(tmp_path)
    src = make()
    damage(pathlib.Path(src.directory))
    with pytest.raises(DataError, match="parse cache of criteo:") as e:
        _collect(make())
    msg = str(e.value)
    assert words in msg and src.directory in msg and "Delete" in msg, msg


def test_a_multi_hot_cache_replays_without_a_false_alarm(tmp_path):
    from tests.conftest import ROOT

    path = ROOT.parent / "shared" / "data" / "taobao_ad_tiny" / "train_sample.csv"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    opts = {"hash_buckets": 97, "skip_bad_lines": False, "multi_hot_len": 5}
    make = lambda: DiskCachedSource(open_source(f"taobao:{path}", **opts),
                                    str(tmp_path / "cache"), opts)
    first = _collect(make())
    again = _collect(make())
    assert len(first) == len(again) and all(
        (x is None and y is None) or np.array_equal(x, y) for a, b in zip(first, again)
        for x, y in zip(a, b))
