"""Sub-bound faults: mutations the any-order bound cannot see, killed only by the order replay.

A kernel accumulator that stays inside the certified any-order bound passes the bound check by construction,
however it got there. The faults below are of that kind, the way real regressions appear: each changes ONE
``down_acc`` element of a clean kernel run (token 0, slot 0, the hidden row with the widest bound) to the value a
faulty kernel would produce, and the later stages (``y``, ``out``) are re-simulated from it as that kernel would
go on to compute them. Every mutant is judged twice, by the stage comparison with the kernels' declared orders
replayed and with the bound alone, and both kill rates go into the report.

- ``drop_small_term``: the smallest non-zero product of the row left out (the declared order replayed without it).
- ``swap_two_terms``: two terms, one from each K half, exchange their places in the order (same multiset of
  products, same exact sum; the replay of the exchanged operands; on a block-scaled order, two terms of equal
  weight exchange their activations).
- ``one_ulp``: the accumulator one ulp up (a partial off by one ulp).
- ``narrow_partial``: the two K halves accumulated separately, the first rounded to bf16 before they are added
  (a split-K partial stored in a narrower type).
- ``reuse_partial``: the second K half's partial replaced by the replay of the first half on the second half's
  weights (a partial computed from stale activations, the first half's reused).

The operands of the faulty values come from the golden model (``reference.experts.down_accumulate*`` with the
declared ``order``), so the mutants are what a kernel following the declaration would give with the fault.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from flint_moe.conformance.judge.injections import _clone, _logical, _resimulate
from flint_moe.conformance.judge.results import FAIL
from flint_moe.reference.experts import down_accumulate, down_accumulate_bf16, down_output, down_output_bf16
from flint_moe.reference.formats import to_bf16

__all__ = ["SUB_BOUND_FAULTS", "SUB_BOUND_CASES", "SubBoundResult", "run_sub_bound", "sub_bound_report"]

SUB_BOUND_FAULTS = ("drop_small_term", "swap_two_terms", "one_ulp", "narrow_partial", "reuse_partial")

#: Cases mutated per device: real layer widths on the GPU (the bound grows with K, so sub-bound faults are
#: the rule there), a small BF16 case on the CPU, whose interpreter runs the BF16 kernels' declared order.
SUB_BOUND_CASES = {
    "cuda": ("nvfp4_decode/deepseek-v3/M1/gaussian/s0", "bf16_decode/qwen3-30b-a3b/M1/gaussian/s0"),
    "cpu": ("bf16_decode/cpu-E6-H192-I192-k3/M1/gaussian/s0",),
}


@dataclass
class SubBoundResult:
    """One sub-bound mutant: ``killed_by_replay`` (the case FAILs with the declared orders replayed),
    ``killed_by_bound`` (it FAILs with the bound alone), ``element`` [token, slot, h], ``note``."""

    fault: str
    case_id: str
    killed_by_replay: bool = False
    killed_by_bound: bool = False
    within_bound: bool | None = None
    element: list[int] | None = None
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _down(nv: bool, wl, e: int, rows: slice, act: torch.Tensor, order):
    """Golden down Accumulation of ``act`` [n, I] against hidden rows ``rows`` of expert e, in ``order``."""
    if nv:
        return down_accumulate(act, wl.w2[e][rows], wl.w2_scale[e][rows], order=order)
    return down_accumulate_bf16(act, wl.w2[e][rows], order=order)


def _faulty(fault: str, nv: bool, wl, e: int, h: int, a: torch.Tensor, clean: float, order) -> float | None:
    """The faulty ``down_acc`` value of row h for activations ``a`` [I] (bf16), or None if the data offers no
    such fault (e.g. no two equal weights)."""
    n = a.shape[0]
    row = slice(h, h + 1)

    def replay(act: torch.Tensor) -> torch.Tensor:
        return _down(nv, wl, e, row, act[None].contiguous(), order).replay[0, 0]

    if fault == "one_ulp":
        return float(torch.nextafter(torch.tensor(clean), torch.tensor(float("inf"))))
    eye = torch.eye(n, dtype=torch.float32, device=a.device).to(torch.bfloat16)
    w = _down(nv, wl, e, row, eye, None).exact[:, 0]  # the row's weights, exactly (one-hot activations)
    af = a.double()
    if fault == "drop_small_term":
        prod = (w * af).abs()
        prod = torch.where(prod > 0, prod, torch.inf)
        k = int(prod.argmin())
        if not torch.isfinite(prod[k]):
            return None
        b = a.clone()
        b[k] = 0
        return float(replay(b))
    if fault == "swap_two_terms":
        half = n // 2
        if not any(st["op"] == "scale_fma_chain" for st in order["program"]):
            # exchange two whole terms (weight and activation) between the halves: the same products
            from flint_moe.reference.orders import replay_dot

            prod = w * af
            first = torch.nonzero(prod[:half] != 0).flatten()[:16].tolist()
            last = (half + torch.nonzero(prod[half:] != 0).flatten()).tolist()[::-1][:16]
            for k1 in first:  # the first exchange that changes the replayed value
                for k2 in last:
                    if prod[k1] == prod[k2]:
                        continue
                    perm = torch.arange(n, device=a.device)
                    perm[k1], perm[k2] = k2, k1
                    v = float(replay_dot(order, w[perm].float(), a[perm].float()))
                    if v != clean:
                        return v
            return None
        for k1 in range(half):  # block-scaled order: terms of equal weight exchange their activations
            if w[k1] == 0:
                continue
            hits = torch.nonzero((w[half:] == w[k1]) & (a[half:] != a[k1])).flatten()
            if len(hits):
                k2 = half + int(hits[-1])
                b = a.clone()
                b[k1], b[k2] = a[k2], a[k1]
                return float(replay(b))
        return None
    lo, hi = a.clone(), a.clone()
    lo[n // 2 :] = 0
    hi[: n // 2] = 0
    p1, p2 = replay(lo), replay(hi)
    if fault == "narrow_partial":
        return float(to_bf16(p1[None]).float()[0] + p2)
    if fault == "reuse_partial":
        stale = torch.zeros_like(a)
        stale[n // 2 : n // 2 + n // 2] = a[: n // 2]
        return float(p1 + replay(stale))
    raise KeyError(fault)


def _mutants(case, inputs, taps: dict, orders: dict):
    """Yield (fault, mutated taps, element, note) for one case."""
    wl = _logical(inputs)
    nv = case.path.startswith("nvfp4_")
    I = wl.w13.shape[1] // 2  # noqa: E741
    e = int(taps["ids"][0, 0])
    a = taps["act"][0, 0, :I].contiguous()
    acc = _down(nv, wl, e, slice(None), a[None], orders.get("down"))
    h = int(acc.bound[0].argmax())
    clean = float(taps["down_acc"][0, 0, h])
    for fault in SUB_BOUND_FAULTS:
        v = _faulty(fault, nv, wl, e, h, a, clean, orders.get("down"))
        if v is None or torch.tensor(v, dtype=torch.float32).view(torch.int32) == torch.tensor(clean).view(torch.int32):
            yield fault, None, [0, 0, h], "fault invisible on this data"
            continue
        t = _clone(taps)
        t["down_acc"][0, 0, h] = v
        d = t["down_acc"][0, 0].contiguous()
        t["y"][0, 0] = down_output(d, wl.w2_gs[e : e + 1]) if nv else down_output_bf16(d)
        _resimulate(case, inputs, t, "y")
        yield fault, t, [0, 0, h], ""


def run_sub_bound(device=None, case_ids=None) -> list[SubBoundResult]:
    """Run every sub-bound fault on the cases of ``device`` (default CUDA when available, else the CPU) and
    judge each mutant with and without the order replay."""
    from flint_moe.conformance.inputs.cases import Case, make_inputs
    from flint_moe.conformance.judge.stages import compare_case
    from flint_moe.conformance.run.paths import PATHS, declared_orders
    from flint_moe.ops import make_route_counter

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_rows: list[SubBoundResult] = []
    counter = make_route_counter(dev)
    for cid in case_ids or SUB_BOUND_CASES[dev.type]:
        case = Case.from_id(cid)
        inputs = make_inputs(case, dev)
        taps: dict = {}
        PATHS[case.path].run(inputs, counter, taps)
        orders = declared_orders(case)
        for fault, t, element, note in _mutants(case, inputs, taps, orders):
            r = SubBoundResult(fault, cid, element=element, note=note)
            if t is not None:
                with_replay = compare_case(case, inputs, t, t["out"], orders=orders)
                bound_only = compare_case(case, inputs, t, t["out"], orders=None)
                r.killed_by_replay = with_replay.verdict == FAIL
                r.killed_by_bound = bound_only.verdict == FAIL
                st = next(s for s in bound_only.stages if s.stage == "down_acc")
                r.within_bound = st.mismatches == 0
            out_rows.append(r)
    return out_rows


def sub_bound_report(results: list[SubBoundResult]) -> dict:
    """The report.json ``mutation["sub_bound"]`` block: both kill rates over the visible mutants."""
    seen = [r for r in results if not r.note]
    n = len(seen)
    return {
        "faults": list(SUB_BOUND_FAULTS),
        "total": n,
        "within_bound": sum(bool(r.within_bound) for r in seen),
        "killed_by_replay": sum(r.killed_by_replay for r in seen),
        "killed_by_bound": sum(r.killed_by_bound for r in seen),
        "replay_kill_rate": sum(r.killed_by_replay for r in seen) / n if n else 0.0,
        "bound_kill_rate": sum(r.killed_by_bound for r in seen) / n if n else 0.0,
        "results": [r.to_json() for r in results],
    }
