"""NVFP4 decode gate/up GEMV + SwiGLU on FlashInfer's CuTe-DSL W4A16 layout (rule steps 5-7).

One program computes ``BN`` intermediate columns of one (token, selected expert) pair: the ``BN`` up rows and
the ``BN`` gate rows of those columns, read in place from ``FlintMoEWeights.w1`` (uint8 [E, 2Ip, H/2], [up;
gate] interleaved by 64 rows) and its 128x4-swizzled E4M3 scales, then the rule's global scale on the fp32
accumulators and the SwiGLU epilogue with the pinned PTX approximations. Seed: ``_gate_up_gemv_kernel`` of
``vllm.models.flint.ops.moe`` (semantics only; this kernel adds an exact sm_90 E2M1 decode, the block
grouping, the rule's PTX instructions, a documented summation order, taps, 64-bit offsets and H not a power
of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import check_op_tensor, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn, ex2_approx_ftz, rcp_approx_ftz
from flint_moe.kernels.audit.registry import BF16_CVT, register_audit
from flint_moe.kernels.nvfp4.gemv import (
    code_partials as _partials,
    e4m3_to_f32,
    load_bytes,
    load_codes as _load_codes,
    load_words,
    mma_gemv,
    mma_sum_parts,
    mma_tile_rows,
    swizzled_scale_offsets,
)
from flint_moe.kernels.nvfp4.tuned import GATE_UP as _TUNED_GATE_UP, GATE_UP_BY_SHAPE as _TUNED_GATE_UP_BY_SHAPE

__all__ = ["GATE_UP_CONFIG", "SWIGLU_C", "nvfp4_gate_up", "default_config", "accumulation_model", "audit_specs"]


def _check_shape_overrides(base: dict, by_shape: dict, name: str) -> None:
    """Per-shape tuned overrides ((H, I) -> dict) may change the launch configuration only, never the path
    (``MMA``): ``accumulation_model(config)`` must not depend on the shape."""
    for shape, over in by_shape.items():
        if set(over) - set(base):
            raise ValueError(f"{name}[{shape}]: unknown config keys {sorted(set(over) - set(base))}")
        if bool(over.get("MMA", base["MMA"])) != bool(base["MMA"]):
            raise ValueError(f"{name}[{shape}]: may not change MMA (the accumulation path) from the default")


#: Launch configuration: ``BN`` intermediate columns per program (a divisor of 64), ``BKB`` code bytes of a
#: row per K step (a power of two >= 64; each thread holds 16 consecutive bytes = 32 codes = 2 blocks of a
#: row), ``num_warps``, ``PREFETCH`` (load step s + 1's codes and scales before step s's arithmetic; measured
#: slower on the H200: 91 vs 61 us at DeepSeek-V3 M=1), ``WORDS`` (codes loaded and carried as int32 words
#: [R, BKB / 4], decoded 8 codes per asm call with no byte unpack / ``prmt`` re-pack; same values and order;
#: with PREFETCH it cuts the prefetch build from 253 to 182 registers (BN 8 / 2 warps) and 91 to 73 us, but no
#: WORDS variant beat the default at both M = 1 and M = 8: docs/kernels/nvfp4-decode.md, the WORDS sweep).
#: ``BKB`` fixes the summation order (see the kernel docstring); ``BN``, ``num_warps``, ``PREFETCH`` and
#: ``WORDS`` do not change a bit. Chosen on the H200 by ``benchmarks/bench_decode_nvfp4.py``.
#: ``MMA`` selects the tensor-core path (``nvfp4.gemv.mma_rows``: no block regrouping, FP32_TRUNCATE bound) with
#: ``RT`` rows per thread, ``S`` 64-byte sub-steps per asm call, ``SK`` K-parts (2 * BN * SK = 8 * num_warps *
#: RT), ``LATE`` (launch the dependent grid after the K loop), ``PF`` (register prefetch of the next call's
#: codes and scales), ``L2PF`` (D > 0: ``prefetch.global.L2`` of the codes D calls ahead) and ``FENCE`` (all
#: code / scale loads of an asm call issued before its first decode); only SK changes bits within the MMA path.
#: The tuned values (``nvfp4_tuned.GATE_UP``) override the base values below, and
#: ``nvfp4_tuned.GATE_UP_BY_SHAPE[(H, I)]`` those at one shape (``default_config``).
GATE_UP_CONFIG = {
    "BN": 8, "BKB": 512, "num_warps": 2, "PREFETCH": False, "WORDS": False,
    "MMA": False, "RT": 2, "S": 4, "SK": 1, "LATE": False, "PF": False, "L2PF": 0,
    "FENCE": False,
}  # fmt: skip
GATE_UP_CONFIG.update(_TUNED_GATE_UP)
_check_shape_overrides(GATE_UP_CONFIG, _TUNED_GATE_UP_BY_SHAPE, "nvfp4_tuned.GATE_UP_BY_SHAPE")

#: Rule step 7 constant c = fp32(-log2(e)) (bits 0xBFB8AA3B), exact in fp32.
SWIGLU_C = -1.44269502162933349609375
_C = tl.constexpr(SWIGLU_C)


@triton.jit
def _nvfp4_gate_up_kernel(
    x_ptr,  # int32 [M, H / 2]: x (bf16 [M, H]) as bf16 pairs
    ids_ptr,  # int32 [M * TOPK]: expert of pair p = t * TOPK + j
    w_ptr,  # uint8 w1 [E, 2 * IP, H / 2]
    s_ptr,  # uint8 w1 scales, 128x4 swizzle [E, 2 * IP, KP]
    alpha_ptr,  # fp32 [E]: gate/up global scale
    act_ptr,  # bf16 [M * TOPK, INTER] (out)
    gacc_ptr,  # fp32 [M * TOPK, INTER] (out, TAP only)
    uacc_ptr,  # fp32 [M * TOPK, INTER] (out, TAP only)
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BN: tl.constexpr,
    BKB: tl.constexpr,
    ASM: tl.constexpr,
    DECODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    WORDS: tl.constexpr,
    MMA: tl.constexpr,
    RT: tl.constexpr,
    S: tl.constexpr,
    SK: tl.constexpr,
    NW: tl.constexpr,
    LATE: tl.constexpr,
    PF: tl.constexpr,
    L2PF: tl.constexpr,
    FENCE: tl.constexpr,
    TAP: tl.constexpr,
):
    """act[p, n] = bf16(RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1))))), g = RN(g_acc * gs), u = RN(u_acc * gs).

    Grid ``(M * TOPK, cdiv(INTER, BN))``: program (p, q) handles pair p and columns n in [q*BN, q*BN + BN)
    (n < INTER, the valid intermediate size; padded rows are never read). Up row of n: ``(n // 64) * 128 +
    n % 64``; gate row: that + 64. Tile rows r = 2 * (n - q*BN) + {0: up, 1: gate}.

    Summation order of g_acc / u_acc (one row, length H; element h, block b = h // 16, byte = h // 2):
    the tile covers ``BKB`` bytes (``BKB / 8`` blocks) of the row per K step; a thread holds 16 consecutive
    bytes (blocks 2L, 2L + 1 of the step, lane L = 0..BKB/16 - 1 of the row's warp-slice) and keeps one
    fp32 accumulator per block slot. For each block: ``s = sum_{q=0..15} E2M1(code) * x`` sequentially in
    element order (exact products), then ``acc[slot] = fma(s, scale_b, acc[slot])`` (starting from +0), for
    the K steps in increasing order. The last step may be partial (``H / 2`` not a multiple of ``BKB``): its
    missing blocks add exact zeros. Then ``tl.sum`` over the step's ``BKB / 8`` slots: each thread adds its
    two slots (slot 2L + 1 to slot 2L), then a butterfly across the ``BKB / 16`` lanes (xor 16, 8, 4, 2, 1,
    as many as the lanes span; every lane ends with the same bits). Bound: block model (B = 16) of
    ``flint_moe.reference.exact`` (the fma makes the scale multiply and the outer add one rounding).

    ``MMA`` (tensor cores; ``nvfp4.gemv.mma_rows``): no block regrouping. Each weight is dequantised exactly
    to bf16 as ``E2M1 * E4M3 * 2^-8`` (rule step 5 up to the exact power of two) and the row's products with
    x are accumulated by chained ``mma.sync.m16n8k16`` (bf16 inputs, fp32 accumulator, from +0): per K step of
    64 bytes the thread's 16-byte chunk c (lane % 4) of its rows, 8 MMAs per chunk in a fixed sequence, each
    adding 16 products (4 from each of the 4 chunks of the step) to the running sum in the hardware's internal
    order with its truncating alignment; K steps in increasing order; finally ``g_acc = acc * 2^8`` (exact).
    With ``SK`` > 1 the row is split into SK K-parts (``mma_part_bytes(H / 2, SK)`` bytes each, the last one the
    rest) summed that way by different warps, then the SK part sums (each times 2^8) are added as ``p0 + p1`` /
    ``(p0 + p1) + (p2 + p3)`` (``mma_sum_parts``).
    Bound: the plain any-order model with tensor-core truncation, ``FP32_TRUNCATE`` (u = 2^-23, d = H).

    Rule steps: 6 (global scale on the fp32 accumulator), 7 (SwiGLU: ``mul``, ``ex2.approx.ftz.f32``, ``add``,
    ``rcp.approx.ftz.f32``, ``mul``, ``mul``, ``cvt.rn.bf16.f32``). TAP: also store g_acc / u_acc.
    """
    gdc_wait()
    if not LATE:
        gdc_launch_dependents()
    HB: tl.constexpr = H // 2  # code bytes (and x bf16 pairs) per row
    KP: tl.constexpr = (H // 16 + 3) // 4 * 4  # swizzled scale columns
    R: tl.constexpr = 2 * BN
    NB: tl.constexpr = BKB // 8  # blocks per K step
    p = tl.program_id(0)
    q = tl.program_id(1)
    t = p // TOPK
    e = tl.load(ids_ptr + p).to(tl.int64)
    r = tl.arange(0, R)
    n = q * BN + r // 2
    row_ok = n < INTER
    prow = (n // 64) * 128 + n % 64 + (r % 2) * 64  # physical row in w1
    w_row = w_ptr + e * (2 * IP * HB) + prow.to(tl.int64) * HB  # [R] row base pointers (64-bit)
    s_row = s_ptr + e * (2 * IP * KP)
    x_row = x_ptr + t.to(tl.int64) * HB
    FULL: tl.constexpr = HB // BKB * BKB  # bytes covered by full K steps
    if MMA:  # tile of 2 * BN * SK rows: (local row i, K-part), NW warps, RT rows per thread
        TR: tl.constexpr = R * SK
        i, kpart = mma_tile_rows(TR, NW, SK)
        n_i = q * BN + i // 2
        pr = tl.where(n_i < INTER, (n_i // 64) * 128 + n_i % 64 + (i % 2) * 64, 0)  # masked columns read row 0
        tt = mma_gemv(
            w_ptr + e * (2 * IP * HB),
            pr.to(tl.int64) * HB,
            s_row,
            pr,
            x_row,
            kpart,
            HB,
            KP,
            TR,
            RT,
            S,
            SK,
            t,
            PF,
            L2PF,
            FENCE,
            tl.minimum(e.to(tl.int32), 0),  # ids are >= 0: an opaque zero for FENCE
        )
        tot = mma_sum_parts(tt, TR, NW, SK)  # [R], row r = 2 (n - q BN) + {0: up, 1: gate}
    else:
        s_off = swizzled_scale_offsets(prow[:, None], tl.arange(0, NB)[None, :], KP)  # scale offsets of step 0
        acc = tl.full([R, NB], 0.0, tl.float32)
        ar = tl.arange(0, BKB)
        if WORDS:  # codes as int32 words (HB is a multiple of 16, so every row starts 16-byte aligned)
            w_off = tl.multiple_of(e * (2 * IP * HB // 4) + prow.to(tl.int64) * (HB // 4), 4)  # 16-byte aligned
            w_row = w_ptr.to(tl.pointer_type(tl.int32)) + w_off
        if PREFETCH and FULL > 0:
            codes = _load_codes(w_row, 0, row_ok, BKB, WORDS)
            sb = load_bytes(s_row + s_off + 0, row_ok[:, None], ASM)
            for k0 in tl.range(BKB, FULL, BKB):
                codes_n = _load_codes(w_row, k0, row_ok, BKB, WORDS)
                sb_n = load_bytes(s_row + s_off + (k0 // 32) * 512, row_ok[:, None], ASM)
                xw = load_words(x_row + (k0 - BKB) + ar, ar >= 0, ASM)
                part = _partials(codes, xw, R, BKB, DECODE, WORDS)
                acc = tl.fma(part, e4m3_to_f32(sb), acc)
                codes = codes_n
                sb = sb_n
            xw = load_words(x_row + (FULL - BKB) + ar, ar >= 0, ASM)
            part = _partials(codes, xw, R, BKB, DECODE, WORDS)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
        else:
            for k0 in tl.range(0, FULL, BKB):
                codes = _load_codes(w_row, k0, row_ok, BKB, WORDS)
                sb = load_bytes(s_row + s_off + (k0 // 32) * 512, row_ok[:, None], ASM)
                xw = load_words(x_row + k0 + ar, ar >= 0, ASM)
                part = _partials(codes, xw, R, BKB, DECODE, WORDS)
                acc = tl.fma(part, e4m3_to_f32(sb), acc)
        if FULL < HB:  # partial last step: masked groups read clamped (in-bounds) addresses and are zeroed
            kb = FULL + ar
            cb = FULL // 8 + tl.arange(0, NB)
            k_ok = kb < HB
            c_ok = cb < HB // 8
            if WORDS:
                kw = FULL // 4 + tl.arange(0, BKB // 4)
                codes = tl.load(w_row[:, None] + kw[None, :], mask=row_ok[:, None] & (kw < HB // 4)[None, :], other=0)
            else:
                codes = tl.load(w_row[:, None] + kb[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0)
            xw = load_words(x_row + kb % HB, k_ok, ASM)
            sb = load_bytes(
                s_row + swizzled_scale_offsets(prow[:, None], (cb % (HB // 8))[None, :], KP),
                row_ok[:, None] & c_ok[None, :],
                ASM,
            )
            part = _partials(codes, xw, R, BKB, DECODE, WORDS)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
        tot = tl.sum(acc, axis=1)  # [R]
    if LATE:
        gdc_launch_dependents()
    u_acc, g_acc = tl.split(tl.reshape(tot, [BN, 2]))
    gs = tl.load(alpha_ptr + e)
    g = g_acc * gs
    u = u_acc * gs
    a = g * _C
    pe = ex2_approx_ftz(a)
    d = pe + 1.0
    rc = rcp_approx_ftz(d)
    act = bf16_rn(u * (g * rc))
    cols = q * BN + tl.arange(0, BN)
    ok = cols < INTER
    out_off = p.to(tl.int64) * INTER + cols
    tl.store(act_ptr + out_off, act, mask=ok)
    if TAP:
        tl.store(gacc_ptr + out_off, g_acc, mask=ok)
        tl.store(uacc_ptr + out_off, u_acc, mask=ok)


def accumulation_model(config: dict | None = None):
    """The summation model (``flint_moe.reference.exact``) that bounds g_acc / u_acc of ``nvfp4_gate_up`` with
    ``config`` (overrides of ``GATE_UP_CONFIG``): ``block_model(16)`` for the CUDA-core path (sequential block
    partials, then the scale ``fma``), ``FP32_TRUNCATE`` for the tensor-core path (``MMA``)."""
    from flint_moe.reference.exact import FP32_TRUNCATE, block_model

    cfg = {**GATE_UP_CONFIG, **(config or {})}
    return FP32_TRUNCATE if cfg["MMA"] else block_model(16)


def default_config(H: int, I: int) -> dict:
    """The launch configuration ``nvfp4_gate_up`` uses at hidden size ``H`` and valid intermediate size ``I``
    when no ``config`` is given (``config`` keys override it): ``GATE_UP_CONFIG`` updated with
    ``nvfp4_tuned.GATE_UP_BY_SHAPE[(H, I)]`` if present (a pure function of the shape; never changes ``MMA``)."""
    return {**GATE_UP_CONFIG, **_TUNED_GATE_UP_BY_SHAPE.get((int(H), int(I)), {})}


def _weights_common(weights) -> tuple[int, int, int, int]:
    """(E, H, Ip, I) of a FlintMoEWeights, with the layout checks the decode kernels rely on."""
    from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights

    if not isinstance(weights, FlintMoEWeights):
        raise TypeError(f"weights: expected FlintMoEWeights, got {type(weights).__name__}")
    E, H, IP, INTER = (
        weights.num_experts,
        weights.hidden_size,
        weights.intermediate_size,
        weights.valid_intermediate,
    )
    for name in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
        t = getattr(weights, name)
        check_op_tensor(f"weights.{name}", t, device=weights.w1.device)
    if H % 32:
        raise ValueError(
            f"weights: hidden size H = {H} must be a multiple of 32 for the NVFP4 decode kernels (16-byte code vectors)"
        )
    if INTER % 16:
        raise ValueError(f"weights: valid intermediate size {INTER} must be a multiple of 16 (NVFP4 block)")
    return E, H, IP, INTER


def _config(config: dict | None, default: dict, name: str) -> dict:
    cfg = dict(default)
    if config:
        unknown = set(config) - set(default) - {"ASM", "DECODE"}
        if unknown:
            raise ValueError(f"{name}: unknown config keys {sorted(unknown)}")
        cfg.update(config)
    return cfg


def _check_mma(
    rt: int, sub: int, sk: int, num_warps: int, rows: int, kbytes: int, key: str, what: str
) -> tuple[int, int]:
    """Launch-configuration checks of the tensor-core path (``MMA``); returns (K-parts, warps) used.

    (RT, S) one of ``MMA_SHAPES``; ``rows`` (rows per program) * SK = 8 * num_warps * RT; ``SK`` (K-parts, a
    power of two dividing num_warps). The parts are ``mma_part_bytes(kbytes, SK)`` bytes each, the last one
    shorter when ``kbytes`` (code bytes per row) is not a multiple of 64 * SK. A shape where that would leave
    the last part empty runs with SK / 2 on num_warps / 2 warps (same rows per program), halved again until it
    is not (the choice depends on the shape only, never on the token count, so a token's bits do not depend on
    the batch).
    """
    from flint_moe.kernels.nvfp4.gemv import MMA_SHAPES, mma_part_bytes

    if (rt, sub) not in MMA_SHAPES:
        raise ValueError(f"config (RT, S) = ({rt}, {sub}): must be one of {MMA_SHAPES} with MMA")
    if sk <= 0 or sk & (sk - 1) or num_warps % sk:
        raise ValueError(f"config SK: {sk} must be a power of two dividing num_warps = {num_warps}")
    if rows * sk != 8 * num_warps * rt:
        raise ValueError(
            f"config {key}: with MMA, {what} * SK = {rows * sk} must equal 8 * num_warps * RT = {8 * num_warps * rt}"
        )
    while sk > 1 and kbytes - (sk - 1) * mma_part_bytes(kbytes, sk) <= 0:
        sk, num_warps = sk // 2, num_warps // 2
    return sk, num_warps


def _check_pf(pf: bool, rt: int, sub: int, l2pf: int = 0, fence: bool = False) -> None:
    """``PF`` (cross-step prefetch of the tensor-core path) exists for RT = 2 and S = 2 or 4; ``L2PF`` (L2
    prefetch distance in calls, 0 = off) for S = 1, 2 or 4 without PF; ``FENCE`` for RT = 2, S = 2 or 4
    without PF."""
    if fence and (pf or rt != 2 or sub not in (2, 4)):
        raise ValueError(f"config FENCE: needs RT = 2 and S = 2 or 4 without PF, got RT = {rt}, S = {sub}, PF = {pf}")
    if pf and (rt != 2 or sub not in (2, 4)):
        raise ValueError(f"config PF: needs RT = 2 and S = 2 or 4, got RT = {rt}, S = {sub}")
    if l2pf < 0 or (l2pf and (pf or sub not in (1, 2, 4))):
        raise ValueError(f"config L2PF: {l2pf} must be >= 0, and > 0 only with S = 1, 2 or 4 without PF")


def _decode_defaults(cfg: dict, device: torch.device) -> tuple[bool, int]:
    on_gpu = device.type == "cuda"
    asm = bool(cfg.get("ASM", on_gpu))
    decode = int(cfg.get("DECODE", 2 if on_gpu else 0))
    if decode not in (0, 1, 2):
        raise ValueError(f"config DECODE: must be 0, 1 or 2, got {decode}")
    return asm, decode


def nvfp4_gate_up(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights,
    *,
    taps: dict | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Rule steps 5-7 for every (token, selected expert) pair: act bf16 [M * k, I] (I = valid intermediate).

    Args:
        x: bf16 [M, H], contiguous (never modified).
        ids: int32 [M, k], contiguous: selected experts (rule step 2), values in [0, E) (not checked on the
            device: an out-of-range id reads out of bounds).
        weights: ``FlintMoEWeights`` (w1 uint8 [E, 2Ip, H/2], 64-row [up; gate] interleave, 128x4-swizzled
            E4M3 scales, w1_alpha fp32 [E]).
        taps: if a dict, the kernel is compiled with ``TAP=True``; ``taps["gate_acc"]`` / ``taps["up_acc"]``
            (fp32 [M, k, I], before the global scale) and ``taps["act"]`` (bf16 [M, k, I]) are stored.
        config: overrides of ``GATE_UP_CONFIG`` (``BN``, ``BKB``, ``num_warps``; ``DECODE`` 0/1/2 and ``ASM``
            select the decode / load implementation on the GPU; all variants give identical bits for one BKB).

    Raises:
        TypeError / ValueError: wrong dtype, shape, device or contiguity (message names the tensor), H not a
        multiple of 32.
    """
    E, H, IP, INTER = _weights_common(weights)
    dev = weights.w1.device
    check_op_tensor("x", x, dtype=torch.bfloat16, shape=(None, H), device=dev)
    M = x.shape[0]
    check_op_tensor("ids", ids, dtype=torch.int32, shape=(M, None), device=dev)
    top_k = ids.shape[1]
    cfg = _config(config, default_config(H, INTER), "nvfp4_gate_up")
    asm, decode = _decode_defaults(cfg, dev)
    bn, bkb = int(cfg["BN"]), int(cfg["BKB"])
    if bn <= 0 or 64 % bn:
        raise ValueError(f"config BN: {bn} must divide 64")
    if bkb < 32 or bkb & (bkb - 1):
        raise ValueError(f"config BKB: {bkb} must be a power of two >= 32")
    mma, rt, sub, sk = bool(cfg["MMA"]), int(cfg["RT"]), int(cfg["S"]), int(cfg["SK"])
    nw = int(cfg["num_warps"])
    if mma:
        sk, nw = _check_mma(rt, sub, sk, nw, 2 * bn, H // 2, "BN", "2 * BN")
        _check_pf(bool(cfg["PF"]), rt, sub, int(cfg["L2PF"]), bool(cfg["FENCE"]))
    act = torch.empty((M * top_k, INTER), dtype=torch.bfloat16, device=dev)
    tap = taps is not None
    if tap:
        gacc = torch.empty((M * top_k, INTER), dtype=torch.float32, device=dev)
        uacc = torch.empty_like(gacc)
    else:
        gacc = uacc = act  # never written
    if M * top_k > 0:
        grid = (M * top_k, triton.cdiv(INTER, bn))
        _nvfp4_gate_up_kernel[grid](
            x.view(torch.int32),
            ids,
            weights.w1,
            weights.w1_sf_swizzled.view(torch.uint8),
            weights.w1_alpha,
            act,
            gacc,
            uacc,
            H=H,
            IP=IP,
            INTER=INTER,
            TOPK=top_k,
            BN=bn,
            BKB=bkb,
            ASM=asm,
            DECODE=decode,
            PREFETCH=bool(cfg["PREFETCH"]),
            WORDS=bool(cfg["WORDS"]),
            MMA=mma,
            RT=rt,
            S=sub,
            SK=sk,
            NW=nw,
            LATE=bool(cfg["LATE"]),
            PF=bool(cfg["PF"]),
            L2PF=int(cfg["L2PF"]) if mma else 0,
            FENCE=bool(cfg["FENCE"]) and mma,
            TAP=tap,
            num_warps=nw,
            num_stages=1,
            **launch_options(),
        )
    if tap:
        taps["gate_acc"] = gacc.view(M, top_k, INTER)
        taps["up_acc"] = uacc.view(M, top_k, INTER)
        taps["act"] = act.view(M, top_k, INTER)
    return act


#: PTX the tensor-core path must contain (the exact bf16 dequantisation and the fp32-accumulating MMA).
MMA_PTX = ["mul.rn.bf16x2", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"]

#: (H, Ip) of the conformance matrix (hidden sizes x intermediate sizes, DeepSeek-V3 included).
AUDIT_SHAPES = [(h, i) for h in (2048, 2880, 5120, 7168) for i in (512, 704, 2048, 2880)]


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of every (H, I) of the conformance matrix and of every shape with its own
    tuned defaults (production builds with ``default_config(H, I)`` and the K-split / warps the launcher runs
    there; the tapped build too for DeepSeek-V3, H 7168 x I 2048)."""
    names = []
    sig = {
        "x_ptr": "*i32",
        "ids_ptr": "*i32",
        "w_ptr": "*u8",
        "s_ptr": "*u8",
        "alpha_ptr": "*fp32",
        "act_ptr": "*bf16",
        "gacc_ptr": "*fp32",
        "uacc_ptr": "*fp32",
    }
    from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned

    # the default at every shape; the other measured path (a conformance launch configuration,
    # cases.PATH_CONFIGS) at DeepSeek-V3
    shapes = AUDIT_SHAPES + sorted(set(_TUNED_GATE_UP_BY_SHAPE) - set(AUDIT_SHAPES))  # + shapes with their own defaults
    runs = [(h, i, default_config(h, i), "") for h, i in shapes]
    runs.append((7168, 2048, {**default_config(7168, 2048), **nvfp4_tuned.GATE_UP_MMA}, ".mma"))
    for h, i, cfg, suffix in runs:
        ip = (i + 63) // 64 * 64
        sk, nw = int(cfg["SK"]), int(cfg["num_warps"])
        if cfg["MMA"]:  # the K-split and warps the launcher uses at this shape
            sk, nw = _check_mma(cfg["RT"], cfg["S"], sk, nw, 2 * cfg["BN"], h // 2, "BN", "2 * BN")
        for tap in (False, True) if (h, i) == (7168, 2048) else (False,):
            name = f"nvfp4_gate_up.H{h}.I{i}{suffix}{'.tap' if tap else ''}"
            register_audit(
                name,
                _nvfp4_gate_up_kernel,
                sig,
                {
                    "H": h,
                    "IP": ip,
                    "INTER": i,
                    "TOPK": 8,
                    "BN": cfg["BN"],
                    "BKB": cfg["BKB"],
                    "ASM": True,
                    "DECODE": 2,
                    "PREFETCH": cfg["PREFETCH"],
                    "WORDS": cfg["WORDS"],
                    "MMA": cfg["MMA"],
                    "RT": cfg["RT"],
                    "S": cfg["S"],
                    "SK": sk,
                    "NW": nw,
                    "LATE": cfg["LATE"],
                    "PF": cfg["PF"],
                    "L2PF": cfg["L2PF"] if cfg["MMA"] else 0,
                    "FENCE": bool(cfg["FENCE"]) and cfg["MMA"],
                    "TAP": tap,
                },
                [
                    BF16_CVT,
                    "rcp.approx.ftz.f32",
                    "ex2.approx.ftz.f32",
                    *(MMA_PTX if cfg["MMA"] else ["mul.rn.f16x2"]),
                    "griddepcontrol.wait",
                ],
                options={"num_warps": nw, "num_stages": 1},
            )
            names.append(name)
    return names


audit_specs()
