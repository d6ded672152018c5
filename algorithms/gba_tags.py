"""GBA's per-id tags: the global step at which each embedding row was last updated.

Su et al., NeurIPS 2022, App. B Alg. 2 l. 19-21: the PS tags every id with the global step of
its last appearance in an update, and decays a row's gradient by that tag against the
gradient's token (``gba.embedding_staleness=id``); the same tags give the per-row staleness
the summary reports. A tag of -1 means "never updated".

Two layouts of one map ``(table, id) -> tag``:

* fixed tables (``embed.store=fixed``): ids are row indices below the table's size, so a tag
  is an entry of an array of that size;
* dynamic ids (``embed.store=lru``): ids are raw 64-bit values (Criteo's tokens, hashed
  strings), unbounded, so a tag lives in a hash map keyed by the id
  (`recjax.embeddings.dynamic.IdIndex`), which grows as new ids are tagged. A tag is kept
  for every id ever updated, resident in the store or not: the paper's tag belongs to the id
  (an evicted id that comes back keeps its history). Cost: ~88 bytes per distinct id updated
  (the map's 4 positions of 16 bytes, its position index and the tag), beside the store's own
  rows; the summary reports the count (``tagged_ids``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from recjax.embeddings.dynamic import IdIndex

_FIRST_IDS = 1024  # ids a raw map holds at first; it doubles as ids are tagged


class _RawTags:
    """Tags of one table keyed by raw int64 ids; the map grows by doubling."""

    def __init__(self, rows: int = _FIRST_IDS):
        self.index = IdIndex(rows)
        self.keys = np.zeros(rows, np.int64)  # slot -> id (to rebuild a larger map)
        self.tags = np.full(rows, -1, np.int64)
        self.size = 0

    def get(self, ids: np.ndarray) -> np.ndarray:
        slots = self.index.lookup(ids)
        return np.where(slots >= 0, self.tags[np.maximum(slots, 0)], -1)

    def set(self, ids: np.ndarray, tag: int) -> None:
        """Tag unique `ids`."""
        slots = self.index.lookup(ids)
        new = np.flatnonzero(slots < 0)
        if new.size:
            self._reserve(self.size + new.size)
            fresh = np.arange(self.size, self.size + new.size, dtype=np.int64)
            self.index.insert(ids[new], fresh)
            self.keys[fresh] = ids[new]
            slots[new] = fresh
            self.size += new.size
        self.tags[slots] = tag

    def _reserve(self, n: int) -> None:
        rows = self.index.rows
        if n <= rows:
            return
        while rows < n:
            rows *= 2
        keys, tags, size = self.keys[:self.size], self.tags[:self.size], self.size
        self.__init__(rows)
        self.index.insert(keys, np.arange(size, dtype=np.int64))
        self.keys[:size], self.tags[:size], self.size = keys, tags, size


class RowTags:
    """``(table, id) -> tag`` for every table of a run (see the module docstring).

    Args:
      tables: ``(name, num_embeddings)`` of each table.
      raw_ids: ids are raw 64-bit values (``embed.store=lru``), not row indices.
    """

    def __init__(self, tables: Iterable[tuple[str, int]], raw_ids: bool):
        self.raw_ids = raw_ids
        self._sizes = dict(tables)
        self.reset()

    def reset(self) -> None:
        """Every id untagged (-1)."""
        self._maps = {name: _RawTags() if self.raw_ids else np.full(n, -1, np.int64)
                      for name, n in self._sizes.items()}

    def get(self, name: str, ids: np.ndarray) -> np.ndarray:
        """i64[n] tag of each of `ids` (repeats allowed), -1 where never updated."""
        ids = np.asarray(ids, np.int64)
        m = self._maps[name]
        return m.get(ids) if self.raw_ids else m[ids]

    def set(self, name: str, ids: np.ndarray, tag: int) -> None:
        """Tag the unique `ids` of table `name` with global step `tag`."""
        ids = np.asarray(ids, np.int64)
        m = self._maps[name]
        if self.raw_ids:
            m.set(ids, tag)
        else:
            m[ids] = tag

    def count(self) -> int:
        """How many (table, id) pairs carry a tag."""
        if self.raw_ids:
            return sum(m.size for m in self._maps.values())
        return sum(int(np.count_nonzero(m >= 0)) for m in self._maps.values())
