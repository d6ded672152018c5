"""A Ray run's checkpoint parts (`recjax.checkpoint_parts`): each embedding PS shard's actor
writes its own tables and slots into the step and reads them back for the check, so no table
passes through the driver on a save (issue 38).

`PartHolder` is the actor's side (`ray_ps.ShardServer` inherits it); `ShardPart` the driver's
(`recjax.checkpoint_parts.Part`), made by `parts` for each shard with tables. The directory
must be one every shard's host sees (on a cluster: a shared filesystem, as orbax's multi-host
checkpoints need).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from recjax import checkpoint_holder, checkpoint_parts


class PartHolder:
    """The part calls of a shard actor whose `shard` is a `ps.EmbeddingShard`."""

    shard: Any

    def _tree(self) -> dict:
        return checkpoint_parts.tree(self.shard.tables, self.shard.slots)

    def part_record(self) -> tuple[list, list]:
        return checkpoint_holder.record(self._tree())

    def write_part(self, directory: str) -> None:
        checkpoint_holder.write(directory, self._tree())

    def check_part(self, directory: str, rows: list) -> str | None:
        return checkpoint_holder.check(directory, self._tree(), rows)


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
