"""Persia's communication compression: lossless ids, per-block scaled fp16 values.

Lian et al., "Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to
100 Trillion Parameters", KDD 2022, Sec. 4.2.3 "Communication compression" (text in
../shared/papers/004_570b5855f3cb7e58.txt):

    "we apply a lossless compression mechanism for the index component and a discreet lossy
    compression mechanism for the value component."

    "Lossless compression. For the index component of the embedding, instead of representing a
    batch of samples as a list of vectors, where each vector containing all IDs (represented
    by int64) of a sample, we represent a batch as a hash-map, where the key is unique IDs in
    the whole batch, and the value corresponding to each unique ID is the indices of the
    samples in the batch containing this ID. Since the batch size is relatively small
    (<= 65535), the indices can be represented using uint16 instead of int64 without losing
    any information."

    "Lossy compression. For the value component, We adopt a discreet fp32 to fp16
    compression. [...] suppose ||.||_inf represents the L_inf norm of a vector, kappa
    represents a relatively large constant scalar. In the compression side, each fp32 vector
    block v is first scaled by kappa / ||v||_inf and then converted to a fp16 block vector. In
    the decompression side, the compressed block vector v~ communicated as fp16 is first
    converted back to a fp32 vector and then divided by kappa / ||v||_inf."

(The extracted text prints the constant as "^"; we call it kappa, ``persia.kappa``.)
Pure numpy, no threads; `Codec` is what the Persia roles call, the functions under it are the
codec itself.

Ids (`encode_ids`, ``persia.compress=ids|both``). A batch ``ids[B, F, L]`` (B samples, F fields,
L ids per field) becomes the paper's hash-map in array form, a CSR grouped by unique id:

* ``unique[U]`` int64: the batch's distinct ids, sorted (the keys);
* ``offsets[U + 1]`` uint32: the occurrences of ``unique[u]`` are rows
  ``offsets[u]:offsets[u + 1]`` of the two columns below (``B * F * L <= 65535**2 < 2**32``);
* ``sample[N]``, ``position[N]`` uint16, ``N = B * F * L``: the sample ``b`` and the position
  ``f * L + l`` of every occurrence (the value: "the indices of the samples [...] containing
  this ID"; the position is what rebuilds the [B, F, L] layout).

The uint16 columns bound ``B <= 65535`` and ``F * L <= 65535``; a larger batch is refused, not
wrapped. (The indices of B = 65536 would still fit, 0..65535, but B itself would not: Persia's
code keeps ``batch_size: u16``; we keep the paper's limit.)

``raw_bytes`` is ``ids.nbytes``, the array as it arrives (``8 * N`` for int64 ids, the paper's
baseline; ``4 * N`` for int32 ids, so an int32 batch is measured against its real size);
``wire_bytes`` is the sum of the message's arrays, ``8 U + 4 (U + 1) + 4 N``: about half of an
int64 batch when ids repeat (an int32 batch gains nothing: its raw size is already 4 N).
Neither counts the header (shape, dtype), which both would carry.

Values (`encode_fp16`, ``persia.compress=fp16|both``): activations sent to the NN workers and
their gradients sent back. A block ``v`` is one last-axis vector ``x[..., :]`` (one activation
or gradient row) with norm ``n = ||v||_inf`` (exact in f32, sent as f32 beside the block):

    q     = fp16(kappa * (v / n))       # "scaled by kappa / ||v||_inf", "converted to fp16"
    x_hat = f32(q * n / kappa)          # "converted back to fp32", "divided by kappa/||v||_inf"

both computed in float64 and in this order: ``|v / n| <= 1``, so neither a subnormal norm
(1e-40) nor a huge one (1e38) underflows or overflows, and ``|kappa * v / n| <= kappa <= 65504``
(fp16's largest finite value), so q is finite. A zero block sends zeros and decodes to exact
zeros. inf or nan anywhere is refused (ValueError): it would make its block's norm non-finite
and its scale zero or nan. Decoding clips to ``[-n, n]``, which only moves ``x_hat`` towards
``x`` (``|x| <= n``) and keeps the result finite even when kappa is not an fp16 number.

Error bound. For an element x of block v write ``y = kappa * x / n`` (``|y| <= kappa``); float64
computes it with relative error <= 2 * 2^-53. fp16 rounds to nearest with 11 significant bits:
``|q - y| <= 2^-11 |y|`` where ``|y| >= 2^-14`` (normal fp16) and ``<= 2^-25`` (half fp16's
smallest subnormal, 2^-24) below it, so ``|q - y| <= 2^-11 |y| + 2^-25``. Multiplying by
``n / kappa`` (``q * n`` is exact in float64, the division adds 2^-53):
``|q n / kappa - x| <= 2^-11 |x| + n 2^-25 / kappa`` plus float64 terms of order 2^-52 |x|; the
final cast to f32 adds at most 2^-24 of the result (normal f32) or 2^-150 (subnormal f32).
Hence, for every element,

    |x_hat - x| <= (2^-11 + 2^-23) |x| + (1 + 2^-23) ||v||_inf eps_abs + 2^-149,
    eps_abs = 2^-25 / kappa,

where 2^-11 is fp16's unit roundoff and the 2^-23 slacks hold the f64 and f32 roundings
(tests/test_codec.py checks this exactly). The scale is what makes the bound relative to the
block: an element keeps fp16's relative accuracy down to ``|x| = n 2^-14 / kappa`` (``n 2^-29``
at the default kappa = 2^15) and only an absolute accuracy of ``n 2^-40`` below that, whatever
``n`` is. A plain fp16 cast instead turns ``|x| >= 65520`` into inf and ``|x| <= 2^-25`` into 0.

Persia's public code (PersiaML/PERSIA, read with the search tool; one stored version of each
file, not every release): ``persia-embedding-datatypes/src/lib.rs`` (commit 1cc32e3) converts
embeddings with ``ndarray_f32_to_f16``, a plain ``Vec::from_f32_slice`` cast with no
kappa / ||v||_inf scaling, and sends embedding gradients as fp16 with one global
``scale_factor`` (the AMP loss scale, "true gradient = gradients / scale_factor";
``persia/ctx.py``, commit 02e2560, passes ``loss_scale``), not a per-block scale. The same
``lib.rs`` keeps each id's occurrences as ``Vec<(u16, u16)>`` (sample, column) and panics when
the batch size is larger than ``u16::MAX``, as here.

References:
  Lian et al., KDD 2022, Sec. 4.2.3.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

KINDS = ("none", "ids", "fp16", "both")  # the values of persia.compress
U16_MAX = 65535  # largest B and F * L: the uint16 sample / position columns (paper: "<= 65535")
FP16_MAX = 65504.0  # largest finite fp16: kappa may not exceed it (q = kappa * v / n <= kappa)


class IdsMessage(NamedTuple):
    """A batch of ids as a hash-map in array form (unique id -> its occurrences).

    Attributes:
      unique: [U] int64, the batch's distinct ids, sorted (uint64 ids are kept mod 2^64).
      offsets: [U + 1] uint32, occurrences of ``unique[u]`` are ``offsets[u]:offsets[u + 1]``.
      sample: [N] uint16, the sample b of each occurrence (N = B * F * L).
      position: [N] uint16, its position ``f * L + l`` in the sample.
      shape: header, not counted in wire bytes: (B, F, L).
      dtype: header, not counted in wire bytes: the dtype the ids arrived in.
    """

    unique: np.ndarray
    offsets: np.ndarray
    sample: np.ndarray
    position: np.ndarray
    shape: tuple[int, int, int]
    dtype: np.dtype


class Fp16Message(NamedTuple):
    """Float32 values as per-block scaled fp16 and the blocks' norms.

    Attributes:
      q: [..., D] float16, ``fp16(kappa * v / ||v||_inf)`` for each block (row) v.
      norm: [...] float32, ``||v||_inf`` of each block (0 for a zero block).
      kappa: the scale constant; configuration both ends share (``persia.kappa``), not counted
        in wire bytes.
    """

    q: np.ndarray
    norm: np.ndarray
    kappa: float


def nbytes(message: Any) -> int:
    """Bytes on the wire: the sum of a message's arrays (an uncompressed array: its nbytes)."""
    if isinstance(message, IdsMessage):
        return sum(int(a.nbytes) for a in (message.unique, message.offsets, message.sample,
                                           message.position))
    if isinstance(message, Fp16Message):
        return int(message.q.nbytes) + int(message.norm.nbytes)
    if hasattr(message, "nbytes"):
        return int(message.nbytes)
    raise TypeError(f"nbytes: expected an IdsMessage, an Fp16Message or an array, got "
                    f"{type(message).__name__}")


def encode_ids(ids: np.ndarray) -> IdsMessage:
    """Lossless: ids[B, F, L] (any integer dtype) -> unique ids + uint16 (sample, position).

    Raises:
      ValueError: ids not 3-D integers, or ``B > 65535`` or ``F * L > 65535`` (uint16 limits).
    """
    ids = np.asarray(ids)
    if ids.ndim != 3 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"encode_ids: expected integer ids [B, F, L] (samples, fields, ids per "
                         f"field), got {ids.dtype} of shape {ids.shape}")
    B, F, L = ids.shape
    if B > U16_MAX:
        raise ValueError(
            f"encode_ids: a batch of B = {B} samples is larger than {U16_MAX}, the largest the "
            f"uint16 sample index holds (Persia Sec. 4.2.3: 'the batch size is relatively small "
            f"(<= 65535)'). Lower the batch per NN worker (train.batch_size / persia.nn_workers) "
            f"to <= {U16_MAX}, or send ids uncompressed (persia.compress=none or fp16).")
    if F * L > U16_MAX:
        raise ValueError(
            f"encode_ids: F * L = {F} fields x {L} ids = {F * L} positions per sample is larger "
            f"than {U16_MAX}, the largest the uint16 position index holds. Keep fewer ids per "
            f"field (data.multi_hot_len), or send ids uncompressed (persia.compress=none or fp16).")
    flat = ids.reshape(-1)
    unique, inverse = np.unique(flat, return_inverse=True)  # keys; which key each entry holds
    order = np.argsort(inverse, kind="stable")  # entries grouped by key, batch order inside
    offsets = np.zeros(unique.size + 1, np.uint32)
    np.cumsum(np.bincount(inverse, minlength=unique.size), out=offsets[1:])
    per_sample = max(F * L, 1)  # F * L == 0: no entries, but no division by zero either
    return IdsMessage(unique=unique.astype(np.int64),  # modular for uint64: exact round trip
                      offsets=offsets,
                      sample=(order // per_sample).astype(np.uint16),
                      position=(order % per_sample).astype(np.uint16),
                      shape=(B, F, L), dtype=ids.dtype)


def decode_ids(msg: IdsMessage) -> np.ndarray:
    """Rebuild the exact ids[B, F, L] (same values, dtype and shape) from `encode_ids`'s message."""
    if not isinstance(msg, IdsMessage):
        raise TypeError(f"decode_ids: expected an IdsMessage (from encode_ids), got "
                        f"{type(msg).__name__}; do both ends use the same persia.compress?")
    B, F, L = msg.shape
    n = B * F * L
    if not (msg.offsets.size == msg.unique.size + 1 and int(msg.offsets[-1]) == n
            and msg.sample.size == n and msg.position.size == n):
        raise ValueError(f"decode_ids: malformed message for shape {msg.shape}: {msg.unique.size} "
                         f"unique ids, {msg.offsets.size} offsets ending at {int(msg.offsets[-1])}, "
                         f"{msg.sample.size} samples, {msg.position.size} positions (want {n})")
    flat = np.empty(n, np.int64)
    where = msg.sample.astype(np.int64) * (F * L) + msg.position  # the entries are a permutation
    flat[where] = np.repeat(msg.unique, np.diff(msg.offsets.astype(np.int64)))
    return flat.astype(msg.dtype).reshape(B, F, L)


def _check_kappa(kappa: float) -> None:
    if not 1.0 <= kappa <= FP16_MAX:
        raise ValueError(f"kappa must be in [1, {FP16_MAX:g}] (fp16's largest value bounds "
                         f"kappa * v / ||v||_inf), got {kappa}")


def encode_fp16(x: np.ndarray, kappa: float) -> Fp16Message:
    """Lossy: float32 x[..., D] -> fp16 ``kappa * v / ||v||_inf`` per block v = x[..., :] + norms.

    Raises:
      ValueError: x not float32, a 0-d array, kappa outside [1, 65504], or any inf/nan in x
        (how many, and the first one's index).
    """
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim < 1:
        raise ValueError(f"encode_fp16: expected float32 values [..., D], got {x.dtype} of shape "
                         f"{x.shape}; cast to float32 first")
    _check_kappa(kappa)
    finite = np.isfinite(x)
    if not finite.all():
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"encode_fp16: {int(x.size - finite.sum())} non-finite value(s) (inf/nan) in the "
            f"float32 values of shape {x.shape}; the first at index {first} is {x[first]}. "
            f"Refusing to send them (their block's kappa / ||v||_inf would be 0 or nan): find "
            f"where the activations or gradients diverged.")
    norm = np.max(np.abs(x), axis=-1, initial=np.float32(0))  # ||v||_inf, exact in f32
    n = norm.astype(np.float64)[..., None]
    # v / n first (|v / n| <= 1, no overflow or underflow for any f32 norm), then * kappa
    u = np.divide(x.astype(np.float64), n, out=np.zeros(x.shape), where=n > 0)
    return Fp16Message(q=(u * kappa).astype(np.float16), norm=norm, kappa=float(kappa))


def decode_fp16(msg: Fp16Message) -> np.ndarray:
    """float32 ``q * ||v||_inf / kappa`` (the paper: divided by kappa / ||v||_inf) per block."""
    if not isinstance(msg, Fp16Message):
        raise TypeError(f"decode_fp16: expected an Fp16Message (from encode_fp16), got "
                        f"{type(msg).__name__}; do both ends use the same persia.compress?")
    n = msg.norm.astype(np.float64)[..., None]
    x = msg.q.astype(np.float64) * n / msg.kappa  # q * n is exact in float64
    np.clip(x, -n, n, out=x)  # |x| <= n: only moves x_hat towards x, and keeps it finite
    return x.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Codec:
    """What a Persia role sends and receives: ids (lossless) and values (lossy), by ``kind``.

    Every ``send_*`` returns ``(message, raw_bytes, wire_bytes)``: raw = the array's nbytes as it
    arrived, wire = `nbytes` of the message. With compression off for a component, ``send``
    returns the input object itself (no copy, no cast; raw == wire) and ``recv`` returns what it
    is given.

    Attributes:
      kind: none | ids (lossless ids) | fp16 (scaled fp16 values) | both (``persia.compress``).
      kappa: the fp16 scale constant, in [1, 65504] (``persia.kappa``).
    """

    kind: str = "none"  # none | ids | fp16 | both
    kappa: float = 32768.0  # kappa: a block v is sent as fp16(kappa * v / ||v||_inf)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Codec.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        _check_kappa(self.kappa)

    @property
    def compress_ids(self) -> bool:
        return self.kind in ("ids", "both")

    @property
    def compress_values(self) -> bool:
        return self.kind in ("fp16", "both")

    def send_ids(self, ids: np.ndarray) -> tuple[Any, int, int]:
        """ids[B, F, L] -> (message, raw_bytes, wire_bytes)."""
        if not self.compress_ids:
            return ids, int(ids.nbytes), int(ids.nbytes)
        msg = encode_ids(ids)
        return msg, int(np.asarray(ids).nbytes), nbytes(msg)

    def recv_ids(self, message: Any) -> np.ndarray:
        return decode_ids(message) if self.compress_ids else message

    def send_values(self, x: np.ndarray) -> tuple[Any, int, int]:
        """float32 activations or gradients [..., D] -> (message, raw_bytes, wire_bytes)."""
        if not self.compress_values:
            return x, int(x.nbytes), int(x.nbytes)
        msg = encode_fp16(x, self.kappa)
        return msg, int(np.asarray(x).nbytes), nbytes(msg)

    def recv_values(self, message: Any) -> np.ndarray:
        return decode_fp16(message) if self.compress_values else message
