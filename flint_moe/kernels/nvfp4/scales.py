"""NVFP4 block scales as the decode kernels read them: 128x4-swizzled E4M3 bytes (docs/layouts.md)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["swizzled_scale_offsets", "e4m3_to_f32"]


@triton.jit
def swizzled_scale_offsets(rows, cols, KP: tl.constexpr):
    """Byte offsets inside one expert's 128x4-swizzled scale block of (row, scale column) pairs.

    ``(r // 128) * (KP / 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``
    (docs/layouts.md); ``rows`` [R, 1] or [R], ``cols`` broadcastable; KP = roundup(K / 16, 4).
    """
    return (rows // 128) * (KP // 4 * 512) + (cols // 4) * 512 + (rows % 32) * 16 + ((rows % 128) // 32) * 4 + cols % 4


@triton.jit
def e4m3_to_f32(b):
    """E4M3 bytes (int32 0..255) -> exact fp32 (negative and -0 bytes decode as such; NaN bytes are rejected
    by the loaders). Bit arithmetic: exponent field 0 -> subnormal ``m * 2^-9``, else ``(8 + m) * 2^(e-10)``,
    built as fp32 bits ``((b & 0x7F) << 20) * 2^120`` (exact), with the sign moved to bit 31."""
    bits = ((b & 0x7F) << 20) | ((b & 0x80) << 24)
    return bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120
