"""Checkpoint parts: tables written by the process that holds them, inside the step's commit.

A PS whose tables live in other processes (the Ray backend's shard actors) would otherwise
gather every table into the process that saves (issue 38: the driver of a ``dlrm_kaggle`` run
peaked at 4 GB for a 1 GB table set). With parts, each holder writes its own tables and their
optimizer slots as one orbax item of the step (``tables_<i>``: the tree ``{"tables": {name:
array}, "slots": {name: slots}}``, written by orbax's standard handler, so any process reads
it back with a standard restore), and the step's ``state`` item holds the other arrays.

The parts go into the same commit as the rest: every holder first writes its part, all at
once, into a staging directory (``<step>.orbax-checkpoint-tmp-parts/<item>``, which a later run
removes as a stale temporary if the save never ends); then each part is an item of the step's
``ocp.args.Composite`` whose handler (`PartHandler`) moves the staged part into the item's
temporary directory, and orbax renames the whole step into place once every item is there. A
holder that fails fails the save before orbax writes anything; a kill at any moment leaves no
step with parts missing. The integrity record of the step's metadata
lists each part (``integrity["parts"]``: item, table names, and the same ``[path, shape,
dtype, crc32]`` rows as the state's record, computed by the holder); `recjax.checkpoint`
checks them on every restore and merges the parts into the restored `TrainState`, so a
checkpoint with parts restores wherever one without does (threads, the virtual clock, the SPMD
trainers, a multi-process run) and a step of either kind starts the other.

The holder's side is `recjax.checkpoint_holder` (`record`, `write`, `check`, called in its
own process); the saving process's side is a `Part` per holder, passed to
`Checkpointer.save`. This module imports nothing of recjax: `recjax.checkpoint` imports it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Protocol

import orbax.checkpoint as ocp

PREFIX = "tables_"  # the items of a step that are parts: tables_0, tables_1, ...


class Part(Protocol):
    """One holder's tables, as the saving process sees them (e.g. `ray_ps.ShardPart`).

    Attributes:
      item: the step's item name (``tables_<i>``).
      names: the tables (and their slots) the part holds.
      record: the integrity rows of the part's tree (`record`), taken before the save.
    """

    item: str
    names: tuple[str, ...]
    record: list[list]

    def write(self, directory: str) -> Callable[[], None]:
        """Have the holder start writing its tree into `directory` (`write`); returns the
        wait for it (which raises if the write failed)."""

    def verify(self, directory: str) -> str | None:
        """Have the holder read `directory` back: None if its sums match `record`, else why."""


class PartHandler(ocp.StandardCheckpointHandler):
    """A part's save moves the holder's staged item into the item's temporary directory; its
    restore is the standard one (the holder wrote a standard item)."""

    async def async_save(self, directory, args):  # noqa: D102 (orbax's interface)
        target = str(directory)
        os.rmdir(target)  # made empty by orbax; the staged item takes its place
        os.rename(args.staged, target)
        return []

    def finalize(self, directory) -> None:  # the holder finalized its own write
        pass


@ocp.args.register_with_handler(PartHandler, for_save=True)
@dataclasses.dataclass
class PartSave(ocp.args.CheckpointArgs):
    staged: str  # the directory the holder wrote the part into


@ocp.args.register_with_handler(PartHandler, for_restore=True)
@dataclasses.dataclass
class PartRestore(ocp.args.StandardRestore):
    """A standard restore of a part item (one handler per item name within a manager)."""


def tree(tables: dict, slots: dict) -> dict:
    """The tree a part stores: its tables and their optimizer slots."""
    return {"tables": dict(tables), "slots": dict(slots)}


def split(like: Any, names) -> tuple[Any, dict]:
    """``(like without the tables `names` and their slots, their part tree)`` of a
    `TrainState`-shaped `like`."""
    names = set(names)
    rest = like._replace(tables={k: v for k, v in like.tables.items() if k not in names},
                         slots={k: v for k, v in like.slots.items() if k not in names})
    return rest, tree({k: like.tables[k] for k in like.tables if k in names},
                      {k: like.slots[k] for k in like.slots if k in names})


def merge(state: Any, parts: list[dict], like: Any) -> Any:
    """`state` with every part's tables and slots put back, in `like`'s table order."""
    tables, slots = dict(state.tables), dict(state.slots)
    for p in parts:
        tables.update(p["tables"])
        slots.update(p["slots"])
    return state._replace(tables={k: tables[k] for k in like.tables},
                          slots={k: slots[k] for k in like.slots})
