"""The holder's side of checkpoint parts (`recjax.checkpoint_parts`), run in the process that
holds the tables (a Ray shard actor): the part's integrity rows, its write into the staging
directory, its read-back for the check of a save, and the read of its tables for a restore
(`load`).
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from recjax.checkpoint import (
    _check_sums,
    _Damaged,
    _first_line,
    _orbax_quiet,
    array_specs,
    checksums,
    host_sums,
)
from recjax.checkpoint_parts import Source, restore_arg
from recjax.train.contract import non_finite_leaves


def record(part_tree: dict) -> tuple[list[list], list[str]]:
    """``(integrity rows, names of non-finite leaves)`` of a holder's part tree."""
    rows = [[*spec, crc] for spec, crc in zip(array_specs(part_tree), checksums(part_tree))]
    return rows, non_finite_leaves(part_tree)


def write(directory: str, part_tree: dict) -> None:
    """Write a holder's part tree as a standard orbax item into `directory` (its staging
    directory, moved into the step by `PartHandler`)."""
    shutil.rmtree(directory, ignore_errors=True)  # a retry after the holder was restarted
    path = epath.Path(directory)
    handler = ocp.StandardCheckpointHandler()
    with _orbax_quiet():
        handler.save(path, args=ocp.args.StandardSave(part_tree))
        handler.finalize(path)
    handler.close()


def check(directory: str, like: dict, rows: list[list]) -> str | None:
    """Read the part item in `directory` back (shapes of `like`, onto the CPU): None if its
    sums match `rows`, else why."""
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                            like)
    handler = ocp.StandardCheckpointHandler()
    try:
        got = handler.restore(epath.Path(directory), args=ocp.args.StandardRestore(abstract))
        _check_sums(rows, got, "the part's ", "crc32", host_sums)
    except _Damaged as e:
        return str(e)
    except Exception as e:  # unreadable files
        return f"an array file of {epath.Path(directory).name} cannot be read: {_first_line(e)}"
    finally:
        handler.close()
    return None


def load(sources: list[Source]) -> tuple[dict, dict]:
    """``(tables, slots)`` read from `sources` (`recjax.checkpoint_parts.locate`) onto the host,
    each array checked against its row's CRC-32.

    Raises:
      _Damaged: an array's bytes differ from its row, or its files cannot be read.
    """
    tables, slots = {}, {}
    for src in sources:
        like = src.like
        # orbax's partial restore takes no empty node: a table's () slots are `like`'s own
        item = {k: {n: v for n, v in like[k].items() if jax.tree.leaves(v)} for k in like}
        item = {k: v for k, v in item.items() if v}
        name = epath.Path(src.directory).name
        handler = ocp.PyTreeCheckpointHandler()
        try:
            got = handler.restore(epath.Path(src.directory), args=ocp.args.PyTreeRestore(
                item, restore_args=jax.tree.map(restore_arg, item), partial_restore=True))
        except Exception as e:
            raise _Damaged(f"an array file of {name} cannot be read: {_first_line(e)}") from e
        finally:
            handler.close()
        got = {k: {**like[k], **got.get(k, {})} for k in like}
        _check_sums([[p, *src.rows[p][1:]] for p, _, _ in array_specs(got)], got, f"{name}: ")
        tables.update(got["tables"])
        slots.update(got["slots"])
    return tables, slots
