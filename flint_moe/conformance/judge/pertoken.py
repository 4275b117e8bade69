"""Judging the per-token NVFP4 paths (``nvfp4_pertoken_*``): stage by stage with teacher forcing, the faults
catalogued for them, and the tap injections of their mutation tests.

``compare_pertoken(case, inputs, taps, out, orders="auto") -> CaseResult`` (``stages.compare_case`` hands the
per-token paths here). Each step P1-P12 of docs/numerics.md "Per-token NVFP4 experts" is recomputed by the
golden model's functions from the kernel's OWN inputs to that step (its taps):

=============  ==========================================================================  ==============
stage          golden value                                                                criterion
=============  ==========================================================================  ==============
x_codes,       P1-P5 of ``x`` (``reference.pertoken.quantize_nvfp4_pertoken``), rows below  bits
x_scale,       ``token_capacity``
x_token_scale
x_padding      the padded columns of the quantized input: code-0 bytes, 0x00 scale bytes   bits
local          the slot's expert is this rank's                                            bits
fc1_acc        exact ``dequant(x_codes, x_scale) . W1^T`` of the slot's expert             bound / replay
h              ``RN(RN(fc1_acc * alpha1_e) * x_token_scale)`` (P8)                         bits
act            squared ReLU / SwiGLU of ``h`` (P9)                                         bits
a_codes,       P1-P5 of each local (token, slot) row of ``act`` (P10)                      bits
a_scale,
a_token_scale
a_padding      the padded columns of the FC2 input                                         bits
fc2_acc        exact ``dequant(a_codes, a_scale) . W2^T``                                  bound / replay
y              ``RN(fc2_acc * alpha2_e)`` (P11)                                            bits
w              ``RN(p * a_token_scale)`` where local, else 0 (P12)                         bits
out            slot-order ``fma`` combine of ``w``, ``y``, then bf16; rows past the         bits
               capacity: the buffer's contents before the call
=============  ==========================================================================  ==============

Accumulations: within the certified ``FP32_TRUNCATE`` bound (tensor cores, any order) everywhere; on the GPU
(``replay.case_orders``) also bitwise equal to the replay of the declared orders (``kernels.orders.
pertoken_orders``) on the token rows of ``replay.replay_rows``. Slots that add nothing must hold zeros in
every [M, k, ...] tap (the op's tap convention).
"""

from __future__ import annotations

import torch

from flint_moe.conformance.judge.results import FAIL, CaseResult, worst_verdict
from flint_moe.reference.exact import FP32_TRUNCATE, Accumulation
from flint_moe.reference.experts import down_accumulate, gate_up_accumulate
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.pertoken import dequantize_nvfp4_rows, quantize_nvfp4_pertoken
from flint_moe.reference.pertoken_experts import relu2_fp32, swiglu_fp32

__all__ = ["PERTOKEN_STAGES", "PERTOKEN_ACCUMULATIONS", "compare_pertoken", "pertoken_faults", "resimulate"]

PERTOKEN_STAGES = ("x_codes", "x_scale", "x_token_scale", "x_padding", "local", "fc1_acc", "h", "act", "a_codes",
                   "a_scale", "a_token_scale", "a_padding", "fc2_acc", "y", "w", "out")  # fmt: skip
PERTOKEN_ACCUMULATIONS = ("fc1_acc", "fc2_acc")


def _ctx(case, inputs):
    n = inputs.notes
    m = int(inputs.x.shape[0])
    cap = m if n.get("token_capacity") is None else int(n["token_capacity"])
    return n, cap


def _local(inputs, cap: int) -> torch.Tensor:
    n = inputs.notes
    ids = n["routing_map"][:cap].long()
    e = inputs.logical.num_experts
    off = int(n["local_expert_offset"])
    return (ids >= off) & (ids < off + e)


def _experts(inputs, cap: int):
    """(e, rows, slots) for every local expert with pairs, the golden model's enumeration."""
    n = inputs.notes
    ids = n["routing_map"][:cap].long()
    off = int(n["local_expert_offset"])
    for e in range(inputs.logical.num_experts):
        rows, slots = torch.nonzero(ids == off + e, as_tuple=True)
        if rows.numel():
            yield e, rows, slots


def _accumulate(inputs, cap, stage: str, codes, scale, n_out: int, order=None, replay_rows=None) -> Accumulation:
    """fc1_acc / fc2_acc [cap, k, n_out] of the kernel's own quantized operand (teacher forcing), assembled
    from the per-expert Accumulations; ``order`` replayed on the pairs of ``replay_rows`` (all when None)."""
    w = inputs.logical
    k = inputs.notes["routing_map"].shape[1]
    dev = inputs.x.device
    f64 = dict(dtype=torch.float64, device=dev)
    exact, bound, abs_sum = (torch.zeros(cap, k, n_out, **f64) for _ in range(3))
    eta = torch.zeros(cap, k, n_out, dtype=torch.bool, device=dev)
    replay = torch.zeros(cap, k, n_out, dtype=torch.float32, device=dev) if order is not None else None
    length = 0
    for e, rows, slots in _experts(inputs, cap):
        xq = dequantize_nvfp4_rows(codes[rows, slots] if codes.dim() == 3 else codes[rows],
                                   (scale[rows, slots] if scale.dim() == 3 else scale[rows]))  # fmt: skip
        wc, ws = (w.fc1[e], w.fc1_scale[e]) if stage == "fc1" else (w.fc2[e], w.fc2_scale[e])
        fn = gate_up_accumulate if stage == "fc1" else down_accumulate
        acc = fn(xq, wc, ws, model=FP32_TRUNCATE)
        exact[rows, slots], bound[rows, slots], abs_sum[rows, slots] = acc.exact, acc.bound, acc.abs_sum
        eta[rows, slots] = acc.eta_possible
        length = acc.n
        if order is not None:
            sel = torch.ones_like(rows, dtype=torch.bool) if replay_rows is None else torch.isin(rows, replay_rows)
            if bool(sel.any()):
                r = fn(xq[sel], wc, ws, model=FP32_TRUNCATE, order=order).replay
                replay[rows[sel], slots[sel]] = r
    out = Accumulation(exact, bound, abs_sum, eta, max(length, 1), FP32_TRUNCATE)
    if replay is not None:
        out = Accumulation(exact, bound, abs_sum, eta, max(length, 1), FP32_TRUNCATE, replay=replay)
    return out


def golden_stage(stage: str, case, inputs, t: dict) -> torch.Tensor:
    """The golden value of one bits stage from the kernel's taps ``t`` (module table)."""
    n, cap = _ctx(case, inputs)
    w = inputs.logical
    local = _local(inputs, cap)
    h_dim, inter = w.hidden_size, w.intermediate_size
    if stage in ("x_codes", "x_scale", "x_token_scale"):
        c, s, d, _ = quantize_nvfp4_pertoken(inputs.x[:cap], name="x")
        return {"x_codes": c, "x_scale": s, "x_token_scale": d}[stage]
    if stage in ("x_padding", "a_padding"):
        src = (t["x_codes_padded"], t["x_scale_padded"]) if stage == "x_padding" else (
            t["a_codes_padded"][local], t["a_scale_padded"][local])
        width = h_dim if stage == "x_padding" else inter
        return torch.zeros_like(torch.cat([src[0][..., width // 2 :], src[1][..., width // 16 :]], dim=-1))
    if stage == "local":
        return local
    mask = local[..., None]
    if stage == "h":
        alpha = _alpha(w.fc1_alpha, inputs, cap)
        h = (t["fc1_acc"] * alpha[..., None]) * t["x_token_scale"][:, None, None]
        return torch.where(mask, h, torch.zeros_like(h))
    if stage == "act":
        h = t["h"]
        a = swiglu_fp32(h[..., :inter].contiguous(), h[..., inter:].contiguous()) if w.gated else relu2_fp32(h)
        return torch.where(mask, a, torch.zeros_like(a))
    if stage in ("a_codes", "a_scale", "a_token_scale"):
        act = t["act"]
        k = act.shape[1]
        c = torch.zeros(cap, k, inter // 2, dtype=torch.uint8, device=act.device)
        s = torch.zeros(cap, k, inter // 16, dtype=torch.uint8, device=act.device)
        d = torch.zeros(cap, k, dtype=torch.float32, device=act.device)
        if bool(local.any()):
            ce, se, de, _ = quantize_nvfp4_pertoken(act[local], name="act")
            c[local], s[local], d[local] = ce, se.view(torch.uint8), de
        return {"a_codes": c, "a_scale": s.view(torch.float8_e4m3fn), "a_token_scale": d}[stage]
    if stage == "y":
        y = t["fc2_acc"] * _alpha(w.fc2_alpha, inputs, cap)[..., None]
        return torch.where(mask, y, torch.zeros_like(y))
    if stage == "w":
        wj = n["probabilities"][:cap].float() * t["a_token_scale"]
        return torch.where(local, wj, torch.zeros_like(wj))
    if stage == "out":
        return _combine(inputs, cap, local, t["w"], t["y"])
    raise KeyError(f"golden_stage: unknown stage {stage!r}")


def _alpha(alpha: torch.Tensor, inputs, cap: int) -> torch.Tensor:
    """fp32 [cap, k]: the slot's expert's alpha (slots that are not local: 1, masked later)."""
    n = inputs.notes
    loc = n["routing_map"][:cap].long() - int(n["local_expert_offset"])
    ok = (loc >= 0) & (loc < alpha.shape[0])
    return torch.where(ok, alpha.to(loc.device)[loc.clamp(0, alpha.shape[0] - 1)], torch.ones_like(loc.float()))


def _combine(inputs, cap: int, local: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    from flint_moe.reference.combine import fma_f32

    n = inputs.notes
    m, h = inputs.x.shape
    acc = torch.zeros(cap, h, dtype=torch.float32, device=inputs.x.device)
    for j in range(w.shape[1]):
        step = fma_f32(w[:, j : j + 1].contiguous(), y[:, j].contiguous(), acc)
        acc = torch.where(local[:, j : j + 1], step, acc)
    init = n.get("out_init")
    out = torch.zeros(m, h, dtype=torch.bfloat16, device=acc.device) if init is None else init.clone()
    out[:cap] = to_bf16(acc)
    return out


def _kernel_padding(stage: str, t: dict, local: torch.Tensor, inputs) -> torch.Tensor:
    w = inputs.logical
    if stage == "x_padding":
        c, s, width = t["x_codes_padded"], t["x_scale_padded"], w.hidden_size
    else:
        c, s, width = t["a_codes_padded"][local], t["a_scale_padded"][local], w.intermediate_size
    return torch.cat([c[..., width // 2 :], s[..., width // 16 :]], dim=-1)


def compare_pertoken(case, inputs, taps: dict, out: torch.Tensor, *, orders="auto") -> CaseResult:
    """Every stage of the module table; the case verdict is the worst stage verdict."""
    from flint_moe.conformance.judge import replay as _replay
    from flint_moe.conformance.judge.stages import compare_accumulation, compare_bits

    if not isinstance(taps, dict):
        raise TypeError(f"taps: expected a dict, got {type(taps).__name__}")
    dev = inputs.x.device
    n, cap = _ctx(case, inputs)
    if isinstance(orders, str) and orders == "auto":
        orders = _replay.case_orders(case, dev)
    rows = None
    if orders is not None and cap > _replay.replay_row_count():
        rows = _replay.replay_rows(cap).to(dev)
    t = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in taps.items()}
    t["out"] = out
    local = _local(inputs, cap)
    w = inputs.logical
    res = []
    for stage in PERTOKEN_STAGES:
        try:
            if stage in PERTOKEN_ACCUMULATIONS:
                s = stage[:3]
                codes, scale = (t["x_codes"], t["x_scale"]) if s == "fc1" else (t["a_codes"], t["a_scale"])
                width = w.fc1.shape[1] if s == "fc1" else w.hidden_size
                order = None if orders is None else orders[s]
                acc = _accumulate(inputs, cap, s, codes, scale, width, order, rows)
                note = "" if rows is None else f"replay on {len(rows)} sampled rows of {cap}"
                if rows is not None:  # rows not replayed: the replay is the kernel's value there
                    sel = torch.isin(torch.arange(cap, device=dev), rows)[:, None, None]
                    acc = Accumulation(acc.exact, acc.bound, acc.abs_sum, acc.eta_possible, acc.n, acc.model,
                                       replay=torch.where(sel, acc.replay, t[stage]))  # fmt: skip
                res.append(compare_accumulation(stage, t.get(stage), acc, note=note, order=order))
            else:
                gold = golden_stage(stage, case, inputs, t)
                kern = _kernel_padding(stage, t, local, inputs) if stage.endswith("_padding") else t.get(stage)
                res.append(compare_bits(stage, kern, gold))
        except torch.OutOfMemoryError:  # the device, not the tap: the runner retries or reports it not judged
            raise
        except Exception as exc:  # noqa: BLE001  (a missing or malformed tap fails its stage)
            from flint_moe.conformance.judge.results import StageResult

            res.append(StageResult(stage, "bits", FAIL, note=f"could not compare: {type(exc).__name__}: {exc}"))
    meta = {k: getattr(case, k) for k in ("shape", "M", "k", "E", "H", "I", "profile", "seed") if hasattr(case, k)}
    meta.update(token_capacity=n.get("token_capacity"), activation=n.get("activation"),
                order_replay=orders is not None)  # fmt: skip
    from flint_moe.conformance.judge.metrics import tensor_digest

    digests = {"out": tensor_digest(out)}
    digests.update({f"taps.{k}": tensor_digest(v) for k, v in sorted(taps.items()) if isinstance(v, torch.Tensor)})
    return CaseResult(case_id=str(case.id), path=str(case.path), verdict=worst_verdict([r.verdict for r in res]),
                      stages=res, meta=meta, digests=digests)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# resimulation (tap injections) and the faults of the per-token paths
# ---------------------------------------------------------------------------------------------------------


def resimulate(case, inputs, taps: dict, after: str) -> None:
    """Recompute every stage after ``after`` from the (tampered) taps with the golden model, in place, as a
    kernel with a fault at ``after`` would go on (accumulators: RN32 of the exact sums)."""
    _, cap = _ctx(case, inputs)
    w = inputs.logical
    order = list(PERTOKEN_STAGES)
    for stage in order[order.index(after) + 1 :]:
        if stage.endswith("_padding"):
            continue
        if stage in PERTOKEN_ACCUMULATIONS:
            s = stage[:3]
            codes, scale = (taps["x_codes"], taps["x_scale"]) if s == "fc1" else (taps["a_codes"], taps["a_scale"])
            acc = _accumulate(inputs, cap, s, codes, scale, w.fc1.shape[1] if s == "fc1" else w.hidden_size)
            taps[stage] = torch.where(_local(inputs, cap)[..., None], acc.exact.to(torch.float32),
                                      torch.zeros_like(taps[stage]))  # fmt: skip
        elif stage == "out":
            taps["out"] = _combine(inputs, cap, taps["local"], taps["w"], taps["y"])
        elif stage != "local":
            taps[stage] = golden_stage(stage, case, inputs, taps)
            if stage in ("a_codes", "a_scale"):
                pad = taps[f"{stage}_padded"].clone()
                pad[..., : taps[stage].shape[-1]] = taps[stage].view(torch.uint8)
                taps[f"{stage}_padded"] = pad


def _per_tensor_scale(case, inputs, t):
    """x_token_scale under ``pertoken_scale_per_tensor``: P1-P2 of the whole [M', H] input, every row."""
    from flint_moe.reference.pertoken import pertoken_global_scale

    _, cap = _ctx(case, inputs)
    g = pertoken_global_scale(inputs.x[:cap].float().abs().amax().reshape(1))
    return (torch.ones_like(g) / g).expand(cap).contiguous()


def _requant_skipped(case, inputs, t):
    """a_token_scale under ``requant_skipped``: 1 for every local slot (the bf16 activation fed as is)."""
    _, cap = _ctx(case, inputs)
    local = _local(inputs, cap)
    return torch.where(local, 1.0, 0.0).to(torch.float32)


def _scale_after_act(case, inputs, t):
    """h under ``scale_after_activation``: ``RN(fc1_acc * alpha1_e)``, the token scale left for later."""
    _, cap = _ctx(case, inputs)
    h = t["fc1_acc"] * _alpha(inputs.logical.fc1_alpha, inputs, cap)[..., None]
    return torch.where(_local(inputs, cap)[..., None], h, torch.zeros_like(h))


def _minus_one_unmasked(case, inputs, t):
    """local under ``minus_one_not_masked``: a -1 slot counted as the last local expert's (index -1)."""
    _, cap = _ctx(case, inputs)
    return _local(inputs, cap) | (inputs.notes["routing_map"][:cap] == -1)


def _padding_dirty(stage):
    def fn(case, inputs, t):
        """The padding as the kernel left it, where it is not all zero (else not this fault: ValueError)."""
        _, cap = _ctx(case, inputs)
        k = _kernel_padding(stage, t, _local(inputs, cap), inputs)
        if not bool(k.any()):
            raise ValueError("padding is zero: not this fault")
        return k

    return fn


def pertoken_faults(fault_cls) -> list:
    """The catalogued faults of the per-token paths (``faults.FAULTS`` appends them; :func:`diagnose_pertoken`
    tries them)."""
    paths = ("nvfp4_pertoken_swiglu", "nvfp4_pertoken_relu2")
    return [
        fault_cls("pertoken_scale_per_tensor", "x_token_scale",
                  "one input scale per tensor (P1 of the whole batch) instead of one per token", _per_tensor_scale,
                  paths),
        fault_cls("requant_skipped", "a_token_scale",
                  "the FC2 input not re-quantized (the activation fed as is, decode scale 1)", _requant_skipped, paths),
        fault_cls("scale_after_activation", "h",
                  "the token scale applied after the activation, not to the FC1 accumulator", _scale_after_act, paths),
        fault_cls("minus_one_not_masked", "local", "routing entries of -1 read as the last local expert",
                  _minus_one_unmasked, paths),
        fault_cls("padding_not_zeroed", "x_padding", "the padded columns of the quantized input not zeroed",
                  _padding_dirty("x_padding"), paths),
        fault_cls("fc2_input_padding_not_zeroed", "a_padding", "the padded columns of the FC2 input not zeroed",
                  _padding_dirty("a_padding"), paths),
    ]  # fmt: skip


def diagnose_pertoken(case, inputs, taps: dict, out, result, faults) -> list[str]:
    """Names of the per-token faults (of ``faults``) whose stage FAILed and whose faulty value equals the
    kernel's bit for bit, as ``"<name>: matches the reference with <what>"``."""
    from flint_moe.conformance.judge.metrics import _bits_equal

    failed = set(result.failed_stages)
    _, cap = _ctx(case, inputs)
    dev = inputs.x.device
    t = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in taps.items()}
    found = []
    for f in faults:
        if not f.applies(case.path) or f.stage not in failed:
            continue
        try:
            gold = f.fn(case, inputs, t)
            kern = _kernel_padding(f.stage, t, _local(inputs, cap), inputs) if f.stage.endswith("_padding") else (
                out if f.stage == "out" else t[f.stage])
            ok = kern.shape == gold.shape and kern.dtype == gold.dtype and bool(_bits_equal(kern, gold).all())
        except torch.OutOfMemoryError:  # a diagnosis cut short by the device must not read as "no match"
            raise
        except Exception:  # noqa: BLE001  (not applicable to these taps)
            ok = False
        if ok:
            found.append(f"{f.name}: matches the reference with {f.what}")
    return found


# ---------------------------------------------------------------------------------------------------------
# tap injections of the mutation tests (each returns "out": it resimulates what follows itself)
# ---------------------------------------------------------------------------------------------------------


def inject_scale_per_tensor(case, inputs, taps):
    from flint_moe.reference.pertoken import quantize_nvfp4_rows

    _, cap = _ctx(case, inputs)
    d = _per_tensor_scale(case, inputs, taps)
    c, s = quantize_nvfp4_rows(inputs.x[:cap], torch.ones_like(d) / d, name="x")
    taps.update(x_codes=c, x_scale=s, x_token_scale=d)
    resimulate(case, inputs, taps, "x_padding")
    return "out"


def inject_requant_skipped(case, inputs, taps):
    """The FC2 input is bf16(act) with decode scale 1: fc2_acc the RN32 exact sums of that operand."""
    _, cap = _ctx(case, inputs)
    local = _local(inputs, cap)
    taps["a_token_scale"] = _requant_skipped(case, inputs, taps)
    w = inputs.logical
    acc2 = torch.zeros_like(taps["fc2_acc"])
    for e, rows, slots in _experts(inputs, cap):
        a = to_bf16(taps["act"][rows, slots])
        acc2[rows, slots] = down_accumulate(a, w.fc2[e], w.fc2_scale[e]).exact.to(torch.float32)
    taps["fc2_acc"] = torch.where(local[..., None], acc2, torch.zeros_like(acc2))
    resimulate(case, inputs, taps, "fc2_acc")
    return "out"


def inject_scale_after_activation(case, inputs, taps):
    _, cap = _ctx(case, inputs)
    w = inputs.logical
    h = _scale_after_act(case, inputs, taps)
    inter = w.intermediate_size
    a = swiglu_fp32(h[..., :inter].contiguous(), h[..., inter:].contiguous()) if w.gated else relu2_fp32(h)
    taps["h"], taps["act"] = h, a * taps["x_token_scale"][:, None, None]
    resimulate(case, inputs, taps, "act")
    return "out"


def inject_minus_one_unmasked(case, inputs, taps):
    _, cap = _ctx(case, inputs)
    taps["local"] = _minus_one_unmasked(case, inputs, taps)
    taps["out"] = _combine(inputs, cap, taps["local"], taps["w"], taps["y"])
    return "out"


def inject_padding(stage: str):
    def inject(case, inputs, taps):
        names = ("x_codes_padded", "x_scale_padded") if stage == "x_padding" else ("a_codes_padded", "a_scale_padded")
        w = inputs.logical
        width = w.hidden_size if stage == "x_padding" else w.intermediate_size
        c, s = taps[names[0]].clone(), taps[names[1]].clone()
        c[..., width // 2 :] = 0x11
        s[..., width // 16 :] = 0x38
        taps[names[0]], taps[names[1]] = c, s
        return "out"

    return inject
