"""Random logical expert tensors for the layout tests (small; bytes drawn from a seeded generator)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn


def gen(seed: int):
    return torch.Generator().manual_seed(seed)


def u8(shape, g, hi: int = 256) -> torch.Tensor:
    return torch.randint(0, hi, shape, dtype=torch.uint8, generator=g)


def e4m3_scales(shape, g) -> torch.Tensor:
    """Finite E4M3 bytes (no 0x7F / 0xFF), signs included, as float8_e4m3fn."""
    b = u8(shape, g, 0x7F)
    sign = u8(shape, g, 2) << 7
    return (b | sign).view(FP8)


def nvfp4(E: int, H: int, I: int, seed: int):
    g = gen(seed)
    return (
        u8((E, 2 * I, H // 2), g), e4m3_scales((E, 2 * I, H // 16), g),
        u8((E, H, I // 2), g), e4m3_scales((E, H, I // 16), g),
    )  # fmt: skip


def bf16(E: int, H: int, I: int, seed: int):
    g = gen(seed)

    # all 16-bit patterns except NaNs (so torch.equal on bf16 is meaningful too)
    def t(shape):
        x = torch.randint(-(2**15), 2**15, shape, dtype=torch.int32, generator=g).to(torch.int16)
        x = torch.where((x & 0x7F80) == 0x7F80, x & ~0x0080, x)
        return x.view(torch.bfloat16)

    return t((E, 2 * I, H)), t((E, H, I))


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern view for exact comparison."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))
