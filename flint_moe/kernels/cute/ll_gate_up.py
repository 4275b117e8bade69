"""Gate/up finish (rule steps 6-7: split sum, global scale, SwiGLU) of the low-latency decode block, and what
every CuTe DSL kernel of the block shares: the specialisation ``GateUpSpec``, the weights' addressing, the pinned
rule instructions as inline PTX. Compiled for sm_90a and its PTX audited on the CPU; bitwise on the H200
(tests/ops/test_moe_ll_gpu.py).

The split-K partial GEMV that feeds it is ``ll_partial.py`` (``nvidia-cutlass-dsl``, the ``cute`` extra; this
module imports without it and then reports the package missing from :func:`cute_available`).

- ``finish``: grid (ceil(Ip / 128), P), one thread per intermediate index i of pair q < P (routed: token
  q // k, slot q % k, expert ``ids[q]``; shared: token q, expert 0 of a one-expert view): ``g_acc = p_0 + p_1
  + ... + p_{S-1}`` of the gate row's partials in the fp32 workspace [P, S, 2*Ip] in increasing s (one fp32 RN
  per addition, ``add.rn.f32``), the same for the up row, then rule steps 6-7 with pinned instructions:
  ``g = mul.rn(g_acc, gs)``, ``u = mul.rn(u_acc, gs)``, ``act = cvt.rn.bf16(u * (g * rcp.approx.ftz(
  ex2.approx.ftz(g * c) + 1)))``. Taps: ``gate_acc`` / ``up_acc`` fp32 [P, Ip] (before the global scale),
  ``act`` bf16 [P, Ip].

Rows: the routed experts' ``FlintMoEWeights.w1`` holds [up; gate] interleaved by 64 rows (up row i at
physical row 128 * (i // 64) + i % 64, gate row i 64 rows after it); the shared expert's gate/up linear holds
[gate; up] (gate row i at i, up row i at SI + i). Scales: the 128x4 swizzle (``layouts/swizzle.py``), byte
of (row r, block c) at ``(r // 128) * Kp * 128 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 +
c % 4`` inside an expert's [Mp, Kp] block.

Limits (``GateUpSpec``): H % 16 == 0, 1 <= S <= H / 16, Ip % 64 == 0, 1 <= top_k <= min(E, 16) (1 for the
shared expert); offsets are 32-bit (E * 2Ip * H / 8 < 2^31: Kimi-K2's 384 x 4096 x 896 = 1.41e9 fits).
"""

from __future__ import annotations

import functools
import importlib.util
import types
from dataclasses import dataclass

__all__ = [
    "codes_row_word",
    "gate_up_rows",
    "scale_block_byte",
    "scale_block_shape",
    "scale_row_byte",
    "GateUpSpec",
    "PTX_FORBID",
    "cute_available",
]

_HAVE_CUTE = importlib.util.find_spec("cutlass") is not None

#: Warps (rows) per CTA of the partial kernel; threads per CTA of the finish and combine kernels.
WARPS = 4
FINISH_THREADS = 128

#: Instructions no build of the block's CuTe kernels may contain (fp64, non-ftz or refined ex2 / rcp, a
#: truncating bf16 conversion, the full-range division).
PTX_FORBID = (
    "div.full.f32",
    r"re:^\s*(@!?%p\d+\s+)?[a-z][a-z0-9_]*(\.[a-z0-9_]+)*\.f64\b",
    r"re:\bex2\.approx\.f32\b",
    r"re:\brcp\.approx\.f32\b",
    r"re:\brcp\.rn\.f32\b",
    r"re:\bcvt\.rz\.bf16",
)


def cute_available() -> tuple[bool, str]:
    """(available, reason): whether ``nvidia-cutlass-dsl`` can be imported here (compiling needs no GPU)."""
    if not _HAVE_CUTE:
        return False, "nvidia-cutlass-dsl is not installed (pip install 'flint-moe[cute]')"
    return True, ""


@dataclass(frozen=True)
class GateUpSpec:
    """One specialisation: hidden H, padded intermediate Ip, experts E of the weight tensor (1 for the shared
    expert), K-splits S, ``routed`` (interleaved [up; gate] rows, expert from ids) or shared ([gate; up]),
    ``top_k`` the pairs per token (1 for the shared expert; a constexpr of the partial kernel's pair search).
    ValueError for a value outside the module's limits."""

    hidden: int
    inter: int
    experts: int
    splits: int
    routed: bool
    top_k: int

    def __post_init__(self) -> None:
        if self.hidden <= 0 or self.hidden % 16 or not 1 <= self.splits <= self.hidden // 16:
            raise ValueError(
                f"GateUpSpec: hidden {self.hidden} must be a positive multiple of 16 with 1 <= splits "
                f"({self.splits}) <= hidden / 16"
            )
        if self.inter <= 0 or self.inter % 64:
            raise ValueError(f"GateUpSpec: intermediate {self.inter} must be a positive multiple of 64")
        if self.experts <= 0 or (not self.routed and self.experts != 1):
            raise ValueError(f"GateUpSpec: experts {self.experts} must be >= 1 (1 for the shared expert)")
        if not 1 <= self.top_k <= min(self.experts, 16) or (not self.routed and self.top_k != 1):
            raise ValueError(
                f"GateUpSpec: top_k {self.top_k} must be in [1, min(experts = {self.experts}, 16)] (1 for the shared "
                "expert)"
            )


# ---------------------------------------------------------------------------------------------------------
# Addressing: plain Python arithmetic, called by the kernels at trace time on DSL integers (so these are the
# kernels' own index computations) and by the CPU tests on Python ints against the golden model's decoders.
# ---------------------------------------------------------------------------------------------------------


def scale_block_shape(rows: int, hidden: int) -> tuple[int, int]:
    """(Mp, Kp) of one expert's swizzled scale block for ``rows`` rows of ``hidden`` columns."""
    return (rows + 127) // 128 * 128, (hidden // 16 + 3) // 4 * 4


def codes_row_word(e, row, two_ip, hidden):
    """Index of the first int32 word (8 E2M1 codes) of physical row ``row`` of expert ``e`` in the codes
    viewed as int32 [E * 2Ip * H / 8]; the codes of block ``blk`` are words ``+ 2 * blk`` and ``+ 2 * blk + 1``,
    element ``16 * blk + 8 * half + n`` in bits ``4n .. 4n + 3`` of word ``2 * blk + half`` (little-endian bytes,
    low nibble first)."""
    return (e * two_ip + row) * (hidden // 8)


def scale_row_byte(e, row, mp, kp):
    """Byte of (row, block 0) of expert ``e`` in the swizzled scales viewed as uint8 [E * Mp * Kp]."""
    return e * (mp * kp) + (row // 128) * kp * 128 + (row % 32) * 16 + ((row % 128) // 32) * 4


def scale_block_byte(blk):
    """Offset of block ``blk``'s scale from the row's block 0 (128x4 swizzle: 4 blocks per 512-byte step)."""
    return (blk // 4) * 512 + blk % 4


def gate_up_rows(i, ip, routed: bool):
    """(gate row, up row), physical, of intermediate index ``i``: the routed layout interleaves [up; gate] by 64
    rows (up row i at 128 * (i // 64) + i % 64, gate 64 rows later); the shared layout is [gate; up]."""
    if routed:
        up = (i // 64) * 128 + i % 64
        return up + 64, up
    return i, ip + i


@functools.cache
def _dsl() -> types.SimpleNamespace:
    """Import nvidia-cutlass-dsl and define the pinned-instruction helpers and the ``finish`` kernel (once):
    importing this module stays cheap and works without the package (the audit registry imports every kernel
    module)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    def _asm(result, asm: str, cons: str, args, *, loc=None, ip=None):
        """Pure inline PTX ``asm`` on Float32 operands ``args``; ``result`` (Float32 or Int32) wraps its value."""
        vals = [Float32(a).ir_value(loc=loc, ip=ip) for a in args]
        ty = T.f32() if result is Float32 else T.i32()
        return result(
            llvm.inline_asm(
                ty,
                vals,
                asm,
                cons,
                has_side_effects=False,
                is_align_stack=False,
                asm_dialect=llvm.AsmDialect.AD_ATT,
                loc=loc,
                ip=ip,
            )
        )

    def _asm_f32(asm: str, args, *, loc=None, ip=None):
        return _asm(Float32, asm, "=f," + ",".join("f" for _ in args), args, loc=loc, ip=ip)

    @dsl_user_op
    def fma_rn(a, b, c, *, loc=None, ip=None):
        return _asm_f32("fma.rn.f32 $0, $1, $2, $3;", (a, b, c), loc=loc, ip=ip)

    @dsl_user_op
    def mul_rn(a, b, *, loc=None, ip=None):
        return _asm_f32("mul.rn.f32 $0, $1, $2;", (a, b), loc=loc, ip=ip)

    @dsl_user_op
    def add_rn(a, b, *, loc=None, ip=None):
        return _asm_f32("add.rn.f32 $0, $1, $2;", (a, b), loc=loc, ip=ip)

    @dsl_user_op
    def ex2_approx_ftz(a, *, loc=None, ip=None):
        return _asm_f32("ex2.approx.ftz.f32 $0, $1;", (a,), loc=loc, ip=ip)

    @dsl_user_op
    def rcp_approx_ftz(a, *, loc=None, ip=None):
        return _asm_f32("rcp.approx.ftz.f32 $0, $1;", (a,), loc=loc, ip=ip)

    @dsl_user_op
    def bf16_bits(a, *, loc=None, ip=None):
        """``cvt.rn.bf16.f32``: the bf16 bit pattern in the low 16 bits of an Int32."""
        asm = "{ .reg .b16 h; cvt.rn.bf16.f32 h, $1; cvt.u32.u16 $0, h; }"
        return _asm(Int32, asm, "=r,f", (a,), loc=loc, ip=ip)

    @dsl_user_op
    def bits_f32(i, *, loc=None, ip=None):
        """Int32 bit pattern -> Float32 (no conversion)."""
        return Float32(llvm.bitcast(T.f32(), Int32(i).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))

    @cute.kernel
    def _finish_kernel(
        ws: cute.Tensor,  # fp32 [P * S * 2Ip]
        ids: cute.Tensor,  # int32 [P]
        gs: cute.Tensor,  # fp32 [E]
        act: cute.Tensor,  # int16 [P * Ip]: bf16 bits
        g_tap: cute.Tensor,  # fp32 [P * Ip]
        u_tap: cute.Tensor,  # fp32 [P * Ip]
        IP: cutlass.Constexpr,
        S: cutlass.Constexpr,
        ROUTED: cutlass.Constexpr,
        TAP: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bt, q, _ = cute.arch.block_idx()
        i = bt * FINISH_THREADS + tidx
        cute.arch.griddepcontrol_wait()
        if i < IP:
            e = Int32(0)
            if ROUTED:
                e = ids[q]
            g_row, u_row = gate_up_rows(i, IP, ROUTED)
            base = q * S * (2 * IP)
            g_acc = ws[base + g_row]
            u_acc = ws[base + u_row]
            for s in cutlass.range_constexpr(1, S):
                g_acc = add_rn(g_acc, ws[base + s * (2 * IP) + g_row])
                u_acc = add_rn(u_acc, ws[base + s * (2 * IP) + u_row])
            if TAP:
                g_tap[q * IP + i] = g_acc
                u_tap[q * IP + i] = u_acc
            alpha = gs[e]
            g = mul_rn(g_acc, alpha)
            u = mul_rn(u_acc, alpha)
            r = rcp_approx_ftz(add_rn(ex2_approx_ftz(mul_rn(g, Float32(-1.44269502162933349609375))), Float32(1.0)))
            act[q * IP + i] = cutlass.Int16(bf16_bits(mul_rn(u, mul_rn(g, r))))
        cute.arch.griddepcontrol_launch_dependents()

    # The DSL re-parses each @cute.jit / @cute.kernel body and resolves its names through the module's
    # globals, not the closure: publish everything defined here (only the kernels' own helpers).
    globals().update({n: v for n, v in locals().items() if not n.startswith("__")})
    return types.SimpleNamespace(**{n: v for n, v in locals().items() if not n.startswith("__")})
