"""CuTe DSL split-K NVFP4 gate/up GEMV of the low-latency decode block (rule steps 5-7): a first version,
compiled for sm_90 and its PTX audited on the CPU, bitwise on the H200 (tests/ops/test_moe_ll_gpu.py); not yet tuned.

Two kernels (``nvidia-cutlass-dsl``, the ``cute`` extra; this module imports without it and then reports
the package missing from :func:`cute_available`):

- ``partial``: grid (2*Ip / WARPS, S, P), WARPS warps per CTA, one warp per physical weight row. Pair q < P
  is (token q // k, selected slot q % k) for the routed experts (expert ``ids[q]``), or one token for the
  shared expert (expert 0 of a one-expert view). K-split s covers the 16-element blocks
  [s * BPS, (s + 1) * BPS) of the row (BPS = ceil(H / 16 / S); the last split may hold fewer). Lane l of the
  warp takes the blocks s * BPS + l, + 32, ... below (s + 1) * BPS (and below K / 16) in increasing order;
  per block it decodes the 16 E2M1 codes and the E4M3 scale exactly (:func:`decode_e2m1` /
  :func:`decode_e4m3`: bit moves and one ``mul.rn.f32`` by a power of two),
  ``w = mul.rn(e2m1, e4m3)`` (exact in fp32) and
  ``acc = fma.rn.f32(x_h, w, acc)`` for h ascending (x bf16 widened exactly, the product exact in fp32 unless
  it underflows). The 32 lane sums are reduced by a butterfly (``shfl.sync.bfly`` with offsets 16, 8, 4, 2,
  1: after the level of offset o lane l holds RN(v_l + v_{l^o}), the same in both lanes since fp32 addition
  is commutative), and lane 0 writes the row's partial to the fp32 workspace [P, S, 2*Ip].
- ``finish``: grid (ceil(Ip / 128), P), one thread per intermediate index i: ``g_acc = p_0 + p_1 + ... +
  p_{S-1}`` of the gate row's partials in increasing s (one fp32 RN per addition, ``add.rn.f32``), the same
  for the up row, then rule steps 6-7 with pinned instructions: ``g = mul.rn(g_acc, gs)``, ``u = mul.rn(u_acc,
  gs)``, ``act = cvt.rn.bf16(u * (g * rcp.approx.ftz(ex2.approx.ftz(g * c) + 1)))``. Taps: ``gate_acc`` /
  ``up_acc`` fp32 [P, Ip] (before the global scale), ``act`` bf16 [P, Ip].

Rows: the routed experts' ``FlintMoEWeights.w1`` holds [up; gate] interleaved by 64 rows (up row i at
physical row 128 * (i // 64) + i % 64, gate row i 64 rows after it); the shared expert's gate/up linear holds
[gate; up] (gate row i at i, up row i at SI + i). Scales: the 128x4 swizzle (``layouts/swizzle.py``), byte
of (row r, block c) at ``(r // 128) * Kp * 128 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 +
c % 4`` inside an expert's [Mp, Kp] block.

Limits: H % 16 == 0, 1 <= S <= H / 16 (a lane past its split's last block reads nothing), Ip % 64 == 0;
offsets are 32-bit (E * 2Ip * H / 8 < 2^31: Kimi-K2's 384 x 4096 x 896 = 1.41e9 fits).

Ran on the H200 bitwise (tests/ops/test_moe_ll_gpu.py). Not done yet: the conformance path on the GPU, tuning
(one warp per row and byte-wise scale loads are the simplest mapping, not a fast one), fusing ``finish`` into
``partial`` (last CTA of a row tile by an atomic ticket), the taps' place in the block op.
"""

from __future__ import annotations

import functools
import importlib.util
import tempfile
import types
from dataclasses import dataclass

__all__ = [
    "AUDIT_SPECS",
    "codes_row_word",
    "gate_up_rows",
    "scale_block_byte",
    "scale_block_shape",
    "scale_row_byte",
    "GateUpSpec",
    "PTX_FORBID",
    "PTX_REQUIRE",
    "audit_gate_up",
    "compile_gate_up",
    "cute_available",
    "decode_e2m1",
    "decode_e4m3",
]

_HAVE_CUTE = importlib.util.find_spec("cutlass") is not None

#: Warps (rows) per CTA of the partial kernel; threads per CTA of the finish kernel.
WARPS = 4
FINISH_THREADS = 128

#: Instructions the generated PTX must contain (rule steps 5-7 pinned) and must not (see module docstring).
PTX_REQUIRE = (
    "fma.rn.f32", "mul.rn.f32", "add.rn.f32", "ex2.approx.ftz.f32", "rcp.approx.ftz.f32", "cvt.rn.bf16.f32",
    "shfl.sync.bfly.b32", "griddepcontrol.wait", "griddepcontrol.launch_dependents",
)  # fmt: skip
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
    expert), K-splits S, ``routed`` (interleaved [up; gate] rows, expert from ids) or shared ([gate; up])."""

    hidden: int
    inter: int
    experts: int
    splits: int
    routed: bool

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


#: fp32 scale factors that turn the fp32 read of a code's bits into its value (exact powers of two).
E2M1_SCALE = 2.0**126
E4M3_SCALE = 2.0**120


def decode_e2m1(c, as_f32, mul):
    """Exact fp32 value of the E2M1 nibble ``c`` (bit 3 sign, 2-bit exponent, 1-bit mantissa): its sign moved
    to bit 31 and exponent + mantissa to bits 22-24 read as an fp32 (a subnormal for exponent 0) times 2^126,
    ``mul(as_f32(bits), E2M1_SCALE)``. ``as_f32``: int bit pattern -> fp32; ``mul``: an fp32 multiply that keeps
    subnormal inputs (no flush to zero). Branch-free, so the kernels trace it on DSL integers."""
    return mul(as_f32(((c & 8) << 28) | ((c & 7) << 22)), E2M1_SCALE)


def decode_e4m3(s, as_f32, mul):
    """Exact fp32 value of the E4M3 byte ``s`` (bit 7 sign, 4-bit exponent with bias 7, 3-bit mantissa; the NaN
    bytes 0x7F / 0xFF are refused by the weights' checks): exponent + mantissa moved to bits 20-26 read as an
    fp32 times 2^120 (bias 127 - 7), subnormal bytes included. ``s`` may be sign-extended (only bits 0-7 are
    read); ``as_f32`` and ``mul`` as :func:`decode_e2m1`."""
    return mul(as_f32(((s & 0x80) << 24) | ((s & 0x7F) << 20)), E4M3_SCALE)


@functools.cache
def _dsl() -> types.SimpleNamespace:
    """Import nvidia-cutlass-dsl and define the kernels (once): importing this module stays cheap and works
    without the package (the audit registry imports every kernel module)."""
    import cuda.bindings.driver as cuda
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
    def _partial_kernel(
        x: cute.Tensor,  # bf16 [rows of K] (flat): the tokens' xn (gate/up) or the pairs' act (down)
        ids: cute.Tensor,  # int32 [P] (routed: the selected experts, flattened [M, k]; shared: unused)
        w: cute.Tensor,  # int32 [E * N * K / 8]: codes, 8 per word
        sf: cute.Tensor,  # uint8 [E * Mp * Kp]: swizzled scales
        ws: cute.Tensor,  # fp32 [P * S * N]
        top_k: Int32,
        K: cutlass.Constexpr,  # reduction length (stored)
        N: cutlass.Constexpr,  # rows
        KV: cutlass.Constexpr,  # valid reduction length (K minus padding), a multiple of 16
        S: cutlass.Constexpr,
        ROUTED: cutlass.Constexpr,
        X_BY_PAIR: cutlass.Constexpr,  # x row of pair q: q (down; the shared expert) or q // top_k (gate/up)
    ):
        tidx, _, _ = cute.arch.thread_idx()
        rt, s, q = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        row = rt * WARPS + warp
        cute.arch.griddepcontrol_wait()
        e = Int32(0)
        xr = q
        if ROUTED:
            e = ids[q]
            if not X_BY_PAIR:
                xr = q // top_k
        bps = (K // 16 + S - 1) // S  # blocks per split (the last split may hold fewer)
        mp, kp = scale_block_shape(N, K)
        w_row = codes_row_word(e, row, N, K)
        sf_row = scale_row_byte(e, row, mp, kp)
        x_row = xr * K
        acc = Float32(0.0)
        for j in range((bps + 31) // 32):
            jb = j * 32 + lane
            blk = s * bps + jb
            if jb < bps:  # a lane past its split's last block reads nothing
                if blk * 16 < KV:  # padding columns (any bytes) and blocks past K are never read
                    sc = decode_e4m3(Int32(sf[sf_row + scale_block_byte(blk)]), bits_f32, mul_rn)
                    for half in cutlass.range_constexpr(2):
                        word = Int32(w[w_row + blk * 2 + half])
                        for n in cutlass.range_constexpr(8):
                            h = blk * 16 + half * 8 + n
                            wv = mul_rn(decode_e2m1((word >> (4 * n)) & 15, bits_f32, mul_rn), sc)
                            acc = fma_rn(Float32(x[x_row + h]), wv, acc)
        for lvl in cutlass.range_constexpr(5):
            acc = add_rn(acc, cute.arch.shuffle_sync_bfly(acc, offset=16 >> lvl))
        if lane == 0:
            ws[(q * S + s) * N + row] = acc
        cute.arch.griddepcontrol_launch_dependents()

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

    @cute.jit
    def _gate_up_host(
        x: cute.Tensor,
        ids: cute.Tensor,
        w: cute.Tensor,
        sf: cute.Tensor,
        gs: cute.Tensor,
        ws: cute.Tensor,
        act: cute.Tensor,
        g_tap: cute.Tensor,
        u_tap: cute.Tensor,
        pairs: Int32,
        top_k: Int32,
        H: cutlass.Constexpr,
        IP: cutlass.Constexpr,
        S: cutlass.Constexpr,
        ROUTED: cutlass.Constexpr,
        TAP: cutlass.Constexpr,
        stream: cuda.CUstream,
    ):
        _partial_kernel(x, ids, w, sf, ws, top_k, H, 2 * IP, H, S, ROUTED, False).launch(
            grid=[2 * IP // WARPS, S, pairs], block=[32 * WARPS, 1, 1], stream=stream, use_pdl=True
        )
        _finish_kernel(ws, ids, gs, act, g_tap, u_tap, IP, S, ROUTED, TAP).launch(
            grid=[(IP + FINISH_THREADS - 1) // FINISH_THREADS, pairs, 1],
            block=[FINISH_THREADS, 1, 1],
            stream=stream,
            use_pdl=True,
        )

    # The DSL re-parses each @cute.jit / @cute.kernel body and resolves its names through the module's
    # globals, not the closure: publish everything defined here (only the kernels' own helpers).
    globals().update({n: v for n, v in locals().items() if not n.startswith("__")})
    return types.SimpleNamespace(**{n: v for n, v in locals().items() if not n.startswith("__")}, host=_gate_up_host)


#: The block's shapes with a shared expert (name -> spec): routed and shared gate/up of DeepSeek-V3 (and
#: Kimi-K2's 384 experts), GLM-4.5 and Ling-mini-2.0, with a K-split each shape allows.
AUDIT_SPECS = {
    "dsv3.routed.S2": GateUpSpec(7168, 2048, 256, 2, True),
    "dsv3.shared.S7": GateUpSpec(7168, 2048, 1, 7, False),
    "kimi.routed.S2": GateUpSpec(7168, 2048, 384, 2, True),
    "glm45.routed.S2": GateUpSpec(5120, 1536, 160, 2, True),
    "glm45.shared.S5": GateUpSpec(5120, 1536, 1, 5, False),
    "ling.routed.S4": GateUpSpec(2048, 512, 256, 4, True),
    "ling.shared.S4": GateUpSpec(2048, 512, 1, 4, False),
    "glm45.routed.S3": GateUpSpec(5120, 1536, 160, 3, True),  # 107 blocks per split: a lane tail
}


def compile_gate_up(spec: GateUpSpec, pairs: int = 8, *, tap: bool = False, arch: str = "sm_90a"):
    """Compile ``spec`` for ``arch`` (no GPU needed) with placeholder CPU tensors of the right dtypes and
    sizes for ``pairs`` (token, expert) pairs; returns the compiled function (``.artifacts.PTX`` holds the
    PTX, ``.artifacts.CUBIN`` the cubin). Raises RuntimeError when nvidia-cutlass-dsl is missing."""
    ok, why = cute_available()
    if not ok:
        raise RuntimeError(why)
    import torch

    ns = _dsl()
    from cutlass.cute.runtime import from_dlpack

    h, ip, e, s = spec.hidden, spec.inter, spec.experts, spec.splits
    mp, kp = scale_block_shape(2 * ip, h)
    m = pairs
    t = {
        "x": torch.zeros(m * h, dtype=torch.bfloat16),
        "ids": torch.zeros(pairs, dtype=torch.int32),
        "w": torch.zeros(e * 2 * ip * h // 8, dtype=torch.int32),
        "sf": torch.zeros(e * mp * kp, dtype=torch.uint8),
        "gs": torch.ones(e, dtype=torch.float32),
        "ws": torch.zeros(pairs * s * 2 * ip, dtype=torch.float32),
        "act": torch.zeros(pairs * ip, dtype=torch.int16),
        "g_tap": torch.zeros(pairs * ip, dtype=torch.float32),
        "u_tap": torch.zeros(pairs * ip, dtype=torch.float32),
    }
    args = [from_dlpack(v).mark_layout_dynamic() for v in t.values()]
    # the PTX text is kept in .artifacts only when it is dumped (4.8.1); the directory must exist
    with tempfile.TemporaryDirectory(prefix="flint-cute-") as d:
        opts = f"--gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {d}"
        stream = ns.cuda.CUstream(0)
        return ns.cute.compile(ns.host, *args, pairs, 1, h, ip, s, spec.routed, tap, stream, options=opts)


def audit_gate_up(spec: GateUpSpec, *, tap: bool = False) -> list[str]:
    """Problems of ``spec``'s sm_90 PTX against :data:`PTX_REQUIRE` / :data:`PTX_FORBID` (empty: passes)."""
    from flint_moe.kernels.audit.ptx import audit_ptx

    fn = compile_gate_up(spec, tap=tap)
    return audit_ptx(fn.artifacts.PTX, PTX_REQUIRE, PTX_FORBID)
