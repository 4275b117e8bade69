"""Experts: rule steps 5-8 (NVFP4 dequant, gate/up, SwiGLU, down) and the BF16 variants.

All functions work on one expert's matrices (the model loops over the selected experts only) and take their
inputs explicitly, so the harness can feed a kernel's own intermediate values to any step.
fp32 arithmetic: separate torch float32 ops, each one IEEE round-to-nearest-even with subnormals kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._checks import check_multiple, check_same_device, check_tensor
from .exact import FP32_RN, Accumulation, SummationModel, dot_accumulate, dot_accumulate_rows, round_exact
from .formats import E2M1_VALUES, bits_to_f32, e4m3_to_float, to_bf16
from .weights import BLOCK, check_scale_bytes, scale_bytes

__all__ = [
    "SWIGLU_C",
    "dequant_nvfp4",
    "gate_up_accumulate",
    "gate_up_accumulate_bf16",
    "apply_global_scale",
    "swiglu",
    "down_accumulate",
    "down_accumulate_bf16",
    "replay_experts",
    "down_output",
    "down_output_bf16",
    "ExpertStages",
    "AccumulatePolicy",
    "nvfp4_expert",
    "bf16_expert",
]

#: ``policy(stage, acc, operands) -> fp32 tensor of acc.shape``: the fp32 value a kernel's accumulator holds
#: (default :func:`.exact.round_exact`, the binary32 rounding of the exact value).
AccumulatePolicy = Callable[[str, Accumulation, dict], torch.Tensor]

#: Step 7 constant c = fp32(-log2(e)), bits 0xBFB8AA3B (= -1.44269502162933349609375).
SWIGLU_C = float(bits_to_f32(torch.tensor(0xBFB8AA3B - (1 << 32), dtype=torch.int32)))


def _check_nvfp4(
    codes_name: str, codes: torch.Tensor, scale_name: str, scale: torch.Tensor
) -> tuple[int, int]:
    check_tensor(codes_name, codes, dtype=torch.uint8, ndim=2)
    n, k = codes.shape[0], 2 * codes.shape[1]
    check_multiple(codes_name, k, BLOCK, "unpacked row length (2 x last dimension)")
    check_tensor(scale_name, scale, dtype=(torch.uint8, torch.float8_e4m3fn), shape=(n, k // BLOCK))
    check_same_device(**{codes_name: codes, scale_name: scale})
    check_scale_bytes(scale_name, scale)
    return n, k


_CODE_TABLES: dict[tuple, torch.Tensor] = {}


def _code_table(dtype: torch.dtype, device: torch.device, *, absolute: bool = False) -> torch.Tensor:
    """[16]: the E2M1 value (``absolute``: magnitude) of each code 0..15; built once per (dtype, device,
    absolute), read-only (only indexed)."""
    key = (dtype, device, absolute)
    t = _CODE_TABLES.get(key)
    if t is None:
        v = torch.tensor(E2M1_VALUES, dtype=dtype, device=device)
        t = _CODE_TABLES[key] = v.abs() if absolute else v
    return t


def _unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [r, K/2] packed bytes -> int64 [r, K] E2M1 codes, the low nibble (even element) first."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).view(packed.shape[0], -1).long()


def _decode_codes(codes: torch.Tensor, dtype, *, absolute: bool = False) -> torch.Tensor:
    """int64 E2M1 codes -> their values in ``dtype`` (exact). ``torch.take`` on the 16-entry table: one
    elementwise pass (indexing a [256, 2] byte table instead ran CUDA's slice gather, ~2 ms per expert at
    DeepSeek-V3 sizes: 91% of the conformance harness's device time, scripts/diag_kernel_profile.py)."""
    return torch.take(_code_table(dtype, codes.device, absolute=absolute), codes)


def _dequant_rows(codes: torch.Tensor, scale: torch.Tensor, start: int, stop: int, dtype, unpacked=None):
    rows = codes[start:stop]
    n = _unpack_codes(rows) if unpacked is None else unpacked
    c = _decode_codes(n, dtype)  # [r, K]
    s = e4m3_to_float(scale_bytes(scale[start:stop])).to(dtype)
    w = c.view(rows.shape[0], -1, BLOCK) * s[:, :, None]  # exact: <= 6 significant bits, in [2^-10, 2688]
    return w.view(rows.shape[0], -1)


def dequant_nvfp4(codes: torch.Tensor, scale: torch.Tensor, *, names: tuple[str, str] = ("codes", "scale")):
    """Step 5: ``W = E2M1(code) * E4M3(scale)`` per 16-element block, exact (bf16-representable) in fp32.

    Args: ``codes`` uint8 [N, K/2] (low nibble = even element), ``scale`` uint8 or float8_e4m3fn [N, K/16]
    (negative and -0 bytes valid). ``names`` name the two tensors in errors. Returns fp32 [N, K].
    Raises TypeError / ValueError (dtype, shape, K not a multiple of 16, E4M3 NaN scale bytes 0x7F/0xFF).
    """
    n, _ = _check_nvfp4(names[0], codes, names[1], scale)
    return _dequant_rows(codes, scale, 0, n, torch.float32)


def _nvfp4_accumulate(
    x, x_name, codes, codes_name, scale, scale_name, model, order=None, mma=None
) -> Accumulation:
    n, k = _check_nvfp4(codes_name, codes, scale_name, scale)
    check_tensor(x_name, x, dtype=torch.bfloat16, shape=(None, k))
    check_same_device(**{x_name: x, codes_name: codes})

    def rows(i: int, j: int) -> tuple[torch.Tensor, bool, torch.Tensor, torch.Tensor]:
        # NVFP4 weights are finite (NaN scale bytes rejected); a non-zero |W| is >= 0.5 * |scale| >= 0.5 *
        # (the row's smallest non-zero |scale|), a lower bound for the underflow refinement. The unscaled
        # |E2M1| values give the block model's inner partial sums (exact.py, "Overflow").
        s = e4m3_to_float(scale_bytes(scale[i:j])).to(torch.float64).abs()
        s_min = torch.where(s > 0, s, math.inf).amin(dim=1) * 0.5
        n = _unpack_codes(codes[i:j])
        inner = _decode_codes(n, torch.float64, absolute=True)
        return _dequant_rows(codes, scale, i, j, torch.float64, n), True, s_min, inner

    acc = dot_accumulate_rows(x, rows, n, model=model, narrow_products=True, name=x_name)
    if order is None:
        return acc
    return dataclasses.replace(acc, replay=replay_experts(order, [x], [codes], [scale], mma=mma)[0])


def _with_replay(acc: Accumulation, order: dict | None, x: torch.Tensor, w: torch.Tensor, mma) -> Accumulation:
    if order is None:
        return acc
    return dataclasses.replace(acc, replay=replay_experts(order, [x], [w], mma=mma)[0])


def replay_experts(
    order: dict, xs: list[torch.Tensor], weights: list[torch.Tensor], scales: list[torch.Tensor] | None = None,
    *, mma=None,
) -> list[torch.Tensor]:
    """The ``replay`` of :func:`gate_up_accumulate` / :func:`down_accumulate` (``scales`` given: NVFP4) or of
    the ``_bf16`` variants (``scales`` None) for many experts at once: per expert fp32 [len(xs[i]), N], bit for
    bit what the single-expert call puts in ``Accumulation.replay`` (``orders_batched.replay_matmuls``: a
    tensor-core order advances a group of experts per k16 step).

    xs: per expert bf16 [m_i, K]; weights: per expert uint8 codes [N, K/2] with ``scales`` E4M3 [N, K/16], or
    bf16 [N, K] (K zero-padded to the order's length, as the kernels' padded K runs +0 * +0 terms). Raises
    TypeError / ValueError naming the tensor, OrderError for a declaration that does not fit.
    """
    from .orders import check_order
    from .orders_batched import group_size, is_chain_order, replay_matmuls

    length = check_order(order)["length"]
    if len(weights) != len(xs) or (scales is not None and len(scales) != len(xs)):
        raise ValueError(f"xs, weights, scales: one entry per expert, got {len(xs)}, {len(weights)}, "
                         f"{None if scales is None else len(scales)}")  # fmt: skip
    for i, x in enumerate(xs):
        if scales is None:
            check_tensor(f"xs[{i}]", x, dtype=torch.bfloat16, ndim=2)
            check_tensor(f"weights[{i}]", weights[i], dtype=torch.bfloat16, shape=(None, x.shape[1]))
        else:
            _, k = _check_nvfp4(f"weights[{i}]", weights[i], f"scales[{i}]", scales[i])
            check_tensor(f"xs[{i}]", x, dtype=torch.bfloat16, shape=(None, k))
    if not xs:
        return []

    def operands(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if scales is None:  # BF16: K zero-padded to the order's length
            pad = length - xs[i].shape[1]
            return (torch.nn.functional.pad(xs[i].float(), (0, pad)),
                    torch.nn.functional.pad(weights[i].float(), (0, pad)), None)  # fmt: skip
        return (xs[i], _decode_codes(_unpack_codes(weights[i]), torch.float32),
                e4m3_to_float(scale_bytes(scales[i])).to(torch.float32))  # fmt: skip

    # the weights' values are formed a group at a time (one expert's are N x K fp32), experts sorted by tokens
    out: list = [None] * len(xs)
    todo = sorted(range(len(xs)), key=lambda i: xs[i].shape[0])
    per = group_size(order, weights[0].shape[0], weights[0].device) if is_chain_order(order) else 1
    for g0 in range(0, len(todo), per):
        grp = todo[g0 : g0 + per]
        ops = [operands(i) for i in grp]
        blocks = None if scales is None else [o[2] for o in ops]
        done = replay_matmuls(order, [o[0] for o in ops], [o[1] for o in ops], block_scales=blocks, mma=mma)
        for i, r in zip(grp, done, strict=True):
            out[i] = r
    return out


def gate_up_accumulate(
    x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, *, model: SummationModel = FP32_RN,
    order: dict | None = None, mma=None,
) -> Accumulation:
    """Step 6 reduction, one NVFP4 expert: exact ``sum_h W13[n, h] * x[t, h]``, W13 dequantized (step 5).

    Args: ``x`` bf16 [M, H]; ``w13`` uint8 [2I, H/2] (rows [gate; up]); ``w13_scale`` E4M3 [2I, H/16];
    ``order``: a summation-order declaration (:mod:`.orders`) or None; ``mma``: its tensor-core step.
    Returns :class:`Accumulation` [M, 2I]: ``acc[:, :I]`` is gate, ``acc[:, I:]`` up (no global scale); with
    ``order``, ``replay`` holds the fp32 value of that order (E2M1 values and block scales as operands).
    The weights are dequantized a chunk of rows at a time (float64), never all at once.
    """
    return _nvfp4_accumulate(x, "x", w13, "w13", w13_scale, "w13_scale", model, order, mma)


def gate_up_accumulate_bf16(
    x: torch.Tensor, w13: torch.Tensor, *, model: SummationModel = FP32_RN, order: dict | None = None, mma=None
) -> Accumulation:
    """Step 6 (BF16 experts): exact ``x @ w13^T``; ``x`` bf16 [M, H], ``w13`` bf16 [2I, H] -> [M, 2I].
    ``order`` / ``mma``: as :func:`gate_up_accumulate` (``replay`` set when an order is given)."""
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2)
    check_tensor("w13", w13, dtype=torch.bfloat16, shape=(None, x.shape[1]))
    return _with_replay(dot_accumulate(x, w13, model=model, a_name="x", b_name="w13"), order, x, w13, mma)


def _global_scale(gs: torch.Tensor | float, like: torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(gs, torch.Tensor):
        check_tensor(name, gs, dtype=torch.float32)
        if gs.numel() != 1:
            raise ValueError(f"{name}: expected one fp32 value, got shape {tuple(gs.shape)}")
        return gs.reshape(()).to(like.device)
    if isinstance(gs, float):
        return torch.tensor(gs, dtype=torch.float32, device=like.device)  # fp32(gs)
    raise TypeError(f"{name}: expected an fp32 tensor or a float, got {type(gs).__name__}")


def apply_global_scale(
    acc_fp32: torch.Tensor, gs: torch.Tensor | float, *, name: str = "acc_fp32"
) -> torch.Tensor:
    """Step 6 / 8: ``RN(acc * gs)`` in fp32. ``acc_fp32`` fp32 (any shape); ``gs`` one fp32 value.

    Returns fp32 of ``acc_fp32``'s shape. Raises TypeError / ValueError naming the tensor.
    """
    check_tensor(name, acc_fp32, dtype=torch.float32)
    return acc_fp32 * _global_scale(gs, acc_fp32, "gs")


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Step 7 (TRT-LLM / FlashInfer CuTe epilogue), elementwise, fp32 ``g``, ``u`` of one shape -> bf16.

    ``a = RN(g * c)`` (c = 0xBFB8AA3B), ``p = ex2.approx.ftz(a)``, ``d = RN(p + 1)``,
    ``r = rcp.approx.ftz(d)``,
    ``act = bf16(RN(u * RN(g * r)))``; ex2 / rcp are the bit-exact PTX emulations of :mod:`.mufu`.
    Returns torch.bfloat16. Raises TypeError / ValueError naming ``g`` or ``u``.
    """
    from .mufu import ex2_approx_ftz, rcp_approx_ftz

    check_tensor("g", g, dtype=torch.float32)
    check_tensor("u", u, dtype=torch.float32, shape=tuple(g.shape))
    check_same_device(g=g, u=u)
    a = g * SWIGLU_C
    p = ex2_approx_ftz(a)
    d = p + 1.0
    r = rcp_approx_ftz(d)
    return to_bf16(u * (g * r))


def down_accumulate(
    act: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *, model: SummationModel = FP32_RN,
    order: dict | None = None, mma=None,
) -> Accumulation:
    """Step 8 reduction for one NVFP4 expert: exact ``sum_i W2[h, i] * act[t, i]``.

    Args: ``act`` bf16 [M, I]; ``w2`` uint8 [H, I/2]; ``w2_scale`` E4M3 [H, I/16]; ``order`` / ``mma`` as
    :func:`gate_up_accumulate`. Returns [M, H].
    """
    return _nvfp4_accumulate(act, "act", w2, "w2", w2_scale, "w2_scale", model, order, mma)


def down_accumulate_bf16(
    act: torch.Tensor, w2: torch.Tensor, *, model: SummationModel = FP32_RN, order: dict | None = None, mma=None
) -> Accumulation:
    """Step 8 (BF16 experts): exact ``act @ w2^T``; ``act`` bf16 [M, I], ``w2`` bf16 [H, I] -> [M, H].
    ``order`` / ``mma``: as :func:`gate_up_accumulate`."""
    check_tensor("act", act, dtype=torch.bfloat16, ndim=2)
    check_tensor("w2", w2, dtype=torch.bfloat16, shape=(None, act.shape[1]))
    return _with_replay(dot_accumulate(act, w2, model=model, a_name="act", b_name="w2"), order, act, w2, mma)


def down_output(y_acc: torch.Tensor, gs2: torch.Tensor | float) -> torch.Tensor:
    """Step 8: ``y = bf16(RN(y_acc * gs2))``; ``y_acc`` fp32, ``gs2`` one fp32 value -> torch.bfloat16."""
    return to_bf16(apply_global_scale(y_acc, gs2, name="y_acc"))


def down_output_bf16(y_acc: torch.Tensor) -> torch.Tensor:
    """Step 8 (BF16 experts): ``y = bf16(y_acc)``; ``y_acc`` fp32 -> torch.bfloat16."""
    check_tensor("y_acc", y_acc, dtype=torch.float32)
    return to_bf16(y_acc)


@dataclass(frozen=True)
class ExpertStages:
    """Every stage of steps 6-8 for one expert applied to M token rows.

    Fields: ``gate_acc``, ``up_acc`` :class:`Accumulation` [M, I]; ``g``, ``u`` fp32 [M, I] (global scale
    applied for NVFP4); ``act`` bf16 [M, I]; ``down_acc`` :class:`Accumulation` [M, H]; ``y`` bf16 [M, H].
    """

    gate_acc: Accumulation
    up_acc: Accumulation
    g: torch.Tensor
    u: torch.Tensor
    act: torch.Tensor
    down_acc: Accumulation
    y: torch.Tensor


def _policy_value(policy: AccumulatePolicy, stage: str, acc: Accumulation, operands: dict) -> torch.Tensor:
    if acc.replay is not None:  # a declared order was replayed: that is the accumulator's fp32 value
        return acc.replay
    v = policy(stage, acc, operands)
    check_tensor(f"accumulate({stage})", v, dtype=torch.float32, shape=tuple(acc.shape))
    return v


def nvfp4_expert(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_gs: torch.Tensor | float,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_gs: torch.Tensor | float,
    *,
    accumulate: AccumulatePolicy = round_exact,
    model: SummationModel = FP32_RN,
    info: dict | None = None,
    orders: dict | None = None,
    mma=None,
) -> ExpertStages:
    """Steps 5-8 for one NVFP4 expert on rows ``x`` bf16 [M, H].

    ``w13`` uint8 [2I, H/2], ``w13_scale`` [2I, H/16], ``w13_gs`` one fp32 value; ``w2`` uint8 [H, I/2],
    ``w2_scale`` [H, I/16], ``w2_gs`` one fp32 value. The fp32 accumulator values come from ``accumulate``
    (stages ``"gate_up"`` on [M, 2I] and ``"down"`` on [M, H]; ``operands`` holds the inputs plus ``info``),
    except for a stage that ``orders`` (stage -> declaration, :mod:`.orders`) declares: its value is the
    replay of that order (``mma``: the tensor-core step, default :mod:`.mma`).
    """
    extra = dict(info or {})
    orders = orders or {}
    acc13 = gate_up_accumulate(x, w13, w13_scale, model=model, order=orders.get("gate_up"), mma=mma)
    i = acc13.shape[1] // 2
    v13 = _policy_value(accumulate, "gate_up", acc13, {"x": x, "w13": w13, "w13_scale": w13_scale, **extra})
    g = apply_global_scale(v13[:, :i], w13_gs, name="g_acc")
    u = apply_global_scale(v13[:, i:], w13_gs, name="u_acc")
    act = swiglu(g, u)
    acc2 = down_accumulate(act, w2, w2_scale, model=model, order=orders.get("down"), mma=mma)
    v2 = _policy_value(accumulate, "down", acc2, {"act": act, "w2": w2, "w2_scale": w2_scale, **extra})
    y = down_output(v2, w2_gs)
    return ExpertStages(acc13[:, :i], acc13[:, i:], g, u, act, acc2, y)


def bf16_expert(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *, accumulate: AccumulatePolicy = round_exact,
    model: SummationModel = FP32_RN, info: dict | None = None, orders: dict | None = None, mma=None,
) -> ExpertStages:
    """Steps 6-8 for one BF16 expert on rows ``x`` bf16 [M, H]: ``w13`` bf16 [2I, H], ``w2`` bf16 [H, I].
    ``orders`` / ``mma``: as :func:`nvfp4_expert`."""
    extra = dict(info or {})
    orders = orders or {}
    check_tensor("w13", w13, dtype=torch.bfloat16, ndim=2)
    if w13.shape[0] % 2:
        raise ValueError(f"w13: dimension 0 holds [gate; up] and must be even, got {w13.shape[0]}")
    acc13 = gate_up_accumulate_bf16(x, w13, model=model, order=orders.get("gate_up"), mma=mma)
    i = acc13.shape[1] // 2
    v13 = _policy_value(accumulate, "gate_up", acc13, {"x": x, "w13": w13, **extra})
    g, u = v13[:, :i], v13[:, i:]
    act = swiglu(g.contiguous(), u.contiguous())
    acc2 = down_accumulate_bf16(act, w2, model=model, order=orders.get("down"), mma=mma)
    v2 = _policy_value(accumulate, "down", acc2, {"act": act, "w2": w2, **extra})
    return ExpertStages(acc13[:, :i], acc13[:, i:], g, u, act, acc2, down_output_bf16(v2))
