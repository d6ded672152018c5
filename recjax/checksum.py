"""A checksum of an array that does not depend on how the array is split over devices or
processes: what a checkpoint written by several processes records, and what a restore onto
another layout (another process count, mesh, or one device) checks.

    wsum32(x) = sum_i  w_i * u_i   (mod 2^32),   w_i = 2 i + 1   (mod 2^32)

over the array's 32-bit words u_i in C order (a 4-byte dtype: each element's bits; a narrower
dtype: each element's bits zero-extended; an 8-byte one: its two words). A sum is the same
whatever the partition and the order of the addition (integer addition mod 2^32), so every
device sums its own block with the global positions of its words and one all-reduce of a
uint32 gives the whole array's checksum: no array travels to one host. The weights are odd,
so a flipped bit (u_i changes by +-2^b, b < 32) always changes the sum, and words moved to
other positions change it unless the moves happen to cancel. CRC-32 (`recjax.checkpoint`)
needs the bytes in order in one place, so a single process's checkpoints keep it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

KIND = "wsum32"


def _words(x: jax.Array) -> jax.Array:
    """The array's 32-bit words, u32[...] (8-byte dtypes: u32[..., 2])."""
    size = jnp.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size in (1, 2):
        narrow = jnp.uint8 if size == 1 else jnp.uint16
        return jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8 bytes -> [..., 2]


def _one(x: jax.Array) -> jax.Array:
    u = _words(x)
    flat = jnp.zeros(u.shape, jnp.uint32)  # the C-order position of every word, mod 2^32
    stride = 1
    for d in reversed(range(u.ndim)):
        flat = flat + jax.lax.broadcasted_iota(jnp.uint32, u.shape, d) * jnp.uint32(stride % 2**32)
        stride *= u.shape[d]
    return jnp.sum(u * (flat * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)


@functools.cache
def _jitted(n_leaves: int):
    del n_leaves  # one compiled function per tree size keeps the cache small
    return jax.jit(lambda leaves: jnp.stack([_one(x) for x in leaves]) if leaves
                   else jnp.zeros((0,), jnp.uint32))


def wsum32(tree) -> list[str]:
    """`wsum32` (8 hex digits) of every array of `tree`, in leaf order; the arrays may be
    global arrays split over processes (one all-reduce each, inside one jitted call)."""
    leaves = jax.tree.leaves(tree)
    out = _jitted(len(leaves))(leaves)
    host = np.asarray(out.addressable_data(0)) if isinstance(out, jax.Array) else np.asarray(out)
    return [f"{int(s):08x}" for s in host]


def wsum32_numpy(x: np.ndarray) -> str:
    """The same checksum of a host array with numpy alone (the reference the tests use)."""
    x = np.ascontiguousarray(x)
    if x.dtype == np.bool_:
        u = x.astype(np.uint32).reshape(-1)
    elif x.dtype.itemsize in (1, 2):
        u = x.view(f"u{x.dtype.itemsize}").astype(np.uint32).reshape(-1)
    else:
        u = x.reshape(-1).view(np.uint32)
    w = (np.arange(u.size, dtype=np.uint64) * 2 + 1) % 2**32
    return f"{int((u.astype(np.uint64) * w % 2**32).sum() % 2**32):08x}"
