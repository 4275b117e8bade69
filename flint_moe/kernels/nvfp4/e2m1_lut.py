"""A shared-memory table of the 256 code bytes' bf16 pairs for the Gluon grouped GEMMs at small row blocks.

The register decode (``grouped_gluon._DEQUANT_PAIR``) spends 7 instructions per A register: the byte select, the
bit placement (a multiply, two masks, the sign ``mad``) and two exact ``mul.rn.bf16x2`` (2^126, the scale). A
byte of two E2M1 codes has 256 values, so its unscaled bf16 pair (``E2M1`` is exact in bf16) can be read from a
table instead: one ``prmt`` builds the address (the lane's code byte times ``ENTRY_BYTES`` plus the lane's word),
one ``ld.shared`` reads the pair, one exact ``mul.rn.bf16x2`` applies the scale pair. Each entry holds 32 copies of
its pair, one per lane, ``ENTRY_BYTES`` apart: a warp's 32 reads hit 32 different banks whatever the codes.

Values: ``table[b] = (bf16(E2M1(b & 15)), bf16(E2M1(b >> 4)))``, exact; times the bf16 scale pair it is the same
``E2M1 x E4M3`` bf16 product as the register decode (one exact multiply either way), so the A registers and every
bit after them are the same.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["ENTRY_BYTES", "TABLE_BYTES", "TABLE_OFFSET", "table_selector", "fill_table", "dequant_pair_asm"]

#: Bytes between two entries: the address is (code byte) << 8 | lane * 4, built by one ``prmt``.
ENTRY_BYTES = 256
TABLE_BYTES = 256 * ENTRY_BYTES
#: The table's offset in the kernel's dynamic shared memory: it is the kernel's first and largest buffer.
TABLE_OFFSET = 0

# The unscaled bf16 pair of a byte (its two E2M1 codes), the register decode without the scale multiply:
# $1 the byte (bits 0..7).
_PAIR_OF_BYTE = gl.constexpr("""
{
.reg .b32 t, v, s, p, k;
mov.b32 k, 0x7E807E80;
and.b32 t, $1, 0xFF;
mul.lo.u32 t, t, 0x40040;
and.b32 v, t, 0x03C003C0;
and.b32 s, t, 0x02000200;
mad.lo.u32 p, s, 63, v;
mul.rn.bf16x2 $0, p, k;
}
""")

# One code word and its block's scale pair -> the A register (E2M1 * scale) of the lane's byte: $2 word, $3 the
# lane's selector (table_selector), $4 scale (s, s). prmt puts byte 2 of $3 (lane * 4) in byte 0, the code byte
# in byte 1 and byte 3 of $3 (0) in bytes 2 and 3.
_DEQUANT_LUT = """
{
.reg .b32 t, p, g, s;
prmt.b32 t, $2, $3, $3;%s
mov.u32 g, global_smem;
add.u32 t, t, g;
ld.shared.b32 p, [t+%d];
mov.b32 s, {$4, $4};
mul.rn.bf16x2 p, p, s;
mov.b32 {$0, $1}, p;
}
"""


def dequant_pair_asm(stride: int = ENTRY_BYTES) -> str:
    """The inline PTX of one table-decoded A register (inputs: word, lane selector, scale)."""
    shift = {256: "", 128: "\nshr.b32 t, t, 1;", 64: "\nshr.b32 t, t, 2;"}[stride]
    return _DEQUANT_LUT % (shift, TABLE_OFFSET)


@gluon.jit
def table_selector(R: gl.constexpr, P3: gl.constexpr, STRIDE: gl.constexpr):
    """int32 [R, 1, 4] in layout P3 (``grouped_gluon.gluon_layouts``): the ``prmt`` selector of each lane, byte 2 its
    word offset in an entry (lane * 4, lane = c + 4 (row % 8)), the low half the selector (byte 2, byte c of the
    code word, byte 3 twice)."""
    r = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, P3)))[:, None, None]
    c = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, P3)))[None, None, :]
    lane = c + 4 * (r % 8)
    return ((lane % (STRIDE // 4)) * (1024 // STRIDE)) << 16 | 0x7706 | (c << 4)


@gluon.jit
def fill_table(table_s, num_warps: gl.constexpr):
    """Write the 256 entries (32 lane copies each) into ``table_s`` int32 [256, ENTRY_BYTES / 4]."""
    W: gl.constexpr = min(32, table_s.shape[1])
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (W // 4), W // 4], [num_warps, 1], [1, 0])
    b = gl.arange(0, 256, layout=gl.SliceLayout(1, BL))
    pair = gl.inline_asm_elementwise(_PAIR_OF_BYTE, "=r,r", [b], dtype=gl.int32, is_pure=True, pack=1)
    vals = pair[:, None] + gl.zeros([256, W], gl.int32, layout=BL)
    table_s.slice(0, W, dim=1).store(vals)
