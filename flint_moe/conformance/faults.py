"""Diagnosis of failing cases: a catalogue of known faults tried on the GOLDEN side (issue 5 "Diagnosis").

Each :class:`Fault` recomputes ONE stage the way a kernel with that fault would, teacher-forced from the
kernel's own taps (the same inputs ``compare.compare_case`` gives the golden model). ``diagnose(case, inputs,
taps, out, result)`` tries every fault whose stage FAILed in ``result`` (and that applies to the case's path)
and names those whose faulty golden value equals the kernel's tap bit for bit on EVERY element, e.g.
``"gate_up_swapped: matches the reference with gate/up swapped"``.

Catalogue (:data:`FAULTS`):

==========================  ======  ====================================================================
name                        stage   the faulty rule
==========================  ======  ====================================================================
gate_up_swapped             act     ``act = SwiGLU(up, gate)`` (operands swapped)
act_rounded_twice           act     ``act = bf16(u * bf16(g * r))`` (the SiLU rounded to bf16 first)
global_scale_after_round    y       ``y = bf16(bf16(down_acc) * gs2)`` (NVFP4 only)
topk_ties_highest           ids     top-k ties resolved to the HIGHEST expert index
renorm_no_eps               weights ``tw = bf16(s / S)`` without the fp32(1e-20) epsilon
==========================  ======  ====================================================================

Not catalogued yet: an exact (correctly rounded) sigmoid instead of the rule's (``_act_exact_sigmoid`` is
the golden variant for SwiGLU): its 1-2 fp32-ulp change of ``r`` is almost always hidden by the bf16
rounding of ``act`` (likewise of ``tw`` in the router), so the tiny mutation cases cannot kill it; it needs
an fp32 sigmoid tap or a large case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flint_moe.reference.experts import SWIGLU_C
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.routing import routing_scores, total_order_key

from .compare import _bits_equal

__all__ = ["Fault", "FAULTS", "diagnose", "faulty_stage"]


@dataclass(frozen=True)
class Fault:
    """One catalogued fault: ``name``, ``stage`` (a ``compare.STAGES`` entry it shows up in), ``what``
    (completes "matches the reference with ..."), ``paths`` (paths it applies to; empty = all),
    ``fn(case, inputs, taps) -> tensor``: the stage's golden value under the fault, from the kernel's taps."""

    name: str
    stage: str
    what: str
    fn: Callable
    paths: tuple[str, ...] = ()

    def applies(self, path: str) -> bool:
        return not self.paths or path in self.paths


def _logical(inputs):
    return getattr(inputs, "weights_logical", None) or inputs.logical


def _gu(case, inputs, t):
    """(g, u) fp32 [M, k, W]: the kernel's gate/up accumulators, global scale applied on NVFP4."""
    g, u = t["gate_acc"].float(), t["up_acc"].float()
    if case.path == "nvfp4_decode":
        gs = _logical(inputs).w13_gs.to(g.device)[t["ids"].long()][..., None]
        g, u = g * gs, u * gs  # one fp32 RN each, as apply_global_scale
    return g, u


def _swiglu_parts(g, u, *, exact: bool = False):
    from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz

    if exact:
        r = (1.0 / (1.0 + torch.exp(-g.double()))).float()
    else:
        r = rcp_approx_ftz(ex2_approx_ftz(g * SWIGLU_C) + 1.0)
    return g, u, r


def _act_swapped(case, inputs, t):
    g, u = _gu(case, inputs, t)
    g, u, r = _swiglu_parts(u, g)
    return to_bf16(u * (g * r))


def _act_twice(case, inputs, t):
    g, u, r = _swiglu_parts(*_gu(case, inputs, t))
    return to_bf16(u * to_bf16(g * r).float())


def _act_exact_sigmoid(case, inputs, t):
    g, u, r = _swiglu_parts(*_gu(case, inputs, t), exact=True)
    return to_bf16(u * (g * r))


def _y_scale_after(case, inputs, t):
    gs = _logical(inputs).w2_gs.to(t["down_acc"].device)[t["ids"].long()][..., None]
    return to_bf16(to_bf16(t["down_acc"].float()).float() * gs)


def _ids_ties_highest(case, inputs, t):
    logits = t["logits"]
    E = logits.shape[1]
    key = total_order_key(logits).long() * E + torch.arange(E, device=logits.device)
    return torch.topk(key, int(case.k), dim=1).indices.to(torch.int32)


def _weights_no_eps(case, inputs, t):
    s = routing_scores(torch.gather(t["logits"], 1, t["ids"].long()))
    total = s[:, 0].clone()
    for j in range(1, s.shape[1]):
        total = total + s[:, j]
    return round_bf16(s / total[:, None])


FAULTS: tuple[Fault, ...] = (
    Fault("gate_up_swapped", "act", "gate/up swapped (SwiGLU(up, gate))", _act_swapped),
    Fault("act_rounded_twice", "act", "act rounded twice (bf16 of g*r before multiplying by u)", _act_twice),
    Fault(
        "global_scale_after_round",
        "y",
        "the global scale applied after the bf16 rounding of y",
        _y_scale_after,
        ("nvfp4_decode",),
    ),  # fmt: skip
    Fault("topk_ties_highest", "ids", "top-k ties resolved to the highest expert index", _ids_ties_highest),
    Fault("renorm_no_eps", "weights", "renormalisation without the epsilon", _weights_no_eps),
)


def faulty_stage(fault: Fault, case, inputs, taps: dict) -> torch.Tensor:
    """The golden value of ``fault.stage`` under ``fault``, teacher-forced from ``taps``."""
    dev = inputs.x.device
    t = {k: v.detach().to(dev) for k, v in taps.items() if isinstance(v, torch.Tensor)}
    return fault.fn(case, inputs, t)


def diagnose(case, inputs, taps: dict, out, result) -> list[str]:
    """Names of the catalogued faults whose golden variant reproduces a FAILing stage of ``result`` exactly
    (every element bitwise equal to the kernel's tap), as ``"<name>: matches the reference with <what>"``.
    Faults whose recomputation cannot run on these taps (missing / malformed) are skipped silently."""
    failed = set(result.failed_stages)
    found = []
    for f in FAULTS:
        if f.stage not in failed or not f.applies(case.path):
            continue
        kernel = taps.get(f.stage)
        if not isinstance(kernel, torch.Tensor):
            continue
        try:
            gold = faulty_stage(f, case, inputs, taps)
        except Exception:  # noqa: BLE001  (taps unusable for this fault)
            continue
        kernel = kernel.detach().to(gold.device)
        if kernel.shape != gold.shape or kernel.dtype != gold.dtype:
            # act / y taps may carry padded columns: compare the logical width
            if kernel.dim() == gold.dim() and kernel.shape[:-1] == gold.shape[:-1] and kernel.dtype == gold.dtype:
                w = min(kernel.shape[-1], gold.shape[-1])
                kernel, gold = kernel[..., :w], gold[..., :w]
            else:
                continue
        if bool(_bits_equal(kernel, gold).all()):
            found.append(f"{f.name}: matches the reference with {f.what}")
    return found
