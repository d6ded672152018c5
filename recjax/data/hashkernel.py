"""A compiled kernel (numba) of `recjax.data.hashing.hash_keys`: the same buckets, one fused loop.

``hash_keys`` in numpy makes 13 passes over a block of keys (~3.5 ns an id on the 2-core box);
here the splitmix64 mix and the modulo are one loop that LLVM vectorises (~0.6 ns an id, ~1 ns
with the strided write into ``ids[:, f, 0]``; docs/performance.md). The modulo by a divisor
known only at run time is a multiply-high and one correction instead of a 64-bit division:

    m = min(floor(2**64 / d), 2**64 - 1)        (so m >= 2**64 / d - 1, and m <= 2**64 / d)
    q = floor(z * m / 2**64)                    (64 x 64 -> high 64 bits, from 32-bit halves)

z * m / 2**64 lies in (z/d - 1, z/d], so q is floor(z/d) or one less, ``r = z - q*d`` lies in
[0, 2d), and one conditional subtraction gives ``z % d`` exactly, for every z < 2**64 and
1 <= d < 2**64 (d = 1 included: m = 2**64 - 1). The tests compare it with numpy's ``%`` over
hypothesis-drawn keys, salts and divisors.

numba is imported only here, and only when a hashed id is first needed (`kernel`); without it
`hash_keys` runs its numpy loop, which computes the same values (the tests hold both to
``mix64(salt << 32 | key) % buckets``).
"""

from __future__ import annotations

import functools

import numpy as np

_LOW = 0xFFFFFFFF


def divisor_magic(d: int) -> int:
    """The multiplier ``m`` of the modulo above for divisor ``d`` (module docstring)."""
    if not 1 <= d < 2**64:
        raise ValueError(f"divisor must be in [1, 2**64), got {d}")
    return min(2**64 // d, 2**64 - 1)


@functools.cache
def kernel():
    """``fill(keys, salt, d, m, out)``, the compiled loop, or None when numba is not installed.

    ``fill`` writes ``mix64(salt << 32 | keys[i]) % d`` to ``out[i]`` for 1-D ``keys`` and
    ``out`` of equal size (any integer dtypes; ``keys`` as u64 by two's complement, as numpy's
    unsafe cast), ``m = divisor_magic(d)``. It releases the GIL (the reader's threads hash in
    parallel) and is compiled once per dtype pair, cached on disk beside this file.
    """
    try:
        import numba
    except ImportError:
        return None
    u64 = np.uint64

    @numba.njit(nogil=True, cache=True)
    def fill(keys, salt, d, m, out):
        high = u64(salt) << u64(32)
        m0, m1 = m & u64(_LOW), m >> u64(32)
        for i in range(keys.size):
            # mix64 (hashing.mix64; Steele, Lea, Flood, OOPSLA 2014), wrapping modulo 2**64
            z = (u64(keys[i]) | high) + u64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
            z = z ^ (z >> u64(31))
            # q = high 64 bits of z * m, from the four 32 x 32 -> 64 products
            z0, z1 = z & u64(_LOW), z >> u64(32)
            p01, p10 = z0 * m1, z1 * m0
            mid = ((z0 * m0) >> u64(32)) + (p01 & u64(_LOW)) + (p10 & u64(_LOW))
            q = z1 * m1 + (p01 >> u64(32)) + (p10 >> u64(32)) + (mid >> u64(32))
            r = z - q * d
            if r >= d:
                r -= d
            out[i] = r

    return fill
