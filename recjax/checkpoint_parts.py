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

The other way, a restore can leave the tables to their holders as well: `Checkpointer.restore`
with a `Loader` reads and checks every array but the tables, and has each holder read its own
tables (with their slots) from wherever the step keeps them (`locate`: a part, whatever its
holder was, or the ``state`` item of a checkpoint saved whole) and check them against the
step's record. A holder that finds damage fails the step as a bad CRC does, and an older step
is tried.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

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


def array_specs(tree: Any) -> list[list]:
    """``[path, shape, dtype]`` of every array of `tree`, in leaf order (the first three
    columns of an integrity record's rows)."""
    return [[jax.tree_util.keystr(path), list(x.shape), str(x.dtype)]
            for path, x in jax.tree_util.tree_leaves_with_path(tree)]


@dataclasses.dataclass(frozen=True)
class Source:
    """Some tables of a step as a holder reads them (`Loader`): the item's directory, the
    part tree of those tables and their slots as shapes and dtypes (`tree` form), and their
    integrity rows by path in that form."""

    directory: str
    like: dict
    rows: dict[str, list]


class Loader(Protocol):
    """Holders that read their own tables of a step (`Checkpointer.restore`'s ``loader``), so
    the restoring process reads none (e.g. ``ray_parts.ShardLoader``: the Ray PS shards).

    Attributes:
      names: the tables the holders take, with their slots: every table of the state.
    """

    names: tuple[str, ...]

    def load(self, sources: Callable[[Sequence[str]], list[Source]]) -> str | None:
        """Have each holder read its tables from ``sources(its table names)`` and check them
        (`recjax.checkpoint_holder.load`); None if every one matched, else why not: the
        step is then damaged, and the holders read an older one next."""


def _part_path(path: str) -> str:
    """A state record's path of a table or its slots (``.tables['a']``) in `tree` form
    (``['tables']['a']``)."""
    field, _, rest = path[1:].partition("[")
    return f"['{field}'][{rest}"


def locate(like: Any, names, state_rows: list[list], parts: list[dict], step_dir: str):
    """Where a step keeps the tables `names` of the `TrainState`-shaped `like` and their slots:
    ``(like without them, the state item's rows without them, whether the state item holds
    some of them, sources)``, where ``sources(some names)`` is the `Source` list a holder of
    those tables reads.

    Raises:
      KeyError: naming a table (or slot) whose arrays the step lacks or has in another
        shape or dtype (the caller's mismatch: another model or data schema).
    """
    rest, held = split(like, names)
    where: dict[str, tuple[str, list]] = {}  # tree path -> (item, its integrity row)
    kept = []
    for r in state_rows:
        if r[0].startswith((".tables[", ".slots[")):
            where[_part_path(r[0])] = ("state", r)
        else:
            kept.append(r)
    for p in parts:
        where.update({r[0]: (p["item"], r) for r in p["arrays"]})
    for path, shape, dtype in array_specs(held):
        if path not in where or where[path][1][1:3] != [shape, dtype]:
            saved = where.get(path, (None, [path, "missing", ""]))[1]
            raise KeyError(f"{path}: checkpoint {saved[2]}{saved[1]}, this run {dtype}{shape}")
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), held)

    def pick(some) -> dict:
        return tree({n: shapes["tables"][n] for n in some}, {n: shapes["slots"][n] for n in some})

    def sources(some) -> list[Source]:
        by_item: dict[str, list] = {}
        for n in some:  # a table's slots are in its table's item
            path = jax.tree_util.keystr((jax.tree_util.DictKey("tables"), jax.tree_util.DictKey(n)))
            by_item.setdefault(where[path][0], []).append(n)
        out = []
        for item, group in by_item.items():
            sub = pick(group)
            out.append(Source(os.path.join(step_dir, item), sub,
                              {p: where[p][1] for p, _, _ in array_specs(sub)}))
        return out

    return rest, kept, len(kept) < len(state_rows), sources


def read_rest(directory: str, like: Any) -> Any:
    """The state item in `directory` read to `like` (a `TrainState` without some tables): every
    array but those tables, by orbax's partial restore (`locate`: a checkpoint saved whole
    whose tables their holders read)."""
    fields = {f: v for f in like._fields if jax.tree.leaves(v := getattr(like, f))}
    handler = ocp.PyTreeCheckpointHandler()
    try:
        got = handler.restore(epath.Path(directory), args=ocp.args.PyTreeRestore(
            fields, restore_args=jax.tree.map(restore_arg, fields), partial_restore=True))
    finally:
        handler.close()
    return like._replace(**got)


def restore_arg(x: Any) -> ocp.RestoreArgs:
    """How orbax restores a leaf shaped as `x`: a jax array where `x` has a sharding, else a
    numpy array (a 64-bit leaf, or a holder's host copy)."""
    sharding = getattr(x, "sharding", None)
    if sharding is not None:
        return ocp.ArrayRestoreArgs(sharding=sharding, global_shape=x.shape, dtype=x.dtype)
    return ocp.RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
