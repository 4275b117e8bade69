"""Stage-by-stage judgement of the low-latency decode block (paths ``ll_block`` / ``ll_module``): rule step 11,
the NVFP4 shared expert, then steps 1-10 on the kernel's own ``xn`` and ``shared_y`` (teacher forcing).

``compare_block_case(case, inputs, taps, out) -> CaseResult``; ``inputs`` a ``inputs.block.BlockInputs``
(``x`` = attn_out, ``shared`` = residual). The block's own stages, before the routed ones of
:mod:`~flint_moe.conformance.judge.stages`:

================  ============================================================  =========================
stage             golden value (``reference.decode_block``, ``reference.experts``)  criterion
================  ============================================================  =========================
residual_out      ``bf16(RN(attn_out + residual))``; the op's returned           bits
                  ``residual_out`` (``taps["returned_residual_out"]``) too
sumsq             exact ``sum_h s_h^2`` (declared order ``sumsq`` replayed)        within bound / replay
xn                RMSNorm of ``s`` with the kernel's ``sumsq`` (rsqrt.approx.ftz)  bits
shared_gate_acc   exact ``xn . W13s[:SI]^T`` on the kernel's ``xn``              within bound / replay
shared_up_acc     exact ``xn . W13s[SI:]^T``                                     within bound / replay
shared_act        SwiGLU of ``RN(acc * gs13)`` of the kernel's accumulators      bits
shared_down_acc   exact ``shared_act . W2s^T`` on the kernel's ``shared_act``     within bound / replay
shared_y          ``bf16(RN(shared_down_acc * gs2))``                            bits
================  ============================================================  =========================

Routed stages (``router_acc`` .. ``out``): ``stages.compare_case`` with ``x`` = the kernel's ``xn`` and the
shared output = the kernel's ``shared_y``, as the path ``nvfp4_ll`` (the CuTe kernels' summation model:
products exact, one fp32 rounding per addition, ``FP32_RN``); the end-to-end check is the golden model run
from those two taps (a difference born before them is judged by the block's stages above). Declared orders
(``run.paths.block_orders``, GPU runs only) are replayed bitwise where a stage has one.

:func:`block_taps` is the golden model's own run as taps (every accumulator RN32 of its exact sum), from the
inputs or from a given ``xn`` / ``shared_y`` on: the stand-in kernel side of the CPU tests and the
re-simulation after an injected fault (``block_injections``).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from flint_moe.conformance.judge.metrics import _bits_equal, _tap, _usable
from flint_moe.conformance.judge.results import FAIL, CaseResult, StageResult, worst_verdict
from flint_moe.conformance.judge.stages import _meta, compare_accumulation, compare_bits, compare_case
from flint_moe.reference.combine import add_shared, combine_fp32
from flint_moe.reference.decode_block import residual_add, rmsnorm_apply, sum_squares
from flint_moe.reference.exact import FP32_RN, round_exact
from flint_moe.reference.experts import (
    apply_global_scale,
    down_accumulate,
    down_output,
    gate_up_accumulate,
    nvfp4_expert,
    swiglu,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.model import moe_nvfp4

__all__ = ["BLOCK_STAGES", "BLOCK_ACCUMULATIONS", "ROUTED_PATH", "block_taps", "compare_block_case"]

#: The block's own stages, in rule order (before ``results.STAGES``).
BLOCK_STAGES = ("residual_out", "sumsq", "xn", "shared_gate_acc", "shared_up_acc", "shared_act", "shared_down_acc",
                "shared_y")  # fmt: skip
BLOCK_ACCUMULATIONS = ("sumsq", "shared_gate_acc", "shared_up_acc", "shared_down_acc")
#: The path name the routed stages are judged as (``stages.PATH_MODELS``: NVFP4 experts, ``FP32_RN``).
ROUTED_PATH = "nvfp4_ll"


def _golden_s(inputs) -> torch.Tensor:
    return residual_add(inputs.x.detach(), inputs.shared.detach())


def _front(inputs, t, orders, dev) -> tuple[dict, torch.Tensor]:
    """residual_out, sumsq, xn; returns (results, the xn the later stages read)."""
    res: dict[str, StageResult] = {}
    s = _golden_s(inputs)
    r = compare_bits("residual_out", t["residual_out"], to_bf16(s), note="bf16(attn_out + residual)")
    ret = t.get("returned_residual_out")
    if isinstance(ret, torch.Tensor) and isinstance(t["residual_out"], torch.Tensor):
        if ret.shape != t["residual_out"].shape or not bool(_bits_equal(ret.to(dev), t["residual_out"]).all()):
            r.verdict = FAIL
            r.note += "; the returned residual_out differs from taps['residual_out']"
    res["residual_out"] = r
    acc = sum_squares(s, model=FP32_RN)
    o_sq = orders.get("sumsq")
    if o_sq is not None:
        from flint_moe.reference.orders import replay_dot

        acc = dataclasses.replace(acc, replay=replay_dot(o_sq, s, s))
    res["sumsq"] = compare_accumulation("sumsq", t["sumsq"], acc, order=o_sq)
    m = s.shape[0]
    if _usable(t["sumsq"], (m,), torch.float32):
        gold_xn = rmsnorm_apply(s, t["sumsq"].contiguous(), inputs.ln_weight.to(dev), inputs.eps)
        res["xn"] = compare_bits("xn", t["xn"], gold_xn, note="step 11 on the kernel's sumsq")
    else:
        gold_xn = rmsnorm_apply(s, round_exact("sumsq", acc), inputs.ln_weight.to(dev), inputs.eps)
        res["xn"] = StageResult("xn", "bits", FAIL, note="sumsq tap unusable: xn not checked")
    xn = t["xn"] if _usable(t["xn"], tuple(s.shape), torch.bfloat16) else gold_xn
    return res, xn.contiguous()


def _shared(inputs, t, xn, orders, dev) -> tuple[dict, torch.Tensor]:
    """The shared expert's stages on ``xn``; returns (results, the shared_y the combine reads)."""
    res: dict[str, StageResult] = {}
    w13, w2 = inputs.shared_w13, inputs.shared_w2
    si, m, h = w13.out_features // 2, xn.shape[0], xn.shape[1]
    o_gu, o_dn = orders.get("shared_gate_up"), orders.get("shared_down")
    gu = gate_up_accumulate(xn, w13.codes.to(dev), w13.block_scale.to(dev), model=FP32_RN, order=o_gu)
    res["shared_gate_acc"] = compare_accumulation("shared_gate_acc", t["shared_gate_acc"], gu[..., :si], order=o_gu)
    res["shared_up_acc"] = compare_accumulation("shared_up_acc", t["shared_up_acc"], gu[..., si:], order=o_gu)
    gs13, gs2 = w13.global_scale.to(dev).reshape(1), w2.global_scale.to(dev).reshape(1)
    g_tap, u_tap, a_tap = t["shared_gate_acc"], t["shared_up_acc"], t["shared_act"]
    if _usable(g_tap, (m, si), torch.float32) and _usable(u_tap, (m, si), torch.float32):
        gold = swiglu(apply_global_scale(g_tap.contiguous(), gs13), apply_global_scale(u_tap.contiguous(), gs13))
        res["shared_act"] = compare_bits("shared_act", a_tap, gold, note="SwiGLU of the kernel's accumulators")
    else:
        res["shared_act"] = StageResult("shared_act", "bits", FAIL, note="shared gate/up taps unusable")
    if _usable(a_tap, (m, si), torch.bfloat16):
        d = down_accumulate(a_tap.contiguous(), w2.codes.to(dev), w2.block_scale.to(dev), model=FP32_RN, order=o_dn)
        res["shared_down_acc"] = compare_accumulation("shared_down_acc", t["shared_down_acc"], d, order=o_dn)
    else:
        res["shared_down_acc"] = StageResult("shared_down_acc", "accumulation", FAIL,
                                             note="shared_act tap unusable: not checked")  # fmt: skip
    d_tap = t["shared_down_acc"]
    if _usable(d_tap, (m, h), torch.float32):
        res["shared_y"] = compare_bits("shared_y", t["shared_y"], down_output(d_tap.contiguous(), gs2))
        y = t["shared_y"] if _usable(t["shared_y"], (m, h), torch.bfloat16) else down_output(d_tap.contiguous(), gs2)
    else:
        res["shared_y"] = StageResult("shared_y", "bits", FAIL, note="shared_down_acc tap unusable: not checked")
        y = block_taps(inputs, xn=xn)["shared_y"]
    return res, y.contiguous()


def compare_block_case(case, inputs, taps: dict, out: torch.Tensor, *, orders="auto") -> CaseResult:
    """Judge one block run (module docstring): the block's stages, then the routed stages teacher-forced on the
    kernel's ``xn`` and ``shared_y``. ``orders``: "auto" (the declared orders on a GPU run,
    ``replay.case_orders``), None or a dict. Returns a :class:`CaseResult` whose stages are
    :data:`BLOCK_STAGES` then ``results.STAGES``. Raises TypeError when ``taps`` is not a dict."""
    from flint_moe.conformance.judge.replay import case_orders

    if not isinstance(taps, dict):
        raise TypeError(f"taps: expected a dict, got {type(taps).__name__}")
    dev = inputs.x.device
    if isinstance(orders, str) and orders == "auto":
        orders = case_orders(case, dev)
    orders = orders or {}
    t = {name: _tap(taps, name, dev) for name in BLOCK_STAGES}
    t["returned_residual_out"] = taps.get("returned_residual_out")
    front, xn = _front(inputs, t, orders, dev)
    shared, y_shared = _shared(inputs, t, xn, orders, dev)
    sub_case = SimpleNamespace(id=case.id, path=ROUTED_PATH, k=case.k, M=case.M)
    sub_inputs = SimpleNamespace(x=xn, router_weight=inputs.router_weight, shared=y_shared,
                                 weights_logical=inputs.logical)  # fmt: skip
    routed_orders = {k: orders[k] for k in ("router", "gate_up", "down") if k in orders}
    sub = compare_case(sub_case, sub_inputs, taps, out, orders=routed_orders)
    stages = [*(front[n] for n in BLOCK_STAGES[:3]), *(shared[n] for n in BLOCK_STAGES[3:]), *sub.stages]
    e2e = sub.end_to_end
    if e2e is not None:
        e2e.note = ("from the kernel's xn and shared_y (the block's own stages judge them)"
                    + (f"; {e2e.note}" if e2e.note else ""))  # fmt: skip
    meta = _meta(case, inputs, dev)
    meta["SI"] = int(inputs.shared_w13.out_features // 2)
    return CaseResult(
        case_id=str(case.id), path=case.path,
        verdict=worst_verdict([*(s.verdict for s in stages), *([e2e.verdict] if e2e is not None else [])]),
        stages=stages, meta=meta, digests=sub.digests, end_to_end=e2e,
    )  # fmt: skip


def block_taps(inputs, *, xn: torch.Tensor | None = None, shared_y: torch.Tensor | None = None, taps=None) -> dict:
    """The golden model's run of the block as the op's taps (every accumulator RN32 of its exact sum,
    ``reference.exact.round_exact``), plus ``out``. From the inputs (``xn`` None), or from a given ``xn``
    (bf16 [M, H]: the shared expert and steps 1-10 re-run on it; ``residual_out`` / ``sumsq`` taken from
    ``taps``), or from a given ``shared_y`` (only ``out`` recomputed from ``taps``' weights and y).
    Returns a new dict of tensors: the op's tap names (``residual_out`` .. ``out``)."""
    t = dict(taps or {})
    dev = inputs.x.device
    if shared_y is not None:
        t["shared_y"] = shared_y
        t["out"] = add_shared(to_bf16(combine_fp32(t["weights"], t["y"])), shared_y)
        return t
    if xn is None:
        s = _golden_s(inputs)
        sq = sum_squares(s)
        t["residual_out"], t["sumsq"] = to_bf16(s), round_exact("sumsq", sq)
        xn = rmsnorm_apply(s, t["sumsq"], inputs.ln_weight.to(dev), inputs.eps)
    t["xn"] = xn
    w13, w2 = inputs.shared_w13, inputs.shared_w2
    si = w13.out_features // 2
    sh = nvfp4_expert(xn, w13.codes, w13.block_scale, w13.global_scale, w2.codes, w2.block_scale, w2.global_scale)
    gu = torch.cat([round_exact("", sh.gate_acc), round_exact("", sh.up_acc)], dim=-1)
    t["shared_gate_acc"], t["shared_up_acc"] = gu[..., :si].contiguous(), gu[..., si:].contiguous()
    t["shared_act"], t["shared_down_acc"], t["shared_y"] = sh.act, round_exact("", sh.down_acc), sh.y
    r = moe_nvfp4(xn, inputs.router_weight, inputs.logical, int(inputs.notes["top_k"]), sh.y)
    t["router_acc"], t["logits"], t["ids"], t["weights"] = round_exact("", r.router_acc), r.logits, r.ids, r.weights
    t["gate_acc"], t["up_acc"] = round_exact("", r.gate_acc), round_exact("", r.up_acc)
    t["act"], t["down_acc"], t["y"], t["out"] = r.act, round_exact("", r.down_acc), r.y, r.out
    return t
