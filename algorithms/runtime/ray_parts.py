"""A Ray run's checkpoint parts (`recjax.checkpoint_parts`): each embedding PS shard's actor
writes its own tables and slots into the step and reads them back for the check, and on a
resume reads its own tables of the step (`ShardLoader`), so no table passes through the driver
on a save or a resume (issue 38).

`PartHolder` is the actor's side (`ray_ps.ShardServer` inherits it); `ShardPart` the driver's
(`recjax.checkpoint_parts.Part`), made by `parts` for each shard with tables; `ShardLoader` the
driver's `recjax.checkpoint_parts.Loader`. The directory must be one every shard's host sees
(on a cluster: a shared filesystem, as orbax's multi-host checkpoints need).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from algorithms.runtime import ps as ps_lib
from recjax import checkpoint_holder, checkpoint_parts


class PartHolder:
    """The part calls of a shard actor whose `shard` is a `ps.EmbeddingShard`, or with `lru` a
    `ps.LruShard` (each store as the `TrainState` entries `ps.lru_state` makes of it)."""

    shard: Any
    lru: bool

    def _tree(self) -> dict:
        if not self.lru:
            return checkpoint_parts.tree(self.shard.tables, self.shard.slots)
        tables, slots = {}, {}
        for k, snap in self.shard.snapshot()[0].items():
            tables[k], slots[k] = ps_lib.lru_state(snap)
        return checkpoint_parts.tree(tables, slots)

    def part_shapes(self) -> dict:
        """The shapes and dtypes of this shard's part tree (an LRU store's: what a
        checkpoint's ``like`` needs, without its arrays leaving this process)."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                            self._tree())

    def part_record(self) -> tuple[list, list]:
        return checkpoint_holder.record(self._tree())

    def write_part(self, directory: str) -> None:
        checkpoint_holder.write(directory, self._tree())

    def check_part(self, directory: str, rows: list) -> str | None:
        return checkpoint_holder.check(directory, self._tree(), rows)

    def load_part(self, sources: list) -> str | None:
        """Take this shard's tables and slots from a step (`checkpoint_holder.load`); None, or
        why not (its files damaged: the shard keeps what it had)."""
        from recjax.checkpoint import _Damaged

        try:
            tables, slots = checkpoint_holder.load(sources)
        except _Damaged as e:
            return str(e)
        if self.lru:
            self.shard.restore(({k: ps_lib.lru_snapshot(tables[k], slots[k]) for k in tables},
                                {}, self.shard.step))
            return None
        # the shard updates its rows in place: arrays it owns and may write
        self.shard.tables = {k: np.require(v, np.float32, ["C", "W"]) for k, v in tables.items()}
        self.shard.slots = {k: jax.tree.map(lambda a: np.require(a, requirements=["C", "W"]), v)
                            for k, v in slots.items()}
        return None


@dataclasses.dataclass
class ShardPart:
    """A PS shard's part of a checkpoint, driven from the driver through its `ShardProxy`."""

    shard: Any  # ray_ps.ShardProxy
    record: list

    @property
    def item(self) -> str:
        return f"{checkpoint_parts.PREFIX}{self.shard.index}"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.shard.names)

    def write(self, directory: str):
        sent = self.shard.submit("write_part", directory)
        return lambda: self.shard.result(sent, "write_part", directory)

    def verify(self, directory: str) -> str | None:
        return self.shard.call("check_part", directory, self.record)


def parts(shards: list) -> list[ShardPart]:
    """A part per shard proxy with tables, its record taken now (all asked at once).

    Raises:
      DivergedError: a shard holds a NaN or infinite value (nothing is saved).
    """
    from recjax.train.contract import DivergedError

    sent = [(sh, sh.submit("part_record")) for sh in shards if sh.names]
    out = []
    for sh, ref in sent:
        rows, bad = sh.result(ref, "part_record")
        if bad:
            raise DivergedError(f"embedding PS shard {sh.index} holds NaN or infinite values "
                                f"in {', '.join(bad[:4])}; the run stops without saving it. "
                                "Lower the learning rate (--sparse.lr)")
        out.append(ShardPart(sh, rows))
    return out


@dataclasses.dataclass
class ShardLoader:
    """The PS shards as a checkpoint's `recjax.checkpoint_parts.Loader`: each shard's actor
    reads its own tables of the step, all at once (a shard that dies meanwhile is restarted
    and asked again by its proxy; a restart after this goes back to what was read)."""

    shards: list  # ray_ps.ShardProxy

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for sh in self.shards for n in sh.names)

    def load(self, sources) -> str | None:
        sent = [(sh, sh.submit("load_part", src), src)
                for sh in self.shards if sh.names for src in [sources(sh.names)]]
        whys = [(sh.index, sh.result(ref, "load_part", src)) for sh, ref, src in sent]
        return next((f"PS shard {s}: {why}" for s, why in whys if why is not None), None)


def shapes(shards: list) -> tuple[dict, dict]:
    """``(tables, slots)`` of every shard's part tree as shapes and dtypes (all asked at once)."""
    sent = [(sh, sh.submit("part_shapes")) for sh in shards if sh.names]
    tables, slots = {}, {}
    for sh, ref in sent:
        got = sh.result(ref, "part_shapes")
        tables.update(got["tables"])
        slots.update(got["slots"])
    return tables, slots
