"""Persia's communication compression (algorithms/runtime/codec.py; Lian et al., KDD 2022, 4.2.3).

* ``none`` is the identity: the very object goes through, raw == wire bytes.
* ids: the round trip is exact (values, dtype, shape) under hypothesis, the message is the
  paper's hash-map (unique id -> uint16 sample and position of each occurrence), wire bytes are
  ``8 U + 4 (U + 1) + 4 N``; B = 65,536 or F * L = 65,536 is refused.
* values: every element obeys the module's bound
  ``|x_hat - x| <= (2^-11 + 2^-23) |x| + (1 + 2^-23) ||v||_inf 2^-25 / kappa + 2^-149``
  under hypothesis (zeros, subnormal and huge norms, mixed magnitudes, negatives); the bound is
  reached within 2x (so a codec that did nothing lossy, or a looser one, shows); fp16 is on the
  wire (2 bytes a value + 4 a block); inf/nan is refused.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.runtime.codec import (
    Codec,
    Fp16Message,
    IdsMessage,
    decode_fp16,
    decode_ids,
    encode_fp16,
    encode_ids,
    nbytes,
)

# derandomize: the same examples on every run, so CI never flips; no example database on disk.
PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=300)
F32_MAX = float(np.finfo(np.float32).max)


def value_bound(x: np.ndarray, kappa: float) -> np.ndarray:
    """The module docstring's per-element bound, in float64."""
    a = np.abs(x.astype(np.float64))
    norm = np.max(a, axis=-1, keepdims=True, initial=0.0)
    return (2**-11 + 2**-23) * a + (1 + 2**-23) * norm * 2**-25 / kappa + 2**-149


# ---------------------------------------------------------------------------- none: identity


def test_none_passes_the_object_itself():
    ids = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    x[0, 0] = np.nan  # not inspected: none sends what it is given
    for codec, sends_ids, sends_values in ((Codec("none"), True, True), (Codec("ids"), False, True),
                                           (Codec("fp16"), True, False)):
        if sends_ids:
            msg, raw, wire = codec.send_ids(ids)
            assert msg is ids and raw == wire == ids.nbytes == nbytes(msg)
            back = codec.recv_ids(msg)
            assert back is ids and back.dtype == np.int32 and np.array_equal(back, ids)
        if sends_values:
            msg, raw, wire = codec.send_values(x)
            assert msg is x and raw == wire == x.nbytes
            back = codec.recv_values(msg)
            assert back is x and back.dtype == np.float32 and np.array_equal(back, x, equal_nan=True)


# ---------------------------------------------------------------------------- ids: lossless


@st.composite
def id_batches(draw):
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    info = np.iinfo(dtype)
    B, F, L = draw(st.integers(0, 10)), draw(st.integers(1, 4)), draw(st.integers(1, 5))
    n = B * F * L
    special = [0, 1, -1, int(info.min), int(info.max)]
    special += [2**62, -(2**62), 2**62 + 1] if dtype is np.int64 else [2**30, -(2**30)]
    any_id = st.sampled_from(special) | st.integers(int(info.min), int(info.max))
    style = draw(st.sampled_from(["duplicates", "all_unique", "any"]))
    if style == "duplicates":
        pool = draw(st.lists(any_id, min_size=1, max_size=3))
        values = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    elif style == "all_unique":
        values = draw(st.lists(any_id, min_size=n, max_size=n, unique=True))
    else:
        values = draw(st.lists(any_id, min_size=n, max_size=n))
    return np.array(values, dtype=dtype).reshape(B, F, L)


@PROPS
@given(id_batches())
def test_ids_round_trip_is_exact_and_the_message_is_the_hash_map(ids):
    codec = Codec("ids")
    msg, raw, wire = codec.send_ids(ids)
    back = codec.recv_ids(msg)
    assert back.dtype == ids.dtype and back.shape == ids.shape and np.array_equal(back, ids)

    B, F, L = ids.shape
    n, u = ids.size, np.unique(ids).size
    assert isinstance(msg, IdsMessage)
    assert (msg.unique.dtype, msg.offsets.dtype, msg.sample.dtype, msg.position.dtype) == (
        np.int64, np.uint32, np.uint16, np.uint16)
    assert np.array_equal(msg.unique, np.unique(ids).astype(np.int64))  # the keys
    # each key's value: the (sample, position) of every entry holding it, and nothing else
    per_key = np.repeat(msg.unique, np.diff(msg.offsets.astype(np.int64)))
    assert np.array_equal(ids.reshape(B, F * L)[msg.sample, msg.position].astype(np.int64), per_key)
    assert raw == ids.nbytes == n * ids.itemsize
    assert wire == nbytes(msg) == 8 * u + 4 * (u + 1) + 4 * n


def test_ids_uint64_and_empty_batches_round_trip():
    big = np.array([2**64 - 1, 2**63, 0, 2**63, 7, 2**64 - 1], dtype=np.uint64).reshape(1, 2, 3)
    for ids in (big, np.zeros((0, 3, 2), np.int64), np.zeros((2, 0, 3), np.int32)):
        back = decode_ids(encode_ids(ids))
        assert back.dtype == ids.dtype and back.shape == ids.shape and np.array_equal(back, ids)


def test_ids_at_the_uint16_limits_round_trip():
    ids = (np.arange(65535, dtype=np.int64) % 1000 * 2**40).reshape(65535, 1, 1)  # B = 65535
    msg, raw, wire = Codec("both").send_ids(ids)
    assert int(msg.sample.max()) == 65534 and wire == 8 * 1000 + 4 * 1001 + 4 * 65535 < 0.53 * raw
    assert np.array_equal(decode_ids(msg), ids)
    ids = np.arange(65535, dtype=np.int32).reshape(1, 5, 13107)  # F * L = 65535
    assert np.array_equal(decode_ids(encode_ids(ids)), ids)


def test_ids_beyond_the_uint16_limits_are_refused():
    with pytest.raises(ValueError, match=r"B = 65536 samples is larger than 65535.*batch per NN worker"):
        Codec("ids").send_ids(np.zeros((65536, 1, 1), np.int64))
    with pytest.raises(ValueError, match=r"F \* L = 256 fields x 256 ids = 65536 positions"):
        encode_ids(np.zeros((1, 256, 256), np.int32))


def test_ids_bad_inputs_say_what():
    with pytest.raises(ValueError, match=r"integer ids \[B, F, L\]"):
        encode_ids(np.zeros((4, 3), np.int64))
    with pytest.raises(ValueError, match=r"integer ids \[B, F, L\]"):
        encode_ids(np.zeros((4, 3, 2), np.float32))
    with pytest.raises(TypeError, match="same persia.compress"):
        Codec("ids").recv_ids(np.zeros((4, 3, 2), np.int64))


# ---------------------------------------------------------------------------- values: lossy

SPECIAL = [0.0, 1e-45, 1e-40, 2**-126, 1e-20, 2**-25, 1.0, 3.0, 65504.0, 7e4, 1e20, 1e38, F32_MAX]


@st.composite
def value_arrays(draw):
    lead = draw(st.sampled_from([(), (2,)]))
    rows, d = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    out = []
    for _ in range(int(np.prod(lead, dtype=int)) * rows):
        style = draw(st.sampled_from(["any", "scaled", "zero", "mixed"]))
        if style == "any":  # hypothesis' f32s: subnormals, huge values, negatives
            row = draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                                min_size=d, max_size=d))
        elif style == "scaled":  # one block magnitude 2^k, k from subnormal to near f32 max
            unit = draw(st.lists(st.floats(-1, 1, width=32), min_size=d, max_size=d))
            row = list(np.array(unit) * 2.0 ** draw(st.integers(-160, 127)))
        elif style == "zero":
            row = [0.0] * d
        else:  # magnitudes 1e-45 .. 3.4e38 side by side in one block
            row = [draw(st.sampled_from([-1.0, 1.0])) * draw(st.sampled_from(SPECIAL))
                   for _ in range(d)]
        out.append(row)
    return np.array(out, np.float64).astype(np.float32).reshape(*lead, rows, d)


@PROPS
@given(value_arrays(), st.sampled_from([1.0, 32768.0, 65504.0]) | st.floats(1.0, 65504.0))
def test_values_obey_the_error_bound(x, kappa):
    codec = Codec("fp16", kappa=kappa)
    msg, raw, wire = codec.send_values(x)
    x_hat = codec.recv_values(msg)
    assert x_hat.dtype == np.float32 and x_hat.shape == x.shape and np.isfinite(x_hat).all()
    err = np.abs(x_hat.astype(np.float64) - x.astype(np.float64))
    bound = value_bound(x, kappa)
    worst = np.unravel_index(np.argmax(err - bound), x.shape)
    assert (err <= bound).all(), (f"x={x[worst]!r} x_hat={x_hat[worst]!r} err={err[worst]:.3e} "
                                  f"bound={bound[worst]:.3e} kappa={kappa}")
    norm = np.max(np.abs(x), axis=-1, keepdims=True)
    assert (np.abs(x_hat) <= norm).all()
    assert np.array_equal(x_hat[(norm == 0)[..., 0]], x[(norm == 0)[..., 0]])  # zero blocks exact
    assert raw == x.nbytes and wire == 2 * x.size + 4 * (x.size // x.shape[-1])


def test_values_fp16_is_on_the_wire_and_the_bound_is_reached():
    x = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    msg, raw, wire = Codec("fp16").send_values(x)
    assert isinstance(msg, Fp16Message) and msg.q.dtype == np.float16 and msg.norm.dtype == np.float32
    assert (raw, wire) == (256 * 16 * 4, 256 * 16 * 2 + 256 * 4)  # 0.5625 of raw
    err = np.abs(decode_fp16(msg).astype(np.float64) - x)
    assert 0.5 <= (err / value_bound(x, 32768.0)).max() <= 1.0


def test_values_the_absolute_term_by_hand():
    # kappa = 2^15, block [1, 0.75 * 2^-39]: y = kappa * x / n = 0.75 * 2^-24 for the small one,
    # which rounds to fp16's smallest subnormal 2^-24, so x_hat = 2^-24 / 2^15 = 2^-39 and
    # err = 2^-41 = half of the absolute term n 2^-25 / kappa = 2^-40.
    x = np.array([[1.0, 0.75 * 2**-39]], np.float32)
    x_hat = decode_fp16(encode_fp16(x, 32768.0))
    assert x_hat[0, 0] == 1.0 and x_hat[0, 1] == np.float32(2**-39)


def test_values_the_scale_keeps_tiny_and_huge_blocks():
    # a plain fp16 cast sends these as 0 and inf; per-block scaling keeps fp16's relative accuracy
    x = np.array([[1e-40, -5e-41, 3e-41], [1e38, -7e37, 2e36], [F32_MAX, -F32_MAX, 1e30]], np.float32)
    with np.errstate(over="ignore"):
        plain = x.astype(np.float16)
    assert (plain[0] == 0).all() and np.isinf(plain[1:, :2]).all()
    x_hat = decode_fp16(encode_fp16(x, 32768.0))
    rel = np.abs(x_hat.astype(np.float64) - x) / np.abs(x.astype(np.float64))
    assert (rel <= 2**-10).all()  # fp16's 2^-11, plus f32's own rounding of the subnormal row
    assert (np.abs(x_hat - x) <= value_bound(x, 32768.0)).all()


def test_values_nonfinite_is_refused_with_count_and_first_index():
    x = np.zeros((4, 5), np.float32)
    x[2, 3], x[3, 0] = np.nan, -np.inf
    with pytest.raises(ValueError, match=r"2 non-finite value\(s\).*first at index \(2, 3\) is nan"):
        Codec("both").send_values(x)


def test_values_bad_inputs_say_what():
    with pytest.raises(ValueError, match="expected float32"):
        encode_fp16(np.zeros((2, 3)), 32768.0)
    with pytest.raises(ValueError, match="kappa must be in"):
        Codec("fp16", kappa=65536.0)
    with pytest.raises(ValueError, match="kappa must be in"):
        Codec("fp16", kappa=0.5)
    with pytest.raises(ValueError, match="Codec.kind must be one of"):
        Codec("zstd")
    with pytest.raises(TypeError, match="same persia.compress"):
        Codec("fp16").recv_values(np.zeros((2, 3), np.float32))
    for shape in ((0, 8), (3, 0)):
        x = np.zeros(shape, np.float32)
        assert decode_fp16(encode_fp16(x, 32768.0)).shape == shape
