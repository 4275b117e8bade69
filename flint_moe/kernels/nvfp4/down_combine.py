"""NVFP4 decode down GEMV over a token's k experts + combine + shared add (rule steps 5, 8, 9, 10).

``_nvfp4_down_split_kernel``: one program per (token, selected expert, BH-row block) computes ``y_j =
bf16(RN(y_acc * w2_alpha[e]))`` from that pair's activation row through ``FlintMoEWeights.w2`` (uint8 [E, H,
Ip/2]) and its 128x4-swizzled E4M3 scales; the last of a row block's k programs to finish (arrival counter)
does the combine ``acc = fma(tw_j, y_j, acc)`` in selection order and ``out = bf16(RN(fp32(bf16(acc)) +
fp32(shared)))``. Seed: ``_down_gemv_kernel`` of ``vllm.models.flint.ops.moe`` (semantics only; this kernel
adds the exact sm_90 E2M1 decode, the block grouping, the rule's rounding points, a documented summation
order, taps, 64-bit offsets and H, I not powers of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, check_op_tensor, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn, combine_fma, global_scale, shared_add
from flint_moe.kernels.audit.registry import BF16_CVT
from flint_moe.kernels.nvfp4.config import DownConfig, Early, check_shape_overrides
from flint_moe.kernels.nvfp4.cuda_core import cuda_core_row_sums
from flint_moe.kernels.nvfp4.mma import mma_gemv, mma_sum_parts, mma_tile_rows
from flint_moe.kernels.nvfp4.tuned import DOWN as _TUNED_DOWN, DOWN_BY_SHAPE as _TUNED_DOWN_BY_SHAPE

__all__ = [
    "DOWN_CONFIG",
    "nvfp4_down",
    "launch_down",
    "default_config",
    "resolve_config",
    "accumulation_model",
    "audit_specs",
]

#: Base launch configuration (keys: ``nvfp4.config``), updated with the tuned values (``nvfp4.tuned.DOWN``);
#: ``nvfp4.tuned.DOWN_BY_SHAPE[(H, I)]`` overrides it at one shape (``default_config``). Only ``BKB`` (CUDA
#: cores), ``SK`` (tensor cores) and ``MMA`` change bits.
DOWN_CONFIG = {
    "MMA": False, "BH": 16, "BKB": 512, "num_warps": 4, "RT": 2, "S": 2, "SK": 1, "FENCE": False,
    "EARLY": int(Early.AFTER_WAIT), "MAXNREG": 0,
}  # fmt: skip
DOWN_CONFIG.update(_TUNED_DOWN)
check_shape_overrides(DOWN_CONFIG, _TUNED_DOWN_BY_SHAPE, "nvfp4_tuned.DOWN_BY_SHAPE")


def default_config(H: int, I: int) -> dict:
    """The launch configuration ``nvfp4_down`` uses at hidden size ``H`` and valid intermediate size ``I`` when
    no ``config`` is given (``config`` keys override it): ``DOWN_CONFIG`` updated with
    ``nvfp4_tuned.DOWN_BY_SHAPE[(H, I)]`` if present (a pure function of the shape; never changes ``MMA``)."""
    return {**DOWN_CONFIG, **_TUNED_DOWN_BY_SHAPE.get((int(H), int(I)), {})}


@triton.jit
def _combine_rows(t, h, h_ok, tw_ptr, y_ptr, shared_ptr, out_ptr, H: tl.constexpr, TOPK: tl.constexpr):
    """Rule steps 9-10 for token t, rows h: acc = fma(tw_j, y_j, acc) for j = 0..TOPK-1 from +0 (selection
    order), out = bf16(RN(fp32(bf16(acc)) + fp32(shared))). y is read through L2 only (``ld.global.cg``; it was
    written by other programs of the same launch)."""
    out = tl.full(h.shape, 0.0, tl.float32)
    for j in tl.static_range(0, TOPK):
        p = t * TOPK + j
        y = tl.load(y_ptr + p.to(tl.int64) * H + h, mask=h_ok, other=0.0, cache_modifier=".cg")
        tw = tl.load(tw_ptr + p)
        out = combine_fma(out, tl.full(h.shape, 0.0, tl.float32) + tw, y)
    routed = bf16_rn(out)
    o_off = t.to(tl.int64) * H + h
    sh = tl.load(shared_ptr + o_off, mask=h_ok, other=0.0)
    res = shared_add(routed, sh)
    tl.store(out_ptr + o_off, res, mask=h_ok)


@triton.jit
def _nvfp4_down_split_kernel(
    act_ptr,  # int32 [M * TOPK, INTER / 2]: act (bf16 [M * TOPK, INTER]) as bf16 pairs
    ids_ptr,  # int32 [M * TOPK]
    tw_ptr,  # fp32 [M * TOPK]: routing weights (bf16 values)
    w_ptr,  # uint8 w2 [E, H, IP / 2]
    s_ptr,  # uint8 w2 scales, 128x4 swizzle [E, roundup(H, 128), KP]
    alpha_ptr,  # fp32 [E]
    shared_ptr,  # bf16 [M, H]
    out_ptr,  # bf16 [M, H] (out)
    dacc_ptr,  # fp32 [M * TOPK, H] (out, TAP only): y_acc
    y_ptr,  # bf16 [M * TOPK, H] (out): y of every pair
    cnt_ptr,  # int32 [M * cdiv(H, BH)] arrival counters, 0 on entry and on exit
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BH: tl.constexpr,
    BKB: tl.constexpr,
    MMA: tl.constexpr,
    RT: tl.constexpr,
    S: tl.constexpr,
    SK: tl.constexpr,
    NW: tl.constexpr,
    FENCE: tl.constexpr,
    TAP: tl.constexpr,
    EARLY: tl.constexpr = 0,
):
    """y[p, h] = bf16(RN(y_acc * gs2[e_p])) for one (token, selected expert) pair p and BH rows; the last of a
    row block's TOPK programs to finish also does rule steps 9-10 for it.

    Grid ``(M * TOPK, cdiv(H, BH))``: program (p, q) handles pair p = t * TOPK + j, rows h in
    [q*BH, q*BH + BH) (masked at H). ``y = bf16(RN(y_acc * gs2[e]))`` (rule step 8, ``mul.f32`` then
    ``cvt.rn.bf16.f32``). Combine (``_combine_rows``): ``acc = fma(tw_j, y_j, acc)`` for j = 0..TOPK-1 in
    selection order from +0, the rule's fixed order (step 9, ``fma.rn.f32``), then step 10
    (``cvt.rn.bf16.f32``, ``add.f32``, ``cvt.rn.bf16.f32``); which program does it (the last to arrive, found
    with an ``atom.acq_rel.gpu`` counter per (t, q) after a CTA barrier) changes no bit. The counter is reset to
    0 by that program.

    Summation order of y_acc (one row h of expert e, length INTER over the activation; padded columns
    i >= INTER are never read): ``nvfp4.cuda_core.cuda_core_row_sums`` with ``BKB`` (with the register
    prefetch). Bound: block model (B = 16) of ``flint_moe.reference.exact``.

    ``MMA`` (tensor cores, ``nvfp4.mma.mma_gemv``): y_acc without block regrouping, as the gate/up kernel's
    ``MMA`` path: weights dequantised exactly to bf16 ``E2M1 * E4M3 * 2^-8``, products with act accumulated by
    chained ``mma.sync.m16n8k16`` (fp32, from +0; per 64-byte K step 8 MMAs per 16-byte chunk, the hardware's
    order and truncating alignment inside each), K steps in increasing order, ``y_acc = acc * 2^8`` (exact).
    ``SK`` > 1: K split into SK parts (different warps; ``mma_part_bytes(INTER / 2, SK)`` bytes each, the last
    one the rest), part sums added as ``p0 + p1`` / ``(p0 + p1) + (p2 + p3)``. Bound: ``FP32_TRUNCATE``
    (u = 2^-23, d = INTER). The combine is unchanged.
    ``EARLY`` (``Early.REGISTERS``, tensor-core path; ``mma_gemv``): the expert id (``ld.global.cg``) and the
    weights of the first call are read into registers before ``griddepcontrol.wait``, everything else after
    it. Same bits. Valid only when the ids were written by a grid that completed before this launch could
    start: the case when the preceding kernel (the gate/up GEMV, whose ids come from the router) triggers its
    dependents only after its own ``griddepcontrol.wait`` (docs/kernels/nvfp4-decode.md, the down tuning with
    ``EARLY``).
    """
    EARLY_ON: tl.constexpr = MMA and EARLY > 0
    if not EARLY_ON:  # else in mma_gemv, after the early loads (and the trigger right after it)
        gdc_wait()
        gdc_launch_dependents()
    IB: tl.constexpr = INTER // 2  # valid code bytes (and act bf16 pairs) per row
    IPB: tl.constexpr = IP // 2  # stored code bytes per row
    KP: tl.constexpr = (IP // 16 + 3) // 4 * 4
    MP: tl.constexpr = (H + 127) // 128 * 128
    NQ: tl.constexpr = (H + BH - 1) // BH  # counters per token
    p = tl.program_id(0)
    q = tl.program_id(1)
    t = p // TOPK
    if EARLY_ON:  # before the wait: through L2 only (written by the router, a grid completed before this launch)
        e = tl.load(ids_ptr + p, cache_modifier=".cg").to(tl.int64)
    else:
        e = tl.load(ids_ptr + p).to(tl.int64)
    s_row = s_ptr + e * (MP * KP)
    a_row = act_ptr + p.to(tl.int64) * IB
    if MMA:  # tile of BH * SK rows: (local row i, K-part), NW warps, RT rows per thread
        TR: tl.constexpr = BH * SK
        i, kpart = mma_tile_rows(TR, NW, SK)
        hi = q * BH + i
        hci = tl.where(hi < H, hi, 0)  # rows past H read row 0 (stores are masked)
        tt = mma_gemv(
            w_ptr + e * (H * IPB),
            hci.to(tl.int64) * IPB,
            s_row,
            hci,
            a_row,
            kpart,
            IB,
            KP,
            TR,
            RT,
            S,
            SK,
            p,
            FENCE,
            tl.minimum(e.to(tl.int32), 0),  # ids are >= 0: an opaque zero for FENCE
            EARLY,
            ids_ptr + p,  # EARLY: re-read after the wait, orders the activation loads after it
            True,  # EARLY: launch_dependents right after the wait
        )
        y_acc = mma_sum_parts(tt, TR, NW, SK)
        h = q * BH + tl.arange(0, BH)
        h_ok = h < H
    else:
        h = q * BH + tl.arange(0, BH)
        h_ok = h < H
        hc = tl.where(h_ok, h, 0)
        w_row = w_ptr + e * (H * IPB) + hc.to(tl.int64) * IPB
        y_acc = cuda_core_row_sums(w_row, s_row, hc, a_row, h_ok, IB, KP, BH, BKB, True)
    gs = tl.load(alpha_ptr + e)
    y = bf16_rn(global_scale(y_acc, gs))
    y_off = p.to(tl.int64) * H + h
    tl.store(y_ptr + y_off, y, mask=h_ok)
    if TAP:
        tl.store(dacc_ptr + y_off, y_acc, mask=h_ok)
    tl.debug_barrier()  # every thread's y stores precede the release below
    c_ptr = cnt_ptr + t * NQ + q
    arrived = tl.atomic_add(c_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == TOPK - 1:
        tl.atomic_xchg(c_ptr, 0, sem="relaxed", scope="gpu")
        hr = q * BH + tl.arange(0, BH)
        _combine_rows(t, hr, hr < H, tw_ptr, y_ptr, shared_ptr, out_ptr, H, TOPK)


def accumulation_model(config: dict | DownConfig | None = None):
    """The summation model that bounds y_acc of ``nvfp4_down`` with ``config`` (a ``DownConfig``, or overrides
    of ``DOWN_CONFIG``): ``block_model(16)`` for the CUDA-core path, ``FP32_TRUNCATE`` for the tensor-core path
    (``MMA``)."""
    from flint_moe.reference.exact import FP32_TRUNCATE, block_model

    mma = config.MMA if isinstance(config, DownConfig) else {**DOWN_CONFIG, **(config or {})}["MMA"]
    return FP32_TRUNCATE if mma else block_model(16)


def resolve_config(H: int, I: int, config: dict | None = None) -> DownConfig:  # noqa: E741
    """``default_config(H, I)`` with the ``config`` overrides, checked (``ValueError`` naming the key)."""
    return DownConfig.from_dict({**default_config(H, I), **(config or {})})


_COUNTERS: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters (>= n) for the split down kernel, one buffer per device, kept between
    calls (the kernel leaves them at 0). Launches using it must be serialized on one stream (as the router's
    counter); allocated on first use, i.e. outside a CUDA-graph capture when the op is warmed up first."""
    key = str(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def check_down_inputs(act: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, shared_output: torch.Tensor, weights):
    """Check the inputs of an NVFP4 down call against ``weights`` (``_weights_common``): ``ids`` int32 [M, k],
    ``tw`` fp32 [M, k], ``act`` bf16 [M * k, I], ``shared_output`` bf16 [M, H], contiguous, on the weights'
    device. Returns (E, M, k); TypeError / ValueError naming the tensor."""
    from flint_moe.kernels.nvfp4.gate_up import _weights_common

    E, H, _, INTER = _weights_common(weights)
    dev = weights.w2.device
    check_op_tensor("ids", ids, dtype=torch.int32, shape=(None, None), device=dev)
    M, top_k = (int(n) for n in ids.shape)
    check_op_tensor("tw", tw, dtype=torch.float32, shape=(M, top_k), device=dev)
    check_op_tensor("act", act, dtype=torch.bfloat16, shape=(M * top_k, INTER), device=dev)
    check_op_tensor("shared_output", shared_output, dtype=torch.bfloat16, shape=(M, H), device=dev)
    return E, M, top_k


def nvfp4_down(
    act: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, weights, shared_output: torch.Tensor,
    *, taps: dict | None = None, config: dict | None = None, out: torch.Tensor | None = None, check: bool = True,
) -> torch.Tensor:
    """Rule steps 8-10: out bf16 [M, H] from act bf16 [M * k, I] (``nvfp4_gate_up``), ids, tw and shared.

    Args:
        act: bf16 [M * k, I] contiguous (I = ``weights.valid_intermediate``).
        ids: int32 [M, k]; tw: fp32 [M, k] holding bf16 values (rule step 4); both contiguous.
        weights: ``FlintMoEWeights`` (w2 uint8 [E, H, Ip/2], swizzled scales, w2_alpha fp32 [E]).
        shared_output: bf16 [M, H] contiguous (the shared expert's output, rule step 10).
        taps: if a dict, compiled with ``TAP=True``: ``taps["down_acc"]`` fp32 [M, k, H] (before the global
            scale), ``taps["y"]`` bf16 [M, k, H], ``taps["out"]`` bf16 [M, H].
        config: overrides of ``default_config(H, I)`` (keys: ``nvfp4.config``).
        out: None (a new tensor is returned) or a bf16 [M, H] contiguous tensor written and returned (it must
            not overlap any input: the op checks that, ``ops._checks.check_out``).
        check: False skips the tensor checks, for a caller that made them (``launch_down``); the config
            is checked either way.

    Raises:
        TypeError / ValueError naming the offending tensor or config key.

    With ``EARLY`` (tensor-core config), ``ids`` is read before the kernel's ``griddepcontrol.wait``: it must
    have been written by a grid that completed before the previous kernel on the stream let this one launch, as
    in ``nvfp4_gate_up`` -> ``nvfp4_down`` (gate/up triggers its dependents only after its own wait, i.e. after
    the router, or whatever wrote ``ids``, completed); ``act``, ``tw`` and ``shared_output`` are read after it.
    """
    if check:
        _, M, _ = check_down_inputs(act, ids, tw, shared_output, weights)
        if out is not None:
            check_op_tensor("out", out, dtype=torch.bfloat16, shape=(M, weights.hidden_size), device=weights.w2.device)
    from flint_moe.kernels.nvfp4.gate_up import decode_sizes

    E, H, IP, INTER = decode_sizes(weights)
    dev = weights.w2.device
    M, top_k = ids.shape
    cfg = resolve_config(H, INTER, config)
    sk, nw = cfg.mma_launch(INTER)
    if out is None:
        out = torch.empty((M, H), dtype=torch.bfloat16, device=dev)
    tap = taps is not None
    y = torch.empty((M * top_k, H), dtype=torch.bfloat16, device=dev)
    dacc = torch.empty((M * top_k, H), dtype=torch.float32, device=dev) if tap else out  # else never written
    cap = {"maxnreg": cfg.maxnreg} if cfg.maxnreg and not INTERPRET else {}
    if M > 0:
        nq = triton.cdiv(H, cfg.BH)
        _nvfp4_down_split_kernel[(M * top_k, nq)](
            act.view(torch.int32),
            ids,
            tw,
            weights.w2,
            weights.w2_sf_swizzled.view(torch.uint8),
            weights.w2_alpha,
            shared_output,
            out,
            dacc,
            y,
            _counters(dev, M * nq),
            **_constexprs(cfg, H, IP, INTER, top_k, sk, nw, tap),
            num_warps=nw,
            num_stages=1,
            **cap,
            **launch_options(),
        )
    if tap:
        taps["down_acc"] = dacc.view(M, top_k, H)
        taps["y"] = y.view(M, top_k, H)
        taps["out"] = out
    return out


def launch_down(*args, **kwargs) -> torch.Tensor:
    """``nvfp4_down(..., check=False)``. On arguments already checked by the caller (the op
    ``flint_moe.ops.flint_moe``: its inputs at its boundary, ``ids`` / ``tw`` from ``route``, ``act`` from
    ``launch_gate_up``): no tensor checks here (a wrong dtype, shape or device reads out of bounds); the config is
    checked (ValueError)."""
    return nvfp4_down(*args, check=False, **kwargs)


def _constexprs(cfg: DownConfig, H: int, IP: int, INTER: int, top_k: int, sk: int, nw: int, tap: bool) -> dict:
    """The kernel's constexpr arguments for ``cfg`` as launched (K-split ``sk`` on ``nw`` warps): the decode
    kernels' common ones (``gate_up.decode_constexprs``) and ``EARLY``."""
    from flint_moe.kernels.nvfp4.gate_up import decode_constexprs

    return {**decode_constexprs(cfg, "BH", H, IP, INTER, top_k, sk, nw, tap), "EARLY": int(cfg.early)}


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of the down kernel at the builds ``gate_up.audit_specs`` audits (its
    ``audit_runs``: every matrix and tuned shape, the CUDA-core path and the tapped build at DeepSeek-V3)."""
    from flint_moe.kernels.nvfp4.gate_up import audit_runs, register_decode_audits

    sig = {"act_ptr": "*i32", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": "*u8", "s_ptr": "*u8",
        "alpha_ptr": "*fp32", "shared_ptr": "*bf16", "out_ptr": "*bf16", "dacc_ptr": "*fp32", "y_ptr": "*bf16",
        "cnt_ptr": "*i32"}
    from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned

    runs = audit_runs(resolve_config, _TUNED_DOWN_BY_SHAPE, nvfp4_tuned.DOWN_CUDA_CORE, ".cuda_core")
    return register_decode_audits(
        "nvfp4_down",
        _nvfp4_down_split_kernel,
        sig,
        _constexprs,
        runs,
        _require,
        lambda h, i: i,
        lambda cfg: {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {},
    )


def _require(cfg) -> list:
    """PTX a down build must contain (the tensor-core path's MMA or the CUDA-core path's f16 decode)."""
    from flint_moe.kernels.nvfp4.gate_up import MMA_PTX

    mma = MMA_PTX if cfg.MMA else ["mul.rn.f16x2"]
    return [BF16_CVT, "fma.rn.f32", *mma, "griddepcontrol.wait", "atom.global.gpu.acq_rel.add"]


audit_specs()
