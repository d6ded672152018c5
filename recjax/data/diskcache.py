"""Parse a text source once into .npy files; later passes and later runs memory-map them.

Convergence studies run many algorithms on the same file. Parsing Criteo costs ~10 us a line
(recjax/data/readers.py), a large share of a 2-core machine that training also needs; a
memory-mapped replay costs almost nothing. The cache is keyed by the file's absolute path, size
and mtime, the schema and the reader options, so a changed file or option never replays stale
arrays. It is written to a temporary directory and renamed into place only after a complete pass,
so an interrupted first pass leaves no half cache behind.

A cache is checked like an input before a process first replays it: its manifest names every
array with its shape, dtype and CRC-32, and the arrays must match (a file cut, emptied, edited
or gone), hold labels in {0, 1}, ids in ``[0, vocab_size)`` of their field and finite dense
values. A cache that fails is named with what is wrong and what to do (delete it: the next run
parses the file again); none is replayed unchecked.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk
from recjax.data import hashing, readers
from recjax.data.base import DataError, DataSource, ReadStats

FORMAT = 2  # bump when the layout of a cache directory changes (2: checksums in the manifest)
_FIELDS = Chunk._fields


def cache_key(source: DataSource, options: dict) -> str:
    """Stable id of (file, its size and mtime, schema, reader options, cache format)."""
    path = os.path.abspath(getattr(source, "path", source.name))
    st = os.stat(path)
    # The reader's code is part of the key: a changed parser or hash never replays old arrays.
    code = hashlib.sha256()
    # sorted: a set's order follows PYTHONHASHSEED, and so did the key (8 processes, 5 keys)
    for mod in sorted({inspect.getsourcefile(type(source)), readers.__file__, hashing.__file__}
                      - {None}):
        if mod:
            with open(mod, "rb") as f:
                code.update(f.read())
    blob = json.dumps({"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                       "spec": repr(source.spec), "options": options, "format": FORMAT,
                       "code": code.hexdigest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class DiskCachedSource:
    """A `DataSource` replaying `source` from ``cache_dir/<kind>-<file>-<key>/`` once written.

    Attributes:
      name, spec: those of the wrapped source.
      stats: of the pass that wrote the cache (kept in its manifest).
      directory: where this source's cache lives.
    """

    def __init__(self, source: DataSource, cache_dir: str, options: dict):
        self.source, self.name, self.spec = source, source.name, source.spec
        base = os.path.basename(getattr(source, "path", "data"))
        kind = source.name.split(":", 1)[0]
        self.directory = os.path.join(cache_dir, f"{kind}-{base}-{cache_key(source, options)}")
        self._stats: ReadStats | None = None
        self._checked = False  # this process verified the cache (`_check`)

    @property
    def stats(self) -> ReadStats:
        if self._stats is None and self.is_cached:
            self._stats = _stats_from(self._read_manifest()["stats"])
        return self._stats if self._stats is not None else self.source.stats

    def _error(self, problem: str) -> DataError:
        return DataError(self.directory, None, None, f"the parse cache of {self.name} is "
                         f"unusable: {problem}", f"Delete {self.directory}; the next run parses "
                         "the file again (or set --data.cache_dir to another folder)")

    def _read_manifest(self) -> dict:
        try:
            with open(self._manifest) as f:
                m = json.load(f)
        except (OSError, ValueError) as e:
            raise self._error(f"its manifest.json cannot be read ({e})") from None
        if (not isinstance(m, dict) or not isinstance(m.get("chunks"), int)
                or not isinstance(m.get("stats"), dict) or not isinstance(m.get("arrays"), list)
                or len(m["arrays"]) != m["chunks"]):
            raise self._error("its manifest.json is malformed (not written by this version, or "
                              "edited)")
        return m

    def _check(self, manifest: dict) -> None:
        """Every array as the manifest records it, and in range (see the module docstring)."""
        vocab = np.array([f.vocab_size for f in self.spec.fields], np.int64)
        for i, rec in enumerate(manifest["arrays"]):
            got = {}
            for field, want in rec.items():
                p = os.path.join(self.directory, f"{i:06d}.{field}.npy")
                try:
                    a = np.load(p, mmap_mode="r")
                except (OSError, ValueError) as e:
                    raise self._error(f"{os.path.basename(p)} cannot be read ({e})") from None
                if [list(a.shape), str(a.dtype)] != want[:2]:
                    raise self._error(f"{os.path.basename(p)} has shape {a.shape} and dtype "
                                      f"{a.dtype}, the manifest {tuple(want[0])} and {want[1]}")
                if _crc(a) != want[2]:
                    raise self._error(f"{os.path.basename(p)} does not match its checksum "
                                      "(damaged or edited)")
                got[field] = a
            label, ids, dense = got.get("label"), got.get("ids"), got.get("dense")
            if label is None or ids is None:
                raise self._error(f"chunk {i} lacks its labels or ids")
            if not np.isin(label, (0.0, 1.0)).all():
                raise self._error(f"chunk {i} holds labels other than 0 and 1")
            if ids.size and ((ids < 0).any() or (ids >= vocab[None, :, None]).any()):
                raise self._error(f"chunk {i} holds ids outside their fields' vocabularies")
            if dense is not None and not np.isfinite(dense).all():
                raise self._error(f"chunk {i} holds non-finite dense values")

    @property
    def _manifest(self) -> str:
        return os.path.join(self.directory, "manifest.json")

    @property
    def is_cached(self) -> bool:
        return os.path.exists(self._manifest)

    def chunks(self) -> Iterator[Chunk]:
        if self.is_cached:
            yield from self._replay()
        else:
            yield from self._write()

    def _replay(self) -> Iterator[Chunk]:
        manifest = self._read_manifest()
        if not self._checked:
            self._check(manifest)
            self._checked = True
        for i, rec in enumerate(manifest["arrays"]):
            yield Chunk(*(np.load(os.path.join(self.directory, f"{i:06d}.{field}.npy"),
                                  mmap_mode="r") if field in rec else None for field in _FIELDS))

    def _write(self) -> Iterator[Chunk]:
        parent = os.path.dirname(self.directory)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=parent, prefix=".partial-")
        n, records = 0, []
        try:
            for chunk in self.source.chunks():
                rec = {}
                for field, a in zip(_FIELDS, chunk):
                    if a is not None:
                        np.save(os.path.join(tmp, f"{n:06d}.{field}.npy"), a)
                        rec[field] = [list(a.shape), str(a.dtype), _crc(a)]
                records.append(rec)
                n += 1
                yield chunk
            stats = self.source.stats
            with open(os.path.join(tmp, "manifest.json"), "w") as f:
                json.dump({"chunks": n, "name": self.name, "stats": _stats_dict(stats),
                           "arrays": records}, f)
            try:
                os.rename(tmp, self.directory)
            except OSError:  # another process finished first: its cache is as good as ours
                shutil.rmtree(tmp, ignore_errors=True)
            self._stats = stats
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)


def _crc(a: np.ndarray) -> str:
    return f"{zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8)):08x}"


def _stats_dict(s: ReadStats) -> dict:
    return {k: (dict(v) if isinstance(v, collections.Counter) else v)
            for k, v in vars(s).items()}


def _stats_from(d: dict) -> ReadStats:
    s = ReadStats()
    for k, v in d.items():
        setattr(s, k, collections.Counter(v) if isinstance(getattr(s, k, None), collections.Counter)
                else v)
    return s
