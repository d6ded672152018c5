"""Host arrays <-> global arrays on a mesh, the same code for one process and for many.

Every process holds the same host values (the trainer's deterministic batch stream, the seeded
initial state), so a global array is assembled from each process's own block:
`jax.make_array_from_process_local_data` with the block this process's devices cover.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def _process_block(sharding: NamedSharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The bounding box of the blocks held by this process's devices."""
    idx = list(sharding.addressable_devices_indices_map(shape).values())
    box = []
    for d, n in enumerate(shape):
        starts = [ix[d].indices(n)[0] if d < len(ix) else 0 for ix in idx]
        stops = [ix[d].indices(n)[1] if d < len(ix) else n for ix in idx]
        box.append(slice(min(starts), max(stops)))
    return tuple(box)


def put(x, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
    """Host value -> global array laid out as `spec` (each process passes the same value)."""
    x = np.asarray(x)
    sharding = NamedSharding(mesh, spec)
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    local = x[_process_block(sharding, x.shape)] if x.ndim else x
    return jax.make_array_from_process_local_data(sharding, local, x.shape)


def put_tree(tree, mesh: Mesh, specs):
    """`put` over a pytree; `specs` is a pytree of PartitionSpecs (a prefix of `tree`)."""
    return jax.tree.map(lambda s, x: jax.tree.map(lambda leaf: put(leaf, mesh, s), x), specs, tree,
                        is_leaf=lambda s: isinstance(s, PartitionSpec))


def fetch(tree):
    """Arrays -> host numpy, the whole global array in every process (a collective if it spans
    several processes; process-local arrays are read as they are)."""

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)
