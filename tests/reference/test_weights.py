"""Weight containers (flint_moe/reference/weights.py): layouts, validation messages, no copies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flint_moe.reference.weights import BF16Experts, NVFP4Experts, NVFP4Linear, check_scale_bytes, scale_bytes

E, I, H = 3, 32, 48  # I and H multiples of 16, H not a power of two


def _bytes(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)


def _scales(*shape: int, seed: int = 0) -> torch.Tensor:
    # every byte valid except the NaN ones: map 0x7F -> 0x7E and 0xFF -> 0xFE
    b = _bytes(*shape, seed=seed)
    return torch.where((b & 0x7F) == 0x7F, b - 1, b)


def _experts(**override: torch.Tensor) -> dict[str, torch.Tensor]:
    parts = dict(
        w13=_bytes(E, 2 * I, H // 2, seed=1),
        w13_scale=_scales(E, 2 * I, H // 16, seed=2),
        w13_gs=torch.rand(E),
        w2=_bytes(E, H, I // 2, seed=3),
        w2_scale=_scales(E, H, I // 16, seed=4),
        w2_gs=torch.rand(E),
    )
    parts.update(override)
    return parts


def test_nvfp4_experts_valid_and_stored_as_given() -> None:
    parts = _experts()
    keep = {k: v.clone() for k, v in parts.items()}
    ex = NVFP4Experts(**parts)
    assert (ex.num_experts, ex.hidden, ex.intermediate) == (E, H, I)
    for k, v in parts.items():
        assert getattr(ex, k) is v  # no copy
        assert torch.equal(v, keep[k])  # not modified
    assert torch.equal(ex.w13_scale_bytes(), parts["w13_scale"])
    # float8_e4m3fn scales are accepted, stored as given, and give the same bytes
    f8 = _experts(w13_scale=parts["w13_scale"].view(torch.float8_e4m3fn),
                  w2_scale=parts["w2_scale"].view(torch.float8_e4m3fn))
    ex8 = NVFP4Experts(**f8)
    assert ex8.w2_scale.dtype == torch.float8_e4m3fn
    assert ex8.w2_scale_bytes().dtype == torch.uint8
    assert torch.equal(ex8.w2_scale_bytes(), parts["w2_scale"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.w13 = parts["w13"]  # type: ignore[misc]


def test_negative_and_minus_zero_scale_bytes_are_valid() -> None:
    s = torch.full((E, H, I // 16), 0x80, dtype=torch.uint8)
    s[0, 0, 0] = 0xFE  # -448
    NVFP4Experts(**_experts(w2_scale=s))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize(("name", "index", "byte"), [("w13_scale", (1, 5, 2), 0x7F), ("w2_scale", (2, 0, 1), 0xFF)])
def test_nan_scale_bytes_rejected(name: str, index: tuple[int, ...], byte: int, dtype: torch.dtype) -> None:
    parts = _experts()
    bad = parts[name].clone()
    bad[index] = byte
    bad[-1, -1, -1] = 0x7F  # a later one: the first (row-major) is reported
    parts[name] = bad.view(dtype)
    msg = rf"^{name}: E4M3 NaN scale byte 0x{byte:02X} at index \({index[0]}, {index[1]}, {index[2]}\)"
    with pytest.raises(ValueError, match=msg):
        NVFP4Experts(**parts)


@pytest.mark.parametrize(
    ("override", "exc", "match"),
    [
        (dict(w13=torch.zeros(E, 2 * I, H // 2, dtype=torch.int8)), TypeError, r"^w13: dtype must be torch.uint8"),
        (dict(w13=_bytes(2 * I, H // 2)), ValueError, r"^w13: expected 3 dimensions"),
        (dict(w13=_bytes(E, 2 * I, 4), w13_scale=_scales(E, 2 * I, 0)), ValueError,
         r"^w13: unpacked row length \(2 x last dimension\) 8 must be a positive multiple of 16"),
        (dict(w13=_bytes(E, 2 * I + 1, H // 2)), ValueError, r"^w13: dimension 1 holds \[gate; up\]"),
        (dict(w13=_bytes(E, 2 * 8, H // 2), w13_scale=_scales(E, 16, H // 16)), ValueError,
         r"^w13: intermediate size I \(half of dimension 1\) 8 must be a positive multiple of 16"),
        (dict(w13_scale=_scales(E, 2 * I, H // 16 + 1)), ValueError, r"^w13_scale: dimension 2 must be 3"),
        (dict(w13_scale=torch.zeros(E, 2 * I, H // 16)), TypeError, r"^w13_scale: dtype must be torch.uint8 or"),
        (dict(w13_gs=torch.ones(E + 1)), ValueError, r"^w13_gs: dimension 0 must be 3"),
        (dict(w13_gs=torch.ones(E, dtype=torch.bfloat16)), TypeError, r"^w13_gs: dtype must be torch.float32"),
        (dict(w2=_bytes(E + 1, H, I // 2)), ValueError, r"^w2: dimension 0 must be 3"),
        (dict(w2=_bytes(E, H, I)), ValueError, r"^w2: dimension 2 must be 16"),
        (dict(w2_scale=_scales(E, H - 1, I // 16)), ValueError, r"^w2_scale: dimension 1 must be 48"),
        (dict(w2_gs=torch.ones(())), ValueError, r"^w2_gs: expected 1 dimensions"),
        (dict(w2_gs=[1.0, 1.0, 1.0]), TypeError, r"^w2_gs: expected a torch.Tensor"),
    ],
)
def test_nvfp4_experts_bad_input(override: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        NVFP4Experts(**_experts(**override))


def test_nvfp4_linear() -> None:
    codes, scale, gs = _bytes(40, 24), _scales(40, 3), torch.tensor(0.5)
    lin = NVFP4Linear(codes, scale.view(torch.float8_e4m3fn), gs)
    assert (lin.out_features, lin.in_features) == (40, 48)
    assert lin.codes is codes and lin.global_scale is gs
    assert torch.equal(lin.scale_bytes(), scale)
    with pytest.raises(ValueError, match=r"^global_scale: expected 0 dimensions"):
        NVFP4Linear(codes, scale, torch.ones(1))
    with pytest.raises(TypeError, match=r"^global_scale: dtype must be torch.float32"):
        NVFP4Linear(codes, scale, torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^codes: unpacked row length .* 20 must be a positive multiple of 16"):
        NVFP4Linear(_bytes(40, 10), _scales(40, 1), gs)
    with pytest.raises(ValueError, match=r"^block_scale: dimension 1 must be 3"):
        NVFP4Linear(codes, _scales(40, 6), gs)
    bad = scale.clone()
    bad[7, 2] = 0xFF
    with pytest.raises(ValueError, match=r"^block_scale: E4M3 NaN scale byte 0xFF at index \(7, 2\)"):
        NVFP4Linear(codes, bad, gs)


def test_bf16_experts() -> None:
    w13 = torch.randn(E, 2 * 5, 7).bfloat16()  # BF16: no multiple-of-16 requirement
    w2 = torch.randn(E, 7, 5).bfloat16()
    ex = BF16Experts(w13, w2)
    assert (ex.num_experts, ex.hidden, ex.intermediate) == (E, 7, 5)
    assert ex.w13 is w13 and ex.w2 is w2
    with pytest.raises(TypeError, match=r"^w13: dtype must be torch.bfloat16, got torch.float32"):
        BF16Experts(w13.float(), w2)
    with pytest.raises(ValueError, match=r"^w2: dimension 2 must be 5"):
        BF16Experts(w13, torch.randn(E, 7, 6).bfloat16())
    with pytest.raises(ValueError, match=r"^w13: dimension 1 holds \[gate; up\]"):
        BF16Experts(torch.randn(E, 9, 7).bfloat16(), w2)
    with pytest.raises(ValueError, match=r"^w2: expected 3 dimensions"):
        BF16Experts(w13, torch.randn(7, 5).bfloat16())


def test_scale_helpers() -> None:
    s = _scales(4, 4)
    assert scale_bytes(s) is s
    assert torch.equal(scale_bytes(s.view(torch.float8_e4m3fn)), s)
    with pytest.raises(TypeError, match=r"^scale: dtype"):
        scale_bytes(torch.zeros(2))
    check_scale_bytes("t", s)
    s[3, 1] = 0x7F
    with pytest.raises(ValueError, match=r"^t: E4M3 NaN scale byte 0x7F at index \(3, 1\)"):
        check_scale_bytes("t", s)


@pytest.mark.gpu
def test_device_mismatch_rejected() -> None:
    parts = _experts(w2_gs=torch.rand(E).cuda())
    with pytest.raises(ValueError, match=r"^w2_gs: on cuda"):
        NVFP4Experts(**parts)
    NVFP4Experts(**{k: v.cuda() for k, v in _experts().items()})
