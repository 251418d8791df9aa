"""The compression coders against independent references: numpy's float16, torch's
bfloat16, numpy's rint and packbits; their error bounds on random and adversarial
blocks; the non-finite policy; error feedback's residual; the spec's bad input."""

from __future__ import annotations

import numpy as np
import pytest

from hpcpar.collectives.compression import Compression, as_compression, codec_for
from hpcpar.collectives.compression.schemes import TINY
from hpcpar.collectives.errors import CollectiveError

SCHEMES = ["fp16", "bf16", "int8", "1bit"]


def _round_trip(codec, v, **kw):
    payload = np.empty(codec.wire_bytes(v.size), np.uint8)
    work = v.copy()
    codec.encode(work, payload, **kw)
    out = np.empty(v.size, np.float32)
    codec.decode(payload, out, add=False)
    return payload, out, work


def _padded_blocks(v, block):
    nb = -(-v.size // block)
    pad = np.zeros(nb * block, v.dtype)
    pad[: v.size] = v
    return pad.reshape(nb, block)


def _data(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    x[::97] *= 1e-7  # small values beside large ones
    x[5::311] = 0.0
    x[7::401] = -0.0
    return x


@pytest.mark.parametrize("block", [256, 64, 40])
def test_fp16_codes_are_numpys_half_of_the_scaled_block(block):
    codec = codec_for("fp16", block)
    x = _data()
    payload, out, _ = _round_trip(codec, x)
    nb = -(-x.size // block)
    exps = payload[: 4 * nb].view(np.int32)
    halves = payload[4 * nb :].view(np.float16)
    rows = _padded_blocks(x, block).astype(np.float64)
    want = np.ldexp(rows, exps[:, None]).astype(np.float16).ravel()[: x.size]
    assert np.array_equal(halves.view(np.uint16), want.view(np.uint16))
    back = np.ldexp(want.astype(np.float64), -np.repeat(exps, block)[: x.size])
    assert np.array_equal(out, back.astype(np.float32))
    assert np.all(np.abs(rows).max(1) * np.ldexp(1.0, exps) < 2.0**15)


def test_bf16_codes_are_torchs_bfloat16():
    torch = pytest.importorskip("torch")
    x = _data()
    x[:4] = [3.4e38, -3.4e38, 1e-40, -1e-45]  # overflow to inf, float32 subnormals
    codec = codec_for("bf16")
    payload, out, _ = _round_trip(codec, x)
    want = torch.from_numpy(x).to(torch.bfloat16)
    assert np.array_equal(payload.view(np.int16), want.view(torch.int16).numpy())
    assert np.array_equal(out, want.float().numpy())


@pytest.mark.parametrize("block", [256, 100])
def test_int8_codes_are_rint_of_the_scaled_block(block):
    codec = codec_for("int8", block)
    x = _data()
    payload, _, _ = _round_trip(codec, x)
    nb = -(-x.size // block)
    scales = payload[: 4 * nb].view(np.float32)
    codes = payload[4 * nb :].view(np.int8)
    rows = _padded_blocks(x, block)
    peak = np.abs(rows).max(1)
    assert np.array_equal(scales, (peak / np.float32(127)).astype(np.float32))
    want = np.rint(rows * (np.float32(127) / peak)[:, None]).ravel()[: x.size]
    assert np.array_equal(codes, want.astype(np.int8))


@pytest.mark.parametrize("block", [256, 24])
def test_1bit_codes_are_packed_signs_and_mean_magnitudes(block):
    codec = codec_for("1bit", block)
    x = _data()
    payload, out, _ = _round_trip(codec, x)
    nb = -(-x.size // block)
    scales = payload[: 4 * nb].view(np.float32)
    bits = payload[4 * nb :]
    assert np.array_equal(bits, np.packbits(~np.signbit(x), bitorder="little"))
    sizes = np.diff(np.r_[np.arange(0, x.size, block), x.size])
    mean = np.abs(_padded_blocks(x, block)).sum(1, dtype=np.float64) / sizes
    np.testing.assert_allclose(scales, mean, rtol=1e-6)
    signs = np.where(np.signbit(x), -1, 1)
    assert np.array_equal(out, signs * np.repeat(scales, block)[: x.size])


def _adversarial(seed=1):
    rng = np.random.default_rng(seed)
    cases = [
        rng.standard_normal(3000).astype(np.float32),
        (np.logspace(-30, 30, 3000) * rng.choice([-1, 1], 3000)).astype(np.float32),
        np.full(3000, 1e-42, np.float32),  # subnormal everywhere
        np.zeros(3000, np.float32),
        np.where(rng.random(3000) < 0.5, 3e38, -3e38).astype(np.float32),  # at the range's top
    ]
    spikes = rng.standard_normal(3000).astype(np.float32) * 1e-3
    spikes[::256] = 1e4  # one huge value per block
    return [*cases, spikes]


@pytest.mark.parametrize(
    ("scheme", "rounding"), [(s, "nearest") for s in SCHEMES] + [("int8", "stochastic")]
)
def test_each_coding_is_within_its_bound(scheme, rounding):
    codec = codec_for(scheme, 256, rounding)
    eps = codec.scheme.eps_stochastic if codec.stochastic else codec.scheme.eps
    for x in _adversarial():
        _, out, _ = _round_trip(codec, x, seed=7)
        err = np.abs(out.astype(np.float64) - x)
        peak = np.abs(_padded_blocks(x, 256)).max(1).astype(np.float64)
        limit = np.repeat(peak, 256)[: x.size] * (eps + 2.0**-20) + TINY
        assert np.all(np.isfinite(out))
        assert np.all(err <= limit), (scheme, float((err - limit).max()))


def test_stochastic_rounding_is_unbiased_and_seeded():
    codec = codec_for("int8", 256, "stochastic")
    x = np.linspace(-1, 1, 2048).astype(np.float32)
    x[0] = 1.0
    outs = [_round_trip(codec, x, seed=s)[1] for s in range(400)]
    assert np.array_equal(_round_trip(codec, x, seed=3)[1], outs[3])
    assert not np.array_equal(outs[0], outs[1])
    step = 1.0 / 127
    # the mean of 400 draws is within 4 standard errors of the value (each draw's error
    # is below one step, so its standard deviation is at most step / 2)
    assert np.all(np.abs(np.mean(outs, axis=0) - x) <= 4 * (step / 2) / np.sqrt(400))
    # drawn per global index: cutting the vector does not change the draws
    head = _round_trip(codec, x[:1024], seed=9)[1]
    tail = _round_trip(codec, x[1024:], seed=9, start=1024)[1]
    whole = _round_trip(codec, x, seed=9)[1]
    assert np.array_equal(np.r_[head, tail], whole)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_non_finite_inputs_never_come_out_finite(scheme):
    codec = codec_for(scheme)
    x = _data(2048)
    x[3], x[700], x[1500] = np.inf, np.nan, -np.inf
    _, out, work = _round_trip(codec, x, feedback=True)
    bad_blocks = {0, 2, 5}
    for b in range(8):
        block = out[b * 256 : (b + 1) * 256]
        if b in bad_blocks and scheme != "bf16":
            assert np.isnan(block).all()  # the whole block: its scale is not finite
            assert not work[b * 256 : (b + 1) * 256].any()  # the residual is reset
        elif b not in bad_blocks:
            assert np.isfinite(block).all()
    if scheme == "bf16":  # element by element, as IEEE
        assert out[3] == np.inf and np.isnan(out[700]) and out[1500] == -np.inf
        assert np.isfinite(np.delete(out, [3, 700, 1500])).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_feedback_leaves_what_the_code_lost(scheme):
    codec = codec_for(scheme)
    x = _data()
    _, out, residual = _round_trip(codec, x, feedback=True)
    np.testing.assert_allclose(residual, x - out, rtol=0, atol=2e-6 * np.abs(x).max())


def test_only_float32_vectors_are_coded():
    codec = codec_for("int8")
    with pytest.raises(CollectiveError, match="float32"):
        codec.encode(np.ones(8), np.empty(codec.wire_bytes(8), np.uint8))


def test_payload_sizes():
    n = 1000
    assert codec_for("int8", 256).wire_bytes(n) == 4 * 4 + n
    assert codec_for("fp16", 256).wire_bytes(n) == 4 * 4 + 2 * n
    assert codec_for("bf16", 256).wire_bytes(n) == 2 * n
    assert codec_for("1bit", 256).wire_bytes(n) == 4 * 4 + 125
    assert codec_for("int8").wire_bytes(0) == 0


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("value", "tolerance", "match"),
    [
        ("zip", None, "unknown compression 'zip'"),
        (Compression("int8", block=0), None, "block size must be a positive integer"),
        (Compression("int8", block=-4), None, "block size must be a positive integer"),
        (Compression("1bit", block=12), None, "multiple of 8"),
        (Compression("fp16", rounding="stochastic"), None, "stochastic rounding applies to int8"),
        (Compression("int8", rounding="up"), None, "rounding must be"),
        ("auto", None, "needs tolerance="),
        ("auto", 0.0, "tolerance must be a finite number > 0"),
        ("auto", -1.0, "tolerance must be a finite number > 0"),
        ("auto", float("nan"), "tolerance must be a finite number > 0"),
        (None, 0.1, "tolerance= applies to compressed calls"),
        (3, None, "compression must be None"),
    ],
)
def test_bad_compression_arguments(value, tolerance, match):
    with pytest.raises(CollectiveError, match=match):
        as_compression(value, tolerance)


def test_bounds_are_documented_per_node_count():
    int8 = codec_for("int8")
    assert int8.bound(2) == pytest.approx(2 / 254, rel=1e-3)
    assert codec_for("int8", rounding="stochastic").bound(2) == pytest.approx(2 / 127, rel=1e-3)
    assert codec_for("fp16").bound(4) < codec_for("bf16").bound(4) < int8.bound(4)
    assert codec_for("1bit").bound(2) >= 2
