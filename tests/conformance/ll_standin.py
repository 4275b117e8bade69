"""A stand-in kernel side for the decode block's conformance paths on the CPU (the CuTe DSL kernels of
``flint_moe.ops.flint_moe_ll`` have no CPU interpreter).

:func:`standin_flint_moe_ll` has the op's signature and fills the op's taps from the golden model's
``reference.model.moe_decode_block`` (every accumulator RN32 of its exact sum), reading the weights back from
the ``LLMoEWeights`` views with the golden model's own decoders (``experts_from_cutedsl``,
``unswizzle_scales``); :func:`install` puts it where the path and the module look the op up.
"""

from __future__ import annotations

import torch

from flint_moe.reference.exact import round_exact
from flint_moe.reference.layouts import experts_from_cutedsl, unswizzle_scales
from flint_moe.reference.model import moe_decode_block
from flint_moe.reference.weights import NVFP4Linear

CALLS: list[dict] = []


def shared_linear(codes: torch.Tensor, sf: torch.Tensor, gs: torch.Tensor) -> NVFP4Linear:
    """The logical shared linear of a stored one (swizzled scale bytes decoded by the golden model)."""
    n, k = codes.shape[0], 2 * codes.shape[1]
    logical = unswizzle_scales(sf.reshape(1, -1), n, k // 16, name="shared scales")[0]
    return NVFP4Linear(codes, logical.contiguous().view(torch.float8_e4m3fn), gs.reshape(()))


def golden_block_taps(attn_out, residual, ln_weight, eps, w, top_k) -> dict:
    """Every tap of the op, from ``moe_decode_block`` on the weights decoded from ``w`` (LLMoEWeights)."""
    sw13 = shared_linear(w.shared_w13, w.shared_w13_sf, w.shared_w13_gs)
    sw2 = shared_linear(w.shared_w2, w.shared_w2_sf, w.shared_w2_gs)
    d = moe_decode_block(attn_out, residual, ln_weight, eps, w.router_weight, experts_from_cutedsl(w.experts), top_k,
                         sw13, sw2)  # fmt: skip
    sh, r = d.shared_expert, d.moe
    return {
        "residual_out": d.residual, "sumsq": d.sumsq, "xn": d.xn,
        "router_acc": round_exact("", r.router_acc), "logits": r.logits, "ids": r.ids, "weights": r.weights,
        "gate_acc": round_exact("", r.gate_acc), "up_acc": round_exact("", r.up_acc), "act": r.act,
        "shared_gate_acc": round_exact("", sh.gate_acc),
        "shared_up_acc": round_exact("", sh.up_acc), "shared_act": sh.act,
        "shared_down_acc": round_exact("", sh.down_acc), "shared_y": d.y_shared,
        "down_acc": round_exact("", r.down_acc), "y": r.y, "out": d.out,
    }  # fmt: skip


def standin_flint_moe_ll(attn_out, residual, ln_weight, eps, w, top_k, counter, *, taps=None):
    """The op's contract on the golden model: ``(moe_out, residual_out)``, taps filled when a dict is given."""
    CALLS.append({"attn_out": attn_out, "residual": residual, "ln_weight": ln_weight, "eps": eps, "w": w,
                  "top_k": top_k, "counter": counter})  # fmt: skip
    t = golden_block_taps(attn_out, residual, ln_weight, eps, w, top_k)
    if taps is not None:
        taps.update({k: v.clone() for k, v in t.items()})
    return t["out"].clone(), t["residual_out"].clone()


def install(monkeypatch) -> None:
    """Put the stand-in where ``run.paths`` and ``modules.FlintLLDecodeBlock`` look the op up."""
    from flint_moe.ops import moe_ll

    CALLS.clear()
    monkeypatch.setattr(moe_ll, "flint_moe_ll", standin_flint_moe_ll, raising=False)
