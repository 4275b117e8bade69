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
from flint_moe.kernels._rule import SWIGLU_C, global_scale, swiglu
from flint_moe.kernels.audit.registry import BF16_CVT, register_audit
from flint_moe.kernels.nvfp4.config import GateUpConfig, check_shape_overrides
from flint_moe.kernels.nvfp4.cuda_core import cuda_core_row_sums
from flint_moe.kernels.nvfp4.mma import mma_gemv, mma_sum_parts, mma_tile_rows
from flint_moe.kernels.nvfp4.tuned import GATE_UP as _TUNED_GATE_UP, GATE_UP_BY_SHAPE as _TUNED_GATE_UP_BY_SHAPE

__all__ = [
    "GATE_UP_CONFIG",
    "SWIGLU_C",
    "nvfp4_gate_up",
    "launch_gate_up",
    "decode_sizes",
    "default_config",
    "resolve_config",
    "accumulation_model",
    "audit_specs",
]


#: Base launch configuration (keys: ``nvfp4.config``), updated with the tuned values (``nvfp4.tuned.GATE_UP``);
#: ``nvfp4.tuned.GATE_UP_BY_SHAPE[(H, I)]`` overrides it at one shape (``default_config``). Only ``BKB`` (CUDA
#: cores), ``SK`` (tensor cores) and ``MMA`` change bits; chosen on the H200 by ``benchmarks/tune``.
GATE_UP_CONFIG = {"MMA": False, "BN": 8, "BKB": 512, "num_warps": 2, "RT": 2, "S": 4, "SK": 1, "FENCE": False}
GATE_UP_CONFIG.update(_TUNED_GATE_UP)
check_shape_overrides(GATE_UP_CONFIG, _TUNED_GATE_UP_BY_SHAPE, "nvfp4_tuned.GATE_UP_BY_SHAPE")


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
    MMA: tl.constexpr,
    RT: tl.constexpr,
    S: tl.constexpr,
    SK: tl.constexpr,
    NW: tl.constexpr,
    FENCE: tl.constexpr,
    TAP: tl.constexpr,
):
    """act[p, n] = bf16(RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1))))), g = RN(g_acc * gs), u = RN(u_acc * gs).

    Grid ``(M * TOPK, cdiv(INTER, BN))``: program (p, q) handles pair p and columns n in [q*BN, q*BN + BN)
    (n < INTER, the valid intermediate size; padded rows are never read). Up row of n: ``(n // 64) * 128 +
    n % 64``; gate row: that + 64. Tile rows r = 2 * (n - q*BN) + {0: up, 1: gate}.

    Summation order of g_acc / u_acc (one row, length H, K = H / 2 code bytes): ``nvfp4.cuda_core
    .cuda_core_row_sums`` with ``BKB`` (no prefetch). Bound: block model (B = 16) of
    ``flint_moe.reference.exact``.

    ``MMA`` (tensor cores; ``nvfp4.mma.mma_gemv``): no block regrouping. Each weight is dequantised exactly
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
    gdc_launch_dependents()
    HB: tl.constexpr = H // 2  # code bytes (and x bf16 pairs) per row
    KP: tl.constexpr = (H // 16 + 3) // 4 * 4  # swizzled scale columns
    R: tl.constexpr = 2 * BN
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
            FENCE,
            tl.minimum(e.to(tl.int32), 0),  # ids are >= 0: an opaque zero for FENCE
        )
        tot = mma_sum_parts(tt, TR, NW, SK)  # [R], row r = 2 (n - q BN) + {0: up, 1: gate}
    else:
        tot = cuda_core_row_sums(w_row, s_row, prow, x_row, row_ok, HB, KP, R, BKB, False)  # [R]
    u_acc, g_acc = tl.split(tl.reshape(tot, [BN, 2]))
    gs = tl.load(alpha_ptr + e)
    act = swiglu(global_scale(g_acc, gs), global_scale(u_acc, gs))
    cols = q * BN + tl.arange(0, BN)
    ok = cols < INTER
    out_off = p.to(tl.int64) * INTER + cols
    tl.store(act_ptr + out_off, act, mask=ok)
    if TAP:
        tl.store(gacc_ptr + out_off, g_acc, mask=ok)
        tl.store(uacc_ptr + out_off, u_acc, mask=ok)


def accumulation_model(config: dict | GateUpConfig | None = None):
    """The summation model (``flint_moe.reference.exact``) that bounds g_acc / u_acc of ``nvfp4_gate_up`` with
    ``config`` (a ``GateUpConfig``, or overrides of ``GATE_UP_CONFIG``): ``block_model(16)`` for the CUDA-core
    path (sequential block partials, then the scale ``fma``), ``FP32_TRUNCATE`` for the tensor-core path
    (``MMA``)."""
    from flint_moe.reference.exact import FP32_TRUNCATE, block_model

    mma = config.MMA if isinstance(config, GateUpConfig) else {**GATE_UP_CONFIG, **(config or {})}["MMA"]
    return FP32_TRUNCATE if mma else block_model(16)


def default_config(H: int, I: int) -> dict:  # noqa: E741
    """The launch configuration ``nvfp4_gate_up`` uses at hidden size ``H`` and valid intermediate size ``I``
    when no ``config`` is given (``config`` keys override it): ``GATE_UP_CONFIG`` updated with
    ``nvfp4_tuned.GATE_UP_BY_SHAPE[(H, I)]`` if present (a pure function of the shape; never changes ``MMA``)."""
    return {**GATE_UP_CONFIG, **_TUNED_GATE_UP_BY_SHAPE.get((int(H), int(I)), {})}


def resolve_config(H: int, I: int, config: dict | None = None) -> GateUpConfig:  # noqa: E741
    """``default_config(H, I)`` with the ``config`` overrides, checked (``ValueError`` naming the key)."""
    return GateUpConfig.from_dict({**default_config(H, I), **(config or {})})


def _weights_common(weights) -> tuple[int, int, int, int]:
    """(E, H, Ip, I) of a FlintMoEWeights, with the layout checks the decode kernels rely on."""
    from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights

    if not isinstance(weights, FlintMoEWeights):
        raise TypeError(f"weights: expected FlintMoEWeights, got {type(weights).__name__}")
    for name in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
        t = getattr(weights, name)
        check_op_tensor(f"weights.{name}", t, device=weights.w1.device)
    return decode_sizes(weights)


def decode_sizes(weights) -> tuple[int, int, int, int]:
    """(E, H, Ip, I) of a ``FlintMoEWeights`` whose tensors were checked (``check_metadata``), after the size
    constraints of the decode kernels: ValueError unless H % 32 == 0 and I % 16 == 0."""
    E, H, IP, INTER = (
        weights.num_experts,
        weights.hidden_size,
        weights.intermediate_size,
        weights.valid_intermediate,
    )
    if H % 32:
        raise ValueError(
            f"weights: hidden size H = {H} must be a multiple of 32 for the NVFP4 decode kernels (16-byte code vectors)"
        )
    if INTER % 16:
        raise ValueError(f"weights: valid intermediate size {INTER} must be a multiple of 16 (NVFP4 block)")
    return E, H, IP, INTER


def check_gate_up_inputs(x: torch.Tensor, ids: torch.Tensor, weights) -> tuple[int, int, int]:
    """Check the inputs of an NVFP4 gate/up call against ``weights`` (``_weights_common``): ``x`` bf16 [M, H] and
    ``ids`` int32 [M, k], contiguous, on the weights' device. Returns (E, M, k); TypeError / ValueError naming
    the tensor."""
    E, H, _, _ = _weights_common(weights)
    dev = weights.w1.device
    check_op_tensor("x", x, dtype=torch.bfloat16, shape=(None, H), device=dev)
    check_op_tensor("ids", ids, dtype=torch.int32, shape=(x.shape[0], None), device=dev)
    return E, int(x.shape[0]), int(ids.shape[1])


def w1_operands(weights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gate/up kernels' weight arguments from ``FlintMoEWeights``: ``w1`` uint8 [E, 2Ip, H/2], the swizzled
    E4M3 scales as uint8 bytes, ``w1_alpha`` fp32 [E]."""
    return weights.w1, weights.w1_sf_swizzled.view(torch.uint8), weights.w1_alpha


def gate_up_buffers(rows: int, inter: int, tap: bool, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(act, g_acc, u_acc) of a gate/up launch: act bf16 [rows, I]; with ``tap`` g_acc / u_acc fp32 [rows, I],
    else both are ``act`` (a TAP=False build never writes them)."""
    act = torch.empty((rows, inter), dtype=torch.bfloat16, device=device)
    if not tap:
        return act, act, act
    gacc = torch.empty((rows, inter), dtype=torch.float32, device=device)
    return act, gacc, torch.empty_like(gacc)


def publish_gate_up_taps(taps: dict, m: int, top_k: int, act, gacc, uacc) -> None:
    """Store the tapped build's ``gate_acc`` / ``up_acc`` fp32 and ``act`` bf16 into ``taps`` as [M, k, I] views."""
    shape = (m, top_k, act.shape[1])
    taps.update(gate_acc=gacc.view(shape), up_acc=uacc.view(shape), act=act.view(shape))


def nvfp4_gate_up(
    x: torch.Tensor, ids: torch.Tensor, weights,
    *, taps: dict | None = None, config: dict | None = None, check: bool = True,
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
        config: overrides of ``default_config(H, I)`` (keys: ``nvfp4.config``).
        check: False skips the tensor checks, for a caller that made them (``launch_gate_up``); the config
            is checked either way.

    Raises:
        TypeError / ValueError: wrong dtype, shape, device or contiguity (message names the tensor), H not a
        multiple of 32, a config key unknown or out of range.
    """
    if check:
        check_gate_up_inputs(x, ids, weights)
    E, H, IP, INTER = decode_sizes(weights)
    dev = weights.w1.device
    M = x.shape[0]
    top_k = ids.shape[1]
    cfg = resolve_config(H, INTER, config)
    sk, nw = cfg.mma_launch(H)
    tap = taps is not None
    act, gacc, uacc = gate_up_buffers(M * top_k, INTER, tap, dev)
    if M * top_k > 0:
        grid = (M * top_k, triton.cdiv(INTER, cfg.BN))
        _nvfp4_gate_up_kernel[grid](
            x.view(torch.int32),
            ids,
            *w1_operands(weights),
            act,
            gacc,
            uacc,
            **_constexprs(cfg, H, IP, INTER, top_k, sk, nw, tap),
            num_warps=nw,
            num_stages=1,
            **launch_options(),
        )
    if tap:
        publish_gate_up_taps(taps, M, top_k, act, gacc, uacc)
    return act


def launch_gate_up(*args, **kwargs) -> torch.Tensor:
    """``nvfp4_gate_up(..., check=False)``. On arguments already checked by the caller (the op
    ``flint_moe.ops.flint_moe``: its inputs at its boundary, ``ids`` from ``route``): no tensor checks here (a wrong
    dtype, shape or device reads out of bounds); the config is checked (ValueError)."""
    return nvfp4_gate_up(*args, check=False, **kwargs)


def decode_constexprs(cfg, tile: str, H: int, IP: int, INTER: int, top_k: int, sk: int, nw: int, tap: bool) -> dict:
    """The constexpr arguments both NVFP4 decode kernels take for ``cfg`` (``GateUpConfig`` / ``DownConfig``,
    rows per program ``tile`` = ``"BN"`` / ``"BH"``) as launched (K-split ``sk`` on ``nw`` warps)."""
    return {"H": H, "IP": IP, "INTER": INTER, "TOPK": top_k, tile: getattr(cfg, tile), "BKB": cfg.BKB, "MMA": cfg.MMA,
            "RT": cfg.RT, "S": cfg.S, "SK": sk, "NW": nw, "FENCE": cfg.FENCE and cfg.MMA, "TAP": tap}  # fmt: skip


def _constexprs(cfg: GateUpConfig, H: int, IP: int, INTER: int, top_k: int, sk: int, nw: int, tap: bool) -> dict:
    """The kernel's constexpr arguments for ``cfg`` as launched (K-split ``sk`` on ``nw`` warps)."""
    return decode_constexprs(cfg, "BN", H, IP, INTER, top_k, sk, nw, tap)


#: PTX the tensor-core path must contain (the exact bf16 dequantisation and the fp32-accumulating MMA).
MMA_PTX = ["mul.rn.bf16x2", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"]

#: (H, Ip) of the conformance matrix (hidden sizes x intermediate sizes, DeepSeek-V3 included).
AUDIT_SHAPES = [(h, i) for h in (2048, 2880, 5120, 7168) for i in (512, 704, 2048, 2880)]


def audit_runs(resolve, by_shape: dict, other: dict, other_suffix: str):
    """The audited builds of a decode kernel: ``(H, I, Ip, config, name suffix, TAP)`` for ``resolve(H, I)`` (its
    ``resolve_config``) at every ``AUDIT_SHAPES`` shape and every tuned per-shape shape (``by_shape``), and
    ``resolve(7168, 2048, other)`` (the other measured path, a conformance launch configuration,
    ``cases.PATH_CONFIGS``) with ``other_suffix``; DeepSeek-V3 (H 7168, I 2048) also with ``TAP``."""
    shapes = AUDIT_SHAPES + sorted(set(by_shape) - set(AUDIT_SHAPES))
    runs = [(h, i, resolve(h, i), "") for h, i in shapes] + [(7168, 2048, resolve(7168, 2048, other), other_suffix)]
    for h, i, cfg, suffix in runs:
        for tap in (False, True) if (h, i) == (7168, 2048) else (False,):
            yield h, i, (i + 63) // 64 * 64, cfg, suffix + (".tap" if tap else ""), tap


def register_decode_audits(
    prefix: str, kernel, sig: dict, constexprs, runs, require, k_size, extra_options=None
) -> list[str]:
    """Register the sm_90 PTX audit of the decode kernel ``kernel`` for every build of ``runs``
    (``audit_runs``): name ``{prefix}.H{H}.I{I}{suffix}``, constexprs ``constexprs(cfg, H, Ip, I, 8, SK,
    num_warps, TAP)`` with the K-split and warps the launcher runs at K = ``k_size(H, I)``
    (``cfg.mma_launch``), ``require(cfg)`` and ``num_stages`` 1 plus ``extra_options(cfg)``. Returns the names."""
    names = []
    for h, i, ip, cfg, suffix, tap in runs:
        sk, nw = cfg.mma_launch(k_size(h, i))
        name = f"{prefix}.H{h}.I{i}{suffix}"
        options = {"num_warps": nw, "num_stages": 1, **(extra_options(cfg) if extra_options else {})}
        register_audit(name, kernel, sig, constexprs(cfg, h, ip, i, 8, sk, nw, tap), require(cfg), options=options)
        names.append(name)
    return names


def _require(cfg) -> list:
    """PTX a gate/up build must contain (the tensor-core path's MMA or the CUDA-core path's f16 decode)."""
    mma = MMA_PTX if cfg.MMA else ["mul.rn.f16x2"]
    return [BF16_CVT, "rcp.approx.ftz.f32", "ex2.approx.ftz.f32", *mma, "griddepcontrol.wait"]


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of every (H, I) of the conformance matrix and of every shape with its own
    tuned defaults (production builds with ``default_config(H, I)`` and the K-split / warps the launcher runs
    there; the tapped build too for DeepSeek-V3, H 7168 x I 2048)."""
    sig = {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32",
        "act_ptr": "*bf16", "gacc_ptr": "*fp32", "uacc_ptr": "*fp32"}
    from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned

    runs = audit_runs(resolve_config, _TUNED_GATE_UP_BY_SHAPE, nvfp4_tuned.GATE_UP_MMA, ".mma")
    return register_decode_audits(
        "nvfp4_gate_up", _nvfp4_gate_up_kernel, sig, _constexprs, runs, _require, lambda h, i: h
    )


audit_specs()
