"""Parse a text source once into .npy files; later passes and later runs memory-map them.

Convergence studies run many algorithms on the same file. Parsing Criteo costs ~10 us a line
(recjax/data/readers.py), a large share of a 2-core machine that training also needs; a
memory-mapped replay costs almost nothing. The cache is keyed by the file's absolute path, size
and mtime, the schema and the reader options, so a changed file or option never replays stale
arrays. It is written to a temporary directory and renamed into place only after a complete pass,
so an interrupted first pass leaves no half cache behind.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk
from recjax.data import hashing, readers
from recjax.data.base import DataSource, ReadStats

FORMAT = 1  # bump when the layout of a cache directory changes
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

    @property
    def stats(self) -> ReadStats:
        if self._stats is None and self.is_cached:
            with open(self._manifest) as f:
                self._stats = _stats_from(json.load(f)["stats"])
        return self._stats if self._stats is not None else self.source.stats

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
        with open(self._manifest) as f:
            manifest = json.load(f)
        for i in range(manifest["chunks"]):
            arrays = []
            for field in _FIELDS:
                p = os.path.join(self.directory, f"{i:06d}.{field}.npy")
                arrays.append(np.load(p, mmap_mode="r") if os.path.exists(p) else None)
            yield Chunk(*arrays)

    def _write(self) -> Iterator[Chunk]:
        parent = os.path.dirname(self.directory)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=parent, prefix=".partial-")
        n = 0
        try:
            for chunk in self.source.chunks():
                for field, a in zip(_FIELDS, chunk):
                    if a is not None:
                        np.save(os.path.join(tmp, f"{n:06d}.{field}.npy"), a)
                n += 1
                yield chunk
            stats = self.source.stats
            with open(os.path.join(tmp, "manifest.json"), "w") as f:
                json.dump({"chunks": n, "name": self.name, "stats": _stats_dict(stats)}, f)
            try:
                os.rename(tmp, self.directory)
            except OSError:  # another process finished first: its cache is as good as ours
                shutil.rmtree(tmp, ignore_errors=True)
            self._stats = stats
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)


def _stats_dict(s: ReadStats) -> dict:
    return {k: (dict(v) if isinstance(v, collections.Counter) else v)
            for k, v in vars(s).items()}


def _stats_from(d: dict) -> ReadStats:
    s = ReadStats()
    for k, v in d.items():
        setattr(s, k, collections.Counter(v) if isinstance(getattr(s, k, None), collections.Counter)
                else v)
    return s
