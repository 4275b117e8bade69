"""Experts (rule steps 5-8): dequant, gate/up, global scale, SwiGLU composition, down."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from flint_moe.reference.experts import (
    SWIGLU_C,
    apply_global_scale,
    bf16_expert,
    dequant_nvfp4,
    down_accumulate,
    down_output,
    down_output_bf16,
    gate_up_accumulate,
    nvfp4_expert,
    swiglu,
)
from flint_moe.reference.formats import E2M1_VALUES, e4m3_to_float
from tests.reference._oracle import (
    add32,
    bf16,
    f32_bits,
    install_stub_mufu,
    mufu_tables_present,
    mul32,
    scalar,
    stub_ex2,
    stub_rcp,
    t32,
    tbf,
)


def _pack(codes: list[list[int]]) -> torch.Tensor:
    return torch.tensor(
        [[r[i] | (r[i + 1] << 4) for i in range(0, len(r), 2)] for r in codes], dtype=torch.uint8
    )


def test_swiglu_constant_bits():
    assert f32_bits(SWIGLU_C) == 0xBFB8AA3B


def test_dequant_hand_cases():
    # row 0: code 7 (6.0) with scale 0x7E (448): 2688; code 1 (0.5) ... all in one block of 16
    # row 1: scale 0x01 (2^-9, smallest subnormal E4M3), code 1 (0.5): 2^-10
    # row 2: scale 0x80 (-0): code 2 (1.0) -> -0.0; code 10 (-1.0) -> +0.0
    # row 3: scale 0xB8 (-1.0): code 15 (-6.0) -> 6.0
    codes = [[7] + [0] * 15, [1] + [0] * 15, [2, 10] + [0] * 14, [15] + [0] * 15]
    scale = torch.tensor([[0x7E], [0x01], [0x80], [0xB8]], dtype=torch.uint8)
    w = dequant_nvfp4(_pack(codes), scale)
    assert w.dtype == torch.float32 and w.shape == (4, 16)
    assert w[0, 0] == 2688.0 and w[1, 0] == 2.0**-10 and w[3, 0] == 6.0
    assert math.copysign(1, float(w[2, 0])) == -1 and float(w[2, 0]) == 0.0
    assert math.copysign(1, float(w[2, 1])) == 1
    # float8_e4m3fn scales are accepted and equal
    w8 = dequant_nvfp4(_pack(codes), scale.view(torch.float8_e4m3fn))
    assert torch.equal(w.view(torch.int32), w8.view(torch.int32))


def test_dequant_bad_inputs():
    codes = _pack([[0] * 16])
    with pytest.raises(ValueError, match="scale: E4M3 NaN scale byte 0x7F"):
        dequant_nvfp4(codes, torch.tensor([[0x7F]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="w13_scale: E4M3 NaN scale byte 0xFF"):
        gate_up_accumulate(
            torch.zeros(1, 16, dtype=torch.bfloat16), codes, torch.tensor([[0xFF]], dtype=torch.uint8)
        )
    with pytest.raises(ValueError, match="codes: unpacked row length .* multiple of 16"):
        dequant_nvfp4(torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(2, 0, dtype=torch.uint8))
    with pytest.raises(TypeError, match="x: dtype must be torch.bfloat16"):
        gate_up_accumulate(torch.zeros(1, 16), codes, torch.ones(1, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="x: dimension 1 must be 16"):
        gate_up_accumulate(
            torch.zeros(1, 32, dtype=torch.bfloat16), codes, torch.ones(1, 1, dtype=torch.uint8)
        )
    with pytest.raises(ValueError, match="w2_scale: dimension 1 must be 1"):
        down_accumulate(torch.zeros(1, 16, dtype=torch.bfloat16), codes, torch.ones(1, 2, dtype=torch.uint8))


def test_gate_up_accumulate_against_fractions():
    rng = random.Random(5)
    n, k = 6, 32
    codes = [[rng.randrange(16) for _ in range(k)] for _ in range(n)]
    sbytes = [[rng.choice([0x01, 0x38, 0x7E, 0xB8, 0x80, 0x30]) for _ in range(k // 16)] for _ in range(n)]
    scale = torch.tensor(sbytes, dtype=torch.uint8)
    svals = e4m3_to_float(scale).tolist()
    x = [
        [
            rng.choice((-1, 1)) * rng.randrange(128, 256) / 128 * 2.0 ** rng.randrange(-30, 30)
            for _ in range(k)
        ]
        for _ in range(2)
    ]
    acc = gate_up_accumulate(tbf(x), _pack(codes), scale)
    assert acc.shape == (2, n)
    for t in range(2):
        for r in range(n):
            q = sum(
                Fraction(E2M1_VALUES[codes[r][h]]) * Fraction(svals[r][h // 16]) * Fraction(x[t][h])
                for h in range(k)
            )
            assert abs(Fraction(float(acc.exact[t, r])) - q) <= Fraction(float(acc.fp64_error[t, r]))
    # gate/up split by slicing keeps n and the model
    assert acc[:, :3].shape == (2, 3) and acc[:, 3:].n == k


def test_apply_global_scale_and_down_output_rounding_points():
    # RN(3 * fp32(1/3)): fp32(1/3) = 0x3EAAAAAB = 1/3 + 2^-25/3; times 3 = 1 + 2^-25 -> RN -> 1.0
    third = float(torch.tensor(1 / 3, dtype=torch.float32))
    assert apply_global_scale(t32([3.0]), torch.tensor(third)).tolist() == [1.0]
    # (1 + 2^-23)(1 + 2^-23) = 1 + 2^-22 + 2^-46 -> RN -> 1 + 2^-22 -> bf16: 1.0 (below the midpoint 1 + 2^-8)
    y = down_output(t32([1 + 2.0**-23]), torch.tensor(1 + 2.0**-23, dtype=torch.float32))
    assert y.dtype == torch.bfloat16 and y.float().tolist() == [1.0]
    # (1 + 2^-8) * 1 = midpoint of bf16 1 and 1 + 2^-7 -> even 1.0; (1 + 3*2^-8) -> 1 + 2^-6
    assert down_output(t32([1 + 2.0**-8, 1 + 3 * 2.0**-8]), 1.0).float().tolist() == [1.0, 1 + 2.0**-6]
    # overflow in RN(acc * gs): 2^127 * 2 = 2^128 -> inf
    assert down_output(t32([2.0**127]), 2.0).float().tolist() == [math.inf]
    # BF16 rule: y = bf16(y_acc)
    assert down_output_bf16(t32([1 + 3 * 2.0**-8])).float().tolist() == [1 + 2.0**-6]
    with pytest.raises(ValueError, match="gs: expected one fp32 value"):
        apply_global_scale(t32([1.0]), torch.ones(2))
    with pytest.raises(TypeError, match="gs: dtype must be torch.float32"):
        apply_global_scale(t32([1.0]), torch.ones((), dtype=torch.float64))


def _ref_swiglu(g: float, u: float) -> float:
    a = mul32(g, SWIGLU_C)
    p = scalar(stub_ex2, a)
    d = add32(p, 1.0)
    r = scalar(stub_rcp, d)
    return bf16(mul32(u, mul32(g, r)))


def test_swiglu_composition_hand_cases(monkeypatch):
    install_stub_mufu(monkeypatch)
    # g = 0: a = RN(0 * c) = -0, p = ex2(-0) = 1, d = 2, r = 0.5, RN(0 * 0.5) = 0, act = bf16(u * 0):
    #   u = 1 -> +0, u = -1 -> -0 (sign of zero fixed by the rule)
    # g = 100: a = RN(-144.27) , p = ex2(a) < 2^-126 -> flushed to +0, d = 1, r = 1, act = bf16(u * 100) = 100
    # g = -100: a = 144.27, p = 2^144.27 -> inf, d = inf, r = rcp(inf) = +0, g*r = -0, act = bf16(1 * -0) = -0
    # g = 1, u = 1: a = c, p = ex2(-1.4427) ~ 0.3679, d ~ 1.3679, act = bf16(1/1.3679 ~ 0.7311) = 0.73046875
    out = swiglu(t32([0.0, 0.0, 100.0, -100.0, 1.0]), t32([1.0, -1.0, 1.0, 1.0, 1.0])).float().tolist()
    assert out[:4] == [0.0, -0.0, 100.0, -0.0]
    assert [math.copysign(1, v) for v in out[:4]] == [1, -1, 1, -1]
    assert out[4] == 0.73046875


def test_swiglu_against_plain_loop(monkeypatch):
    install_stub_mufu(monkeypatch)
    rng = random.Random(11)
    gs = [
        float(torch.tensor(rng.uniform(-1, 1) * 2.0 ** rng.randrange(-130, 8), dtype=torch.float32))
        for _ in range(300)
    ] + [math.inf, -math.inf, 0.0, -0.0]
    us = [float(torch.tensor(rng.uniform(-4, 4), dtype=torch.float32)) for _ in gs]
    out = swiglu(t32(gs), t32(us)).float().tolist()
    for g, u, got in zip(gs, us, out, strict=False):
        want = _ref_swiglu(g, u)
        assert (math.isnan(want) and math.isnan(got)) or f32_bits(got) == f32_bits(want), (g, u)


@pytest.mark.skipif(not mufu_tables_present(), reason="mufu tables are captured on the GPU")
def test_swiglu_with_real_mufu_saturating_cases():
    # cases whose value does not depend on the approximations' ulps (see the hand-case test)
    out = swiglu(t32([0.0, 100.0, -100.0]), t32([1.0, 1.0, 1.0])).float().tolist()
    assert out == [0.0, 100.0, -0.0] and math.copysign(1, out[2]) == -1


def test_expert_helpers_shapes_and_policy(monkeypatch):
    install_stub_mufu(monkeypatch)
    torch.manual_seed(0)
    i, h = 16, 32
    w13 = torch.randint(0, 256, (2 * i, h // 2), dtype=torch.uint8)
    s13 = torch.full((2 * i, h // 16), 0x30, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (h, i // 2), dtype=torch.uint8)
    s2 = torch.full((h, i // 16), 0x30, dtype=torch.uint8)
    x = torch.randn(3, h).bfloat16()
    stages = []

    def policy(stage, acc, operands):
        stages.append((stage, tuple(acc.shape), sorted(operands)))
        return acc.exact.to(torch.float32)

    st = nvfp4_expert(
        x, w13, s13, torch.tensor(0.5), w2, s2, torch.tensor(2.0), accumulate=policy, info={"expert": 3}
    )
    assert stages[0] == ("gate_up", (3, 2 * i), ["expert", "w13", "w13_scale", "x"])
    assert stages[1] == ("down", (3, h), ["act", "expert", "w2", "w2_scale"])
    # g = RN(g_acc * 0.5) is exact (power of two) -> equals half the rounded accumulator
    assert torch.equal(st.g, st.gate_acc.exact.float() * 0.5)
    assert torch.equal(st.act.view(torch.int16), swiglu(st.g, st.u).view(torch.int16))
    assert torch.equal(st.y.view(torch.int16), down_output(st.down_acc.exact.float(), 2.0).view(torch.int16))
    # BF16 expert
    wb13 = torch.randn(2 * i, h).bfloat16()
    wb2 = torch.randn(h, i).bfloat16()
    sb = bf16_expert(x, wb13, wb2)
    assert torch.equal(sb.g, sb.gate_acc.exact.float())
    assert sb.y.shape == (3, h) and sb.act.dtype == torch.bfloat16
