"""Diagnosis of failing cases: a catalogue of known faults tried on the GOLDEN side.

``diagnose(case, inputs, taps, out, result)`` tries every catalogued fault that applies to the case's path
and whose first stage FAILed in ``result``, and names those that reproduce the kernel, e.g.
``"w13_halves_swapped: matches the reference with gate/up swapped (w13 halves read the wrong way round)"``.
Two kinds of fault:

* ``kind="stage"``: ``fn(case, inputs, taps) -> tensor`` recomputes ONE stage the way a kernel with the
  fault would, teacher-forced from the kernel's own taps (the inputs ``stages.compare_case`` gives the
  golden model); it reproduces when every element equals the kernel's tap (``out``: the returned output)
  bit for bit (NaN as NaN-ness).
* ``kind="weights"`` (layout faults): ``fn(case, inputs) -> logical weights`` decodes the STORED weights
  (``inputs.stored``: ``FlintMoEWeights`` / ``(g1, g2, row_maps)``) the wrong way, with faulty variants of the
  independent decoders of ``flint_moe.reference.layouts`` written here (``flint_moe.layouts`` is never
  imported); it reproduces when ``compare_case`` with those logical weights has no FAIL at all.

Catalogue (:data:`FAULTS`; paths: nv = nvfp4_decode and nvfp4_grouped, bf = bf16_decode):

==========================  ========  =====  =============================================================
name                        stage     paths  the faulty rule
==========================  ========  =====  =============================================================
w13_halves_swapped          gate_acc  nv bf  w13 [gate; up] halves read the wrong way round (layout)
interleave_group_32         gate_acc  nv     CuTe-DSL [up; gate] interleave read with 32-row groups, not 64
interleave_group_128        gate_acc  nv     ... with 128-row groups (needs Ip % 128 == 0)
scale_swizzle_missing       gate_acc  nv     block scales read row-major (r * Kp + c), 128x4 swizzle ignored
scale_swizzle_transposed    gate_acc  nv     128x4 tile read row-major inside (4 * (r % 128) + c % 4)
nibble_order_swapped        gate_acc  nv     E2M1 codes: high nibble taken as the even element
row_shuffle_missing         gate_acc  bf     TRT-LLM BF16 rows without the epilogue-tile shuffle (w13, w2)
gate_up_swapped             act       nv bf  ``act = SwiGLU(up, gate)`` (epilogue operands swapped)
act_rounded_twice           act       nv bf  ``act = bf16(u * bf16(g * r))`` (the SiLU rounded to bf16 first)
exact_sigmoid               act       nv bf  ``r = 1 / (1 + e^-g)`` correctly rounded instead of
                                             ``rcp.approx.ftz(ex2.approx.ftz(g * c) + 1)`` (step 7)
global_scale_after_round    y         nv     ``y = bf16(bf16(down_acc) * gs2)``
global_scale_missing        y         nv     ``y = bf16(down_acc)`` (w2 global scale never applied)
topk_ties_highest           ids       nv bf  top-k ties resolved to the HIGHEST expert index
topk_ascending_index        ids       nv bf  the right experts, listed by ascending index (not by logit)
renorm_no_eps               weights   nv bf  ``tw = bf16(s / S)`` without the fp32(1e-20) epsilon
renorm_reverse_order        weights   nv bf  ``S`` summed from the last selected slot to the first
routing_weights_unrounded   weights   nv bf  ``tw = div_rn(s, RN(S + eps))`` not rounded to bf16
combine_bf16_accumulate     out       nv bf  the step-9 accumulator rounded to bf16 after every fma
shared_added_unrounded      out       nv bf  ``out = bf16(RN(acc + shared))``: routed not rounded first
residual_rounded_before_..  xn        ll     step 11 normalises ``bf16(s)`` instead of the fp32 sum ``s``
eps_after_rsqrt             xn        ll     ``inv = RN(rsqrt.approx(mean) + eps)`` (eps added after rsqrt)
rsqrt_exact                 xn        ll     ``inv = RN(1 / RN(sqrt(RN(mean + eps))))`` (no rsqrt.approx.ftz)
shared_global_scale_afte..  shared_y  ll     ``shared_y = bf16(bf16(shared_down_acc) * gs2)``
shared_expert_skipped       out       ll     ``out = bf16(routed combine)``: the shared output never added
==========================  ========  =====  =============================================================

ll = the decode block's paths (``ll_block``, ``ll_module``; ``judge/block.py``), which also take every nv fault
(the routed experts are the same ``FlintMoEWeights``; their shared output is the kernel's ``shared_y`` tap).

Layout faults show up first at ``gate_acc`` (the w13 decode), or at ``down_acc`` when only w2 is affected;
:func:`diagnose` tries them when any accumulation stage FAILs. Rule faults whose visible effect is rare on
random data (``exact_sigmoid``: only where ``g < -87.3``, where ``rcp.approx.ftz`` flushes a subnormal ``r``
to 0; ``renorm_reverse_order``: only where the 1-ulp change of ``S`` flips a bf16 rounding of ``tw``) are
killed in ``mutation.py`` on crafted inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from flint_moe.conformance.inputs.block import BLOCK_PATHS
from flint_moe.conformance.judge.metrics import _bits_equal
from flint_moe.conformance.judge.results import ACCUMULATION_STAGES, FAIL
from flint_moe.reference.combine import fma_f32
from flint_moe.reference.decode_block import eps_fp32, residual_add, rmsnorm_apply
from flint_moe.reference.experts import SWIGLU_C
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.layouts import shuffle_dst_of_src
from flint_moe.reference.routing import RENORM_EPS, routing_scores, topk_total_order, total_order_key
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

__all__ = ["Fault", "FAULTS", "FAULTS_BY_NAME", "NotApplicable", "diagnose", "faulty_stage", "faulty_weights"]


class NotApplicable(ValueError):
    """A fault that cannot occur for this case (e.g. a 128-row interleave when Ip % 128 != 0)."""


@dataclass(frozen=True)
class Fault:
    """One catalogued fault.

    Fields: ``name``; ``stage`` (the first ``results.STAGES`` entry it shows up in); ``what`` (completes
    "matches the reference with ..."); ``fn`` (kind "stage": ``fn(case, inputs, taps) -> tensor``, the
    stage's golden value under the fault from the kernel's taps; kind "weights": ``fn(case, inputs) ->
    NVFP4Experts | BF16Experts`` decoded from ``inputs.stored`` the faulty way, raising
    :class:`NotApplicable` when the fault cannot occur); ``paths`` (empty = all); ``kind``.
    """

    name: str
    stage: str
    what: str
    fn: Callable
    paths: tuple[str, ...] = ()
    kind: str = "stage"

    def applies(self, path: str) -> bool:
        return not self.paths or path in self.paths


def _logical(inputs):
    return getattr(inputs, "weights_logical", None) or inputs.logical


# ---------------------------------------------------------------------------------------------------------
# stage faults (teacher-forced from the taps)
# ---------------------------------------------------------------------------------------------------------


def _nv(case) -> bool:
    """The case's routed experts are NVFP4 (the nvfp4_* paths and the decode block's)."""
    return case.path.startswith("nvfp4_") or case.path in BLOCK_PATHS


def _shared_out(case, inputs, t) -> torch.Tensor:
    """The shared output the combine adds: the kernel's ``shared_y`` in the decode block, else the input."""
    return t["shared_y"] if case.path in BLOCK_PATHS else inputs.shared


def _gu(case, inputs, t):
    """(g, u) fp32 [M, k, W]: the kernel's gate/up accumulators, global scale applied on NVFP4."""
    g, u = t["gate_acc"].float(), t["up_acc"].float()
    if _nv(case):
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


def _y_scale_missing(case, inputs, t):
    return to_bf16(t["down_acc"].float())


def _ids_ties_highest(case, inputs, t):
    logits = t["logits"]
    E = logits.shape[1]
    key = total_order_key(logits).long() * E + torch.arange(E, device=logits.device)
    return torch.topk(key, int(case.k), dim=1).indices.to(torch.int32)


def _ids_ascending(case, inputs, t):
    return torch.sort(topk_total_order(t["logits"].contiguous(), int(case.k)), dim=1).values


def _scores(t):
    return routing_scores(torch.gather(t["logits"], 1, t["ids"].long()))


def _weights_no_eps(case, inputs, t):
    s = _scores(t)
    total = s[:, 0].clone()
    for j in range(1, s.shape[1]):
        total = total + s[:, j]
    return round_bf16(s / total[:, None])


def _weights_reverse(case, inputs, t):
    s = _scores(t)
    k = s.shape[1]
    total = s[:, k - 1].clone()
    for j in range(k - 2, -1, -1):
        total = total + s[:, j]
    return round_bf16(s / (total + RENORM_EPS)[:, None])


def _weights_unrounded(case, inputs, t):
    s = _scores(t)
    total = s[:, 0].clone()
    for j in range(1, s.shape[1]):
        total = total + s[:, j]
    return s / (total + RENORM_EPS)[:, None]


def _out_bf16_acc(case, inputs, t):
    tw, y = t["weights"].float(), t["y"].float()
    acc = torch.zeros_like(y[:, 0])
    for j in range(tw.shape[1]):
        acc = round_bf16(fma_f32(tw[:, j : j + 1].expand_as(acc).contiguous(), y[:, j].contiguous(), acc))
    return to_bf16(acc.float() + _shared_out(case, inputs, t).to(acc.device).float())


def _routed_acc(t) -> torch.Tensor:
    tw, y = t["weights"].float(), t["y"].float()
    acc = torch.zeros_like(y[:, 0])
    for j in range(tw.shape[1]):
        acc = fma_f32(tw[:, j : j + 1].expand_as(acc).contiguous(), y[:, j].contiguous(), acc)
    return acc


def _out_unrounded(case, inputs, t):
    return to_bf16(_routed_acc(t) + _shared_out(case, inputs, t).to(t["y"].device).float())


# the decode block's step 11 and shared expert (judge/block.py): xn from the kernel's own sumsq


def _block_s(inputs) -> torch.Tensor:
    return residual_add(inputs.x, inputs.shared)


def _xn_residual_rounded(case, inputs, t):
    s = to_bf16(_block_s(inputs)).float()
    return rmsnorm_apply(s, t["sumsq"].contiguous(), inputs.ln_weight.to(s.device), inputs.eps)


def _xn_inv(inputs, t, inv_of):
    from flint_moe.reference.mufu import rsqrt_approx_ftz

    s = _block_s(inputs)
    mean = t["sumsq"].float() / torch.tensor(float(s.shape[1]), dtype=torch.float32, device=s.device)
    eps = torch.tensor(eps_fp32(inputs.eps), dtype=torch.float32, device=s.device)
    inv = inv_of(mean, eps, rsqrt_approx_ftz)
    return to_bf16((s * inv[:, None]) * inputs.ln_weight.to(s.device).float())


def _xn_eps_after(case, inputs, t):
    return _xn_inv(inputs, t, lambda mean, eps, rsq: rsq(mean) + eps)


def _xn_rsqrt_exact(case, inputs, t):
    # sqrt.rn.f32 as RN32 of the float64 square root (torch's fp32 sqrt is not correctly rounded on every CPU),
    # then an explicit IEEE division (torch's ``1.0 / t`` is a reciprocal, not always correctly rounded)
    def inv(mean, eps, rsq):
        return torch.full_like(mean, 1.0) / torch.sqrt((mean + eps).double()).float()

    return _xn_inv(inputs, t, inv)


def _shared_y_scale_after(case, inputs, t):
    gs = inputs.shared_w2.global_scale.to(t["shared_down_acc"].device).float()
    return to_bf16(to_bf16(t["shared_down_acc"].float()).float() * gs)


def _out_shared_skipped(case, inputs, t):
    return to_bf16(_routed_acc(t))


# ---------------------------------------------------------------------------------------------------------
# weights faults: faulty decoders of the stored layouts (written from shared/notes/layouts.md, as
# flint_moe.reference.layouts, with one deliberate mistake each)
# ---------------------------------------------------------------------------------------------------------


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def _swz_correct(r, c, kp):
    return (r // 128) * (kp // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def _swz_missing(r, c, kp):
    return r * kp + c


def _swz_transposed(r, c, kp):
    return (r // 128) * (kp // 4) * 512 + (c // 4) * 512 + (r % 128) * 4 + c % 4


def _unswizzle(stored: torch.Tensor, rows: int, cols: int, offsets) -> torch.Tensor:
    e = stored.shape[0]
    flat = stored.reshape(e, -1)
    kp = _ceil(cols, 4)
    r = torch.arange(rows, device=stored.device)[:, None]
    c = torch.arange(cols, device=stored.device)[None, :]
    off = offsets(r, c, kp).reshape(-1)
    if int(off.max()) >= flat.shape[1]:
        raise NotApplicable("scale offsets outside the stored block")
    return flat[:, off].reshape(e, rows, cols)


def _cutedsl_rows(inter: int, padded: int, group: int, swapped: bool, device) -> torch.Tensor:
    if padded % group:
        raise NotApplicable(f"stored intermediate {padded} is not a multiple of the {group}-row group")
    j = torch.arange(2 * inter, device=device)
    up, j = j >= inter, j % inter
    first = torch.where(up, group, 0) if swapped else torch.where(up, 0, group)  # up block first in the layout
    return (j // group) * 2 * group + first + j % group


def _nibble_swap(codes: torch.Tensor) -> torch.Tensor:
    return ((codes & 0x0F) << 4) | (codes >> 4)


def _decode_nvfp4(inputs, *, group=64, swapped=False, swz=_swz_correct, nibbles=False) -> NVFP4Experts:
    st = getattr(inputs, "stored", None)
    if st is None or not hasattr(st, "w1_sf_swizzled"):
        raise NotApplicable("no FlintMoEWeights in inputs.stored")
    w1 = st.w1
    e, two_ip, h2 = w1.shape
    ip, hidden = two_ip // 2, 2 * h2
    inter = int(getattr(st, "valid_intermediate", ip))
    phys = _cutedsl_rows(inter, ip, group, swapped, w1.device)
    s1 = _unswizzle(st.w1_sf_swizzled.view(torch.uint8), two_ip, hidden // 16, swz)
    s2 = _unswizzle(st.w2_sf_swizzled.view(torch.uint8), hidden, ip // 16, swz)
    w13, w2 = w1[:, phys].contiguous(), st.w2[:, :, : inter // 2].contiguous()
    if nibbles:
        w13, w2 = _nibble_swap(w13), _nibble_swap(w2)
    fp8 = torch.float8_e4m3fn
    return NVFP4Experts(
        w13, s1[:, phys].contiguous().view(fp8), st.w1_alpha.clone(),
        w2, s2[:, :, : inter // 16].contiguous().view(fp8), st.w2_alpha.clone(),
    )  # fmt: skip


def _decode_bf16(inputs, *, swapped=False, shuffle=True) -> BF16Experts:
    st = getattr(inputs, "stored", None)
    if not (isinstance(st, (tuple, list)) and len(st) == 3):
        raise NotApplicable("no (g1, g2, row_maps) in inputs.stored")
    g1, g2, _ = st
    w13p = g1.permute(0, 2, 1, 3).reshape(g1.shape[0], g1.shape[2], -1)
    w2p = g2.permute(0, 2, 1, 3).reshape(g2.shape[0], g2.shape[2], -1)
    ip, hidden = w13p.shape[1] // 2, w13p.shape[2]
    inter = _logical(inputs).w13.shape[1] // 2
    j = torch.arange(2 * inter, device=g1.device)
    up, j = j >= inter, j % inter
    reordered = torch.where(up, 2 * j + 1, 2 * j) if swapped else torch.where(up, 2 * j, 2 * j + 1)
    if shuffle:
        p13 = shuffle_dst_of_src(2 * ip, 128, g1.device)[reordered]
        p2 = shuffle_dst_of_src(hidden, 128, g1.device)
    else:
        p13, p2 = reordered, torch.arange(hidden, device=g1.device)
    return BF16Experts(w13=w13p[:, p13].contiguous(), w2=w2p[:, p2, :inter].contiguous())


def _w_halves(case, inputs):
    if _nv(case):
        return _decode_nvfp4(inputs, swapped=True)
    return _decode_bf16(inputs, swapped=True)


#: Paths reading NVFP4 experts in the CuTe-DSL W4A16 layout (FlintMoEWeights).
_NV = ("nvfp4_decode", "nvfp4_grouped", "nvfp4_module", "nvfp4_dispatch", *BLOCK_PATHS)

FAULTS: tuple[Fault, ...] = (
    Fault("w13_halves_swapped", "gate_acc", "gate/up swapped (w13 halves read the wrong way round)", _w_halves,
          kind="weights"),
    Fault("interleave_group_32", "gate_acc", "the gate/up interleave read in 32-row groups instead of 64",
          lambda c, i: _decode_nvfp4(i, group=32), _NV, "weights"),
    Fault("interleave_group_128", "gate_acc", "the gate/up interleave read in 128-row groups instead of 64",
          lambda c, i: _decode_nvfp4(i, group=128), _NV, "weights"),
    Fault("scale_swizzle_missing", "gate_acc", "the block scales read row-major (128x4 swizzle missing)",
          lambda c, i: _decode_nvfp4(i, swz=_swz_missing), _NV, "weights"),
    Fault("scale_swizzle_transposed", "gate_acc", "the 128x4 scale swizzle transposed (tile read row-major)",
          lambda c, i: _decode_nvfp4(i, swz=_swz_transposed), _NV, "weights"),
    Fault("nibble_order_swapped", "gate_acc", "the E2M1 nibble order swapped (high nibble = even element)",
          lambda c, i: _decode_nvfp4(i, nibbles=True), _NV, "weights"),
    Fault("row_shuffle_missing", "gate_acc", "the TRT-LLM row shuffle missing (BF16 layout, w13 and w2)",
          lambda c, i: _decode_bf16(i, shuffle=False), ("bf16_decode", "bf16_module"), "weights"),
    Fault("gate_up_swapped", "act", "gate/up swapped (SwiGLU(up, gate))", _act_swapped),
    Fault("act_rounded_twice", "act", "act rounded twice (bf16 of g*r before multiplying by u)", _act_twice),
    Fault("exact_sigmoid", "act", "an exact sigmoid instead of the rcp.approx(ex2.approx) form",
          _act_exact_sigmoid),
    Fault("global_scale_after_round", "y", "the global scale applied after the bf16 rounding of y",
          _y_scale_after, _NV),
    Fault("global_scale_missing", "y", "the w2 global scale never applied", _y_scale_missing,
          _NV),
    Fault("topk_ties_highest", "ids", "top-k ties resolved to the highest expert index", _ids_ties_highest),
    Fault("topk_ascending_index", "ids", "the top-k experts listed by ascending index, not by logit",
          _ids_ascending),
    Fault("renorm_no_eps", "weights", "renormalisation without the epsilon", _weights_no_eps),
    Fault("renorm_reverse_order", "weights", "renormalisation summed in reverse slot order", _weights_reverse),
    Fault("routing_weights_unrounded", "weights", "routing weights not rounded to bf16", _weights_unrounded),
    Fault("combine_bf16_accumulate", "out", "the combine accumulator rounded to bf16 after every fma",
          _out_bf16_acc),
    Fault("shared_added_unrounded", "out", "the shared output added before rounding the routed sum to bf16",
          _out_unrounded),
    Fault("residual_rounded_before_norm", "xn", "the residual sum rounded to bf16 before the RMSNorm",
          _xn_residual_rounded, BLOCK_PATHS),
    Fault("eps_after_rsqrt", "xn", "eps added after the rsqrt (rsqrt(mean) + eps)", _xn_eps_after, BLOCK_PATHS),
    Fault("rsqrt_exact", "xn", "1 / sqrt (sqrt.rn then div.rn) instead of rsqrt.approx.ftz", _xn_rsqrt_exact,
          BLOCK_PATHS),
    Fault("shared_global_scale_after_round", "shared_y",
          "the shared expert's global scale applied after the bf16 rounding of its y", _shared_y_scale_after,
          BLOCK_PATHS),
    Fault("shared_expert_skipped", "out", "the shared expert's output never added", _out_shared_skipped,
          BLOCK_PATHS),
)  # fmt: skip


def _pertoken_faults() -> tuple[Fault, ...]:
    from flint_moe.conformance.judge.pertoken import pertoken_faults

    return tuple(pertoken_faults(Fault))


FAULTS += _pertoken_faults()  # the per-token paths' faults (judge/pertoken.py; named by diagnose_pertoken)
FAULTS_BY_NAME: dict[str, Fault] = {f.name: f for f in FAULTS}


def faulty_stage(fault: Fault, case, inputs, taps: dict) -> torch.Tensor:
    """The golden value of ``fault.stage`` under a stage ``fault``, teacher-forced from ``taps``."""
    dev = inputs.x.device
    t = {k: v.detach().to(dev) for k, v in taps.items() if isinstance(v, torch.Tensor)}
    return fault.fn(case, inputs, t)


def faulty_weights(fault: Fault, case, inputs):
    """The logical weights a kernel with the layout ``fault`` reads from ``inputs.stored`` (NotApplicable if
    the fault cannot occur for this case)."""
    return fault.fn(case, inputs)


def _with_logical(inputs, logical):
    ns = SimpleNamespace(**vars(inputs)) if hasattr(inputs, "__dict__") else SimpleNamespace()
    for name in ("x", "router_weight", "shared", "stored", "notes"):
        if hasattr(inputs, name):
            setattr(ns, name, getattr(inputs, name))
    ns.logical = ns.weights_logical = logical
    return ns


def _reproduces_stage(f: Fault, case, inputs, taps, out) -> bool:
    kernel = out if f.stage == "out" else taps.get(f.stage)
    if not isinstance(kernel, torch.Tensor):
        return False
    try:
        gold = faulty_stage(f, case, inputs, taps)
    except torch.OutOfMemoryError:  # a diagnosis cut short by the device must not read as "no match"
        raise
    except Exception:  # noqa: BLE001  (taps unusable for this fault)
        return False
    kernel = kernel.detach().to(gold.device)
    if kernel.shape != gold.shape or kernel.dtype != gold.dtype:
        # act / y taps may carry padded columns: compare the logical width
        if kernel.dim() == gold.dim() and kernel.shape[:-1] == gold.shape[:-1] and kernel.dtype == gold.dtype:
            w = min(kernel.shape[-1], gold.shape[-1])
            kernel, gold = kernel[..., :w], gold[..., :w]
        else:
            return False
    return bool(_bits_equal(kernel, gold).all())


def _reproduces_weights(f: Fault, case, inputs, taps, out) -> bool:
    from flint_moe.conformance.judge.block import compare_block_case
    from flint_moe.conformance.judge.stages import compare_case

    compare = compare_block_case if case.path in BLOCK_PATHS else compare_case
    try:
        logical = faulty_weights(f, case, inputs)
        res = compare(case, _with_logical(inputs, logical), taps, out)
    except torch.OutOfMemoryError:  # a diagnosis cut short by the device must not read as "no match"
        raise
    except Exception:  # noqa: BLE001  (not applicable, or the faulty decode is not a valid checkpoint)
        return False
    return res.verdict != FAIL


def diagnose(case, inputs, taps: dict, out, result) -> list[str]:
    """Names of the catalogued faults that reproduce the kernel, as ``"<name>: matches the reference with
    <what>"``: stage faults whose stage FAILed and whose golden variant equals the kernel's tap bit for bit;
    layout (weights) faults, tried when an accumulation stage FAILed, under which the whole comparison has
    no FAIL. Faults that cannot run on these taps / inputs are skipped silently."""
    if case.path.startswith("nvfp4_pertoken_"):
        from flint_moe.conformance.judge.pertoken import diagnose_pertoken

        return diagnose_pertoken(case, inputs, taps, out, result, FAULTS)
    failed = set(result.failed_stages)
    acc_failed = bool(failed & set(ACCUMULATION_STAGES))
    found = []
    for f in FAULTS:
        if not f.applies(case.path):
            continue
        if f.kind == "weights":
            ok = acc_failed and _reproduces_weights(f, case, inputs, taps, out)
        else:
            ok = f.stage in failed and _reproduces_stage(f, case, inputs, taps, out)
        if ok:
            found.append(f"{f.name}: matches the reference with {f.what}")
    return found
