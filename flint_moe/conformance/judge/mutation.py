"""Mutation testing of the harness itself.

Every catalogued fault (``faults.FAULTS``) is injected into a kernel path on a small case (cpu-sized, one M,
the Triton interpreter without a GPU); the harness (``stages.compare_case`` + ``faults.diagnose``) must FAIL
the case (the fault is *killed*) and name the fault (*named*). Three ways of injecting, chosen per fault:

* ``weights``: the kernel reads tampered stored weights, equal to what a kernel with the layout fault reads
  from the correct ones: the faulty logical checkpoint is built on the KERNEL side (production layout code,
  ``flint_moe.layouts``, and byte-level edits; not ``faults.py``'s golden decoders) and converted with
  ``FlintMoEWeights.from_modelopt``. The harness still sees the correct stored weights.
* ``path``: the path function is wrapped (BF16 decode: the row maps the kernel reads are replaced by those
  of the faulty layout).
* ``tap``: the kernel runs cleanly; its taps are post-processed at the faulty stage by an independent
  implementation of the faulty rule, and every later stage (and the returned output) is re-simulated with
  the golden model, as the faulty kernel would go on to produce them.

Faults whose effect is rare on random data run on crafted inputs (``prepare``): ``exact_sigmoid`` on tokens
scaled so that the gate values fall in (-103, -87), where ``rcp.approx.ftz`` flushes a subnormal ``r`` to 0
while the exact sigmoid does not; ``renorm_reverse_order`` on router logits found by a deterministic search
where the reverse-order sum flips a bf16 rounding of a routing weight; ``renorm_no_eps`` on the
``tiny_sigmoids`` profile; the top-k faults on ``tied_logits``.

``run_mutations(mutations=None) -> list[MutationResult]``; ``mutation_report(results) -> dict`` is the
report.json block (docs/ARCHITECTURE.md, section 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from flint_moe.conformance.inputs.cases import Case, ShapeSpec
from flint_moe.conformance.judge.faults import FAULTS, FAULTS_BY_NAME, diagnose
from flint_moe.conformance.judge.results import FAIL
from flint_moe.conformance.judge.stages import compare_case
from flint_moe.reference.combine import add_shared, fma_f32
from flint_moe.reference.experts import (
    SWIGLU_C,
    apply_global_scale,
    down_accumulate,
    down_accumulate_bf16,
    down_output,
    down_output_bf16,
    gate_up_accumulate,
    gate_up_accumulate_bf16,
    swiglu,
)
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.routing import renormalize, routing_scores, topk_total_order

__all__ = [
    "MUTATION_SHAPES",
    "Mutation",
    "MutationResult",
    "MUTATIONS",
    "run_mutation",
    "run_mutations",
    "mutation_report",
]

#: Small shapes of the mutation cases (keys: a path, or a path and a variant): the smallest NVFP4 cpu shape,
#: one with Ip % 128 == 0 (so the 128-row interleave fault applies), a BF16 one (2I and H multiples of the
#: 32-row shuffle block, H of the 64-element BlockMajorK block).
MUTATION_SHAPES = {
    "nvfp4_decode": ShapeSpec("cpu-E6-H96-I64-k3", 6, 96, 64, 3),
    "nvfp4_decode_i128": ShapeSpec("mut-E6-H96-I128-k3", 6, 96, 128, 3),
    "bf16_decode": ShapeSpec("mut-E6-H128-I64-k3", 6, 128, 64, 3),
    "nvfp4_grouped": ShapeSpec("cpu-E6-H96-I64-k3", 6, 96, 64, 3),
}
M_TOKENS = 2


@dataclass(frozen=True)
class Mutation:
    """One injected fault: ``fault`` (a ``faults.FAULTS`` name), ``path``, ``profile`` (data profile),
    ``injection`` ("weights" | "path" | "tap"), ``inject`` (weights / path: ``inject(case, inputs) ->
    inputs for the kernel``; tap: ``inject(case, inputs, taps) -> stage name``, mutating ``taps`` in place),
    ``prepare`` (a :data:`PREPARE` key of crafted inputs, or ""), ``shape`` (a :data:`MUTATION_SHAPES` key;
    default the path)."""

    fault: str
    path: str
    profile: str
    injection: str
    inject: Callable
    prepare: str = ""
    shape: str = ""

    def case(self) -> Case:
        return Case.make(self.path, MUTATION_SHAPES[self.shape or self.path], M_TOKENS, self.profile)

    @property
    def case_id(self) -> str:
        return self.case().id + (f"+{self.prepare}" if self.prepare else "")


@dataclass
class MutationResult:
    """Outcome of one mutation.

    Fields: fault (its catalogue name; also written as ``name``), path, case_id, injection;
    killed (the harness FAILed the case); named (``diagnose`` named this fault); verdict (case verdict);
    failed_stages; diagnosis (every fault ``diagnose`` named); note (e.g. "fault invisible on this data",
    or other faults named alongside).
    """

    fault: str
    path: str
    case_id: str
    injection: str
    killed: bool = False
    named: bool = False
    verdict: str = ""
    failed_stages: list[str] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict:
        """JSON-ready dict: every field, plus ``name`` (= ``fault``)."""
        d = asdict(self)
        d["name"] = self.fault
        return d


# ---------------------------------------------------------------------------------------------------------
# golden re-simulation of the stages after a mutated one
# ---------------------------------------------------------------------------------------------------------


def _logical(inputs):
    return inputs.logical


def _resimulate(case, inputs, t: dict, after: str) -> None:
    """Recompute, with the golden model, every stage after ``after`` ("ids", "weights", "act", "y") from the
    (mutated) taps ``t``: RN32 of the exact sums is one valid summation order."""
    wl = _logical(inputs)
    nv = case.path.startswith("nvfp4_")
    x = inputs.x
    M, k = t["ids"].shape
    I = wl.w13.shape[1] // 2  # noqa: E741
    pairs = [(m, j, int(t["ids"][m, j])) for m in range(M) for j in range(k)]
    if after == "ids":
        t["weights"] = renormalize(routing_scores(torch.gather(t["logits"], 1, t["ids"].long())))
        for m, j, e in pairs:
            xr = x[m : m + 1]
            if nv:
                r = gate_up_accumulate(xr, wl.w13[e], wl.w13_scale[e]).exact.to(torch.float32)[0]
            else:
                r = gate_up_accumulate_bf16(xr, wl.w13[e]).exact.to(torch.float32)[0]
            t["gate_acc"][m, j, :I], t["up_acc"][m, j, :I] = r[:I], r[I:]
            g, u = r[:I].contiguous(), r[I:].contiguous()
            if nv:
                g, u = apply_global_scale(g, wl.w13_gs[e : e + 1]), apply_global_scale(u, wl.w13_gs[e : e + 1])
            t["act"][m, j, :I] = swiglu(g, u)
    if after in ("ids", "act"):
        for m, j, e in pairs:
            a = t["act"][m, j, :I].contiguous()[None]
            if nv:
                d = down_accumulate(a, wl.w2[e], wl.w2_scale[e]).exact.to(torch.float32)[0]
                t["y"][m, j] = down_output(d, wl.w2_gs[e : e + 1])
            else:
                d = down_accumulate_bf16(a, wl.w2[e]).exact.to(torch.float32)[0]
                t["y"][m, j] = down_output_bf16(d)
            t["down_acc"][m, j] = d
    acc = torch.zeros_like(t["y"][:, 0], dtype=torch.float32)
    for j in range(k):  # step 9 (also for routing weights that are not bf16 values, unlike reference.combine)
        acc = fma_f32(t["weights"][:, j : j + 1].float(), t["y"][:, j].float(), acc)
    t["out"] = add_shared(to_bf16(acc), inputs.shared)


def _clone(taps: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in taps.items()}


def _gu_scaled(case, inputs, t, m, j):
    I = _logical(inputs).w13.shape[1] // 2  # noqa: E741
    g, u = t["gate_acc"][m, j, :I].contiguous(), t["up_acc"][m, j, :I].contiguous()
    if case.path.startswith("nvfp4_"):
        e = int(t["ids"][m, j])
        gs = _logical(inputs).w13_gs[e : e + 1]
        g, u = apply_global_scale(g, gs), apply_global_scale(u, gs)
    return g, u


def _tap_act(fn):
    def inject(case, inputs, t):
        I = _logical(inputs).w13.shape[1] // 2  # noqa: E741
        for m in range(t["ids"].shape[0]):
            for j in range(t["ids"].shape[1]):
                t["act"][m, j, :I] = fn(*_gu_scaled(case, inputs, t, m, j))
        return "act"

    return inject


def _rcp_form(g):
    return rcp_approx_ftz(ex2_approx_ftz(g * SWIGLU_C) + 1.0)


def _tap_y(fn):
    def inject(case, inputs, t):
        gs2 = _logical(inputs).w2_gs
        for m in range(t["ids"].shape[0]):
            for j in range(t["ids"].shape[1]):
                e = int(t["ids"][m, j])
                t["y"][m, j] = fn(t["down_acc"][m, j].contiguous(), gs2[e : e + 1])
        return "y"

    return inject


def _tap_ids(fn):
    def inject(case, inputs, t):
        t["ids"] = fn(t["logits"].contiguous(), int(case.k)).to(torch.int32)
        return "ids"

    return inject


def _ids_ties_high(logits, k):
    E = logits.shape[1]
    return (E - 1) - topk_total_order(logits.flip(1).contiguous(), k).long()


def _tap_weights(fn):
    def inject(case, inputs, t):
        s = routing_scores(torch.gather(t["logits"], 1, t["ids"].long()))
        t["weights"] = fn(s)
        return "weights"

    return inject


def _seq_sum(s, order):
    total = s[:, order[0]].clone()
    for j in order[1:]:
        total = total + s[:, j]
    return total


_EPS = float(torch.tensor(1e-20, dtype=torch.float32))


def _tap_out(fn):
    def inject(case, inputs, t):
        tw, y = t["weights"].float(), t["y"].float()
        t["out"] = fn(tw, y, inputs.shared.float())
        return "out"

    return inject


def _combine_bf16(tw, y, shared):
    acc = torch.zeros_like(y[:, 0])
    for j in range(tw.shape[1]):
        acc = to_bf16(fma_f32(tw[:, j : j + 1], y[:, j].contiguous(), acc)).float()
    return to_bf16(acc + shared)


def _combine_unrounded(tw, y, shared):
    acc = torch.zeros_like(y[:, 0])
    for j in range(tw.shape[1]):
        acc = fma_f32(tw[:, j : j + 1], y[:, j].contiguous(), acc)
    return to_bf16(acc + shared)


# ---------------------------------------------------------------------------------------------------------
# weights / path injections (kernel side: production layout code)
# ---------------------------------------------------------------------------------------------------------


def _restore_nvfp4(inputs, case, w13, s13, w2=None, s2=None):
    """Kernel inputs whose stored weights are ``FlintMoEWeights.from_modelopt`` of a (faulty) checkpoint."""
    from flint_moe.layouts import FlintMoEWeights

    wl = _logical(inputs)
    w2 = wl.w2 if w2 is None else w2
    s2 = wl.w2_scale if s2 is None else s2
    stored = FlintMoEWeights.from_modelopt(w13, s13, wl.w13_gs, w2, s2, wl.w2_gs, pad_intermediate_to=case.pad_to)
    return replace(inputs, stored=stored)


def _w_halves_nv(case, inputs):
    wl = _logical(inputs)
    I = wl.w13.shape[1] // 2  # noqa: E741
    dev = wl.w13.device
    perm = torch.cat([torch.arange(I, 2 * I, device=dev), torch.arange(I, device=dev)])  # up read as gate
    return _restore_nvfp4(inputs, case, wl.w13[:, perm].contiguous(), wl.w13_scale[:, perm].contiguous())


def _w_interleave(group):
    def inject(case, inputs):
        from flint_moe.layouts.rows import invert_rows, w13_rows_cutedsl

        wl = _logical(inputs)
        I = wl.w13.shape[1] // 2  # noqa: E741
        dev = wl.w13.device
        src64 = w13_rows_cutedsl(I, None, 64, dev)  # physical row -> logical row (correct layout)
        phys_faulty = invert_rows(w13_rows_cutedsl(I, None, group, dev), 2 * I)  # logical -> physical it reads
        perm = src64[phys_faulty]
        return _restore_nvfp4(inputs, case, wl.w13[:, perm].contiguous(), wl.w13_scale[:, perm].contiguous())

    return inject


def _w_swizzle(kind):
    """The faulty kernel reads scale (r, c) of physical row r at a wrong byte of the swizzled block."""

    def inject(case, inputs):
        from flint_moe.layouts.rows import invert_rows, w13_rows_cutedsl

        st, wl = inputs.stored, _logical(inputs)
        I = wl.w13.shape[1] // 2  # noqa: E741

        def read(sw, rows, cols):
            e, mp, kp = sw.shape
            if kind == "missing":  # row-major [Mp, Kp] bytes
                return sw.view(torch.uint8)[:, :rows, :cols]
            tiles = sw.view(torch.uint8).reshape(e, mp // 128, kp // 4, 128, 4)  # 512-byte tiles, row-major
            return tiles.permute(0, 1, 3, 2, 4).reshape(e, mp, kp)[:, :rows, :cols]

        s1_phys = read(st.w1_sf_swizzled, 2 * I, st.hidden_size // 16)
        phys = invert_rows(w13_rows_cutedsl(I, None, 64, wl.w13.device), 2 * I)  # logical -> physical
        s1 = s1_phys[:, phys].contiguous().view(torch.float8_e4m3fn)
        s2 = read(st.w2_sf_swizzled, st.hidden_size, I // 16).contiguous().view(torch.float8_e4m3fn)
        return _restore_nvfp4(inputs, case, wl.w13, s1, s2=s2)

    return inject


def _w_nibbles(case, inputs):
    wl = _logical(inputs)

    def sw(c):
        return (c >> 4) | ((c & 0x0F) << 4)

    return _restore_nvfp4(inputs, case, sw(wl.w13), wl.w13_scale, w2=sw(wl.w2))


def _p_maps(kind):
    """BF16 decode with the row maps of a faulty layout reading."""

    def inject(case, inputs):
        g1, g2, (map13, map2) = inputs.stored
        two_ip, hidden = map13.numel(), map2.numel()
        ip = two_ip // 2
        if kind == "halves":
            l13 = torch.arange(two_ip, device=map13.device)
            m13 = map13[(l13 + ip) % two_ip]
            m2 = map2
        else:  # shuffle missing: the gated-reorder position is taken as the physical row
            from flint_moe.layouts.rows import gated_reorder_rows, invert_rows

            # gated_reorder_rows: position -> row of [up; gate]; logical [gate; up] row l is [up; gate] row
            # (l + Ip) % 2Ip.
            pos_of = invert_rows(gated_reorder_rows(two_ip, map13.device), two_ip)
            l13 = torch.arange(two_ip, device=map13.device)
            m13 = pos_of[(l13 + ip) % two_ip]
            m2 = torch.arange(hidden, device=map2.device)
        return replace(inputs, stored=(g1, g2, (m13.to(torch.int32), m2.to(torch.int32))),
                       notes={**inputs.notes, "injected_row_maps": True})  # fmt: skip

    return inject


# ---------------------------------------------------------------------------------------------------------
# crafted inputs
# ---------------------------------------------------------------------------------------------------------


def _prep_negative_gate(case, inputs):
    """Tokens ``c_m * ones`` (asymmetric profile: every gate weight <= 0) with c_m chosen so the selected
    experts' gate values centre near -95: inside (-103, -87), where ``rcp.approx.ftz`` flushes ``r``."""
    wl = _logical(inputs)
    M, H = inputs.x.shape
    I = wl.w13.shape[1] // 2  # noqa: E741
    dev = inputs.x.device
    ones = torch.ones(1, H, dtype=torch.bfloat16, device=dev)
    logits = to_bf16(ones.float() @ inputs.router_weight.float().T)
    ids = topk_total_order(logits, case.k)[0].tolist()
    gs = torch.cat([gate_up_accumulate(ones, wl.w13[e], wl.w13_scale[e]).exact[0, :I] * float(wl.w13_gs[e])
                    for e in ids])  # fmt: skip
    med = float(gs.median())
    targets = (-95.0, -91.0, -99.0, -93.0)
    c = torch.tensor([targets[m % 4] / med for m in range(M)], device=dev)
    x = (c[:, None] * torch.ones(M, H, device=dev)).to(torch.bfloat16)
    return replace(inputs, x=x)


def _renorm_probe_logits(k: int, n: int = 1 << 17) -> torch.Tensor:
    """bf16 [k] logits, descending, no ties, for which summing the scores in reverse slot order changes a
    bf16 routing weight (deterministic search over ``n`` random rows)."""
    g = torch.Generator().manual_seed(1234)
    lg = to_bf16(torch.randn(n, k, generator=g) * 2.0)
    lg = torch.sort(lg.float(), dim=1, descending=True).values.to(torch.bfloat16)
    distinct = (lg[:, :-1].float() > lg[:, 1:].float()).all(dim=1)
    s = routing_scores(lg)
    good = renormalize(s)
    bad = round_bf16(s / (_seq_sum(s, list(range(k - 1, -1, -1))) + _EPS)[:, None])
    hit = torch.nonzero(distinct & (good != bad).any(dim=1)).flatten()
    if hit.numel() == 0:
        raise RuntimeError("renorm probe: no row found (increase n)")
    return lg[int(hit[0])]


def _prep_renorm(case, inputs):
    """Tokens e_0 and router column 0 = probe logits (the first k experts), far below for the rest: the
    router accumulations are exact, so the logits equal the probe values on any summation order."""
    M, H = inputs.x.shape
    E, k = inputs.router_weight.shape[0], case.k
    dev = inputs.x.device
    x = torch.zeros(M, H, device=dev)
    x[:, 0] = 1.0
    r = torch.zeros(E, H, device=dev)
    r[:k, 0] = _renorm_probe_logits(k).float().to(dev)
    r[k:, 0] = -40.0 - torch.arange(E - k, dtype=torch.float32, device=dev)
    return replace(inputs, x=x.to(torch.bfloat16), router_weight=r.to(torch.bfloat16))


def _prep_descending(case, inputs):
    """Tokens e_0 and router column 0 = 0.5 * expert index: every token's logits rise with the expert index
    (exact on any device and summation order), so its top-k is the k highest indices in DESCENDING index order
    and an ascending-index top-k differs whenever k >= 2 (random data leaves it invisible with probability
    (1/k!)^M, e.g. 1/36 for k = 3, M = 2)."""
    M, H = inputs.x.shape
    E = inputs.router_weight.shape[0]
    dev = inputs.x.device
    x = torch.zeros(M, H, device=dev)
    x[:, 0] = 1.0
    r = torch.zeros(E, H, device=dev)
    r[:, 0] = 0.5 * torch.arange(E, dtype=torch.float32, device=dev)
    return replace(inputs, x=x.to(torch.bfloat16), router_weight=r.to(torch.bfloat16))


PREPARE = {"negative_gate": _prep_negative_gate, "renorm_probe": _prep_renorm, "descending": _prep_descending}


# ---------------------------------------------------------------------------------------------------------
# the catalogue of mutations
# ---------------------------------------------------------------------------------------------------------

_NV, _BF, _GR = "nvfp4_decode", "bf16_decode", "nvfp4_grouped"


def _muts() -> tuple[Mutation, ...]:
    act_swap = _tap_act(lambda g, u: swiglu(u, g))
    act_twice = _tap_act(lambda g, u: to_bf16(u * to_bf16(g * _rcp_form(g)).float()))
    act_exact = _tap_act(lambda g, u: to_bf16(u * (g * torch.sigmoid(g.double()).float())))
    ties = _tap_ids(_ids_ties_high)
    asc = _tap_ids(lambda lg, k: torch.sort(topk_total_order(lg, k), dim=1).values)
    no_eps = _tap_weights(lambda s: round_bf16(s / _seq_sum(s, list(range(s.shape[1])))[:, None]))
    rev = _tap_weights(lambda s: round_bf16(s / (_seq_sum(s, list(range(s.shape[1] - 1, -1, -1))) + _EPS)[:, None]))
    unrounded = _tap_weights(lambda s: s / (_seq_sum(s, list(range(s.shape[1]))) + _EPS)[:, None])
    return (
        Mutation("w13_halves_swapped", _NV, "gaussian", "weights", _w_halves_nv),
        Mutation("w13_halves_swapped", _BF, "gaussian", "path", _p_maps("halves")),
        Mutation("interleave_group_32", _NV, "gaussian", "weights", _w_interleave(32)),
        Mutation("interleave_group_128", _NV, "gaussian", "weights", _w_interleave(128), shape="nvfp4_decode_i128"),
        Mutation("scale_swizzle_missing", _NV, "gaussian", "weights", _w_swizzle("missing")),
        Mutation("scale_swizzle_transposed", _NV, "gaussian", "weights", _w_swizzle("transposed")),
        Mutation("nibble_order_swapped", _NV, "gaussian", "weights", _w_nibbles),
        Mutation("row_shuffle_missing", _BF, "gaussian", "path", _p_maps("shuffle")),
        Mutation("gate_up_swapped", _NV, "gaussian", "tap", act_swap),
        Mutation("gate_up_swapped", _BF, "gaussian", "tap", act_swap),
        Mutation("act_rounded_twice", _NV, "gaussian", "tap", act_twice),
        Mutation("act_rounded_twice", _BF, "gaussian", "tap", act_twice),
        Mutation("exact_sigmoid", _NV, "asymmetric", "tap", act_exact, "negative_gate"),
        Mutation("global_scale_after_round", _NV, "gaussian", "tap",
                 _tap_y(lambda d, gs: to_bf16(to_bf16(d).float() * gs))),
        Mutation("global_scale_missing", _NV, "gaussian", "tap", _tap_y(lambda d, gs: to_bf16(d))),
        Mutation("topk_ties_highest", _NV, "tied_logits", "tap", ties),
        Mutation("topk_ties_highest", _BF, "tied_logits", "tap", ties),
        Mutation("topk_ascending_index", _NV, "gaussian", "tap", asc, "descending"),
        Mutation("renorm_no_eps", _NV, "tiny_sigmoids", "tap", no_eps),
        Mutation("renorm_reverse_order", _NV, "gaussian", "tap", rev, "renorm_probe"),
        Mutation("routing_weights_unrounded", _NV, "gaussian", "tap", unrounded),
        Mutation("combine_bf16_accumulate", _NV, "gaussian", "tap", _tap_out(_combine_bf16)),
        Mutation("combine_bf16_accumulate", _BF, "gaussian", "tap", _tap_out(_combine_bf16)),
        Mutation("shared_added_unrounded", _NV, "gaussian", "tap", _tap_out(_combine_unrounded)),
        # the grouped path reads the same stored weights: a layout fault and two rule faults there too
        Mutation("scale_swizzle_missing", _GR, "gaussian", "weights", _w_swizzle("missing")),
        Mutation("gate_up_swapped", _GR, "gaussian", "tap", act_swap),
        Mutation("global_scale_after_round", _GR, "gaussian", "tap",
                 _tap_y(lambda d, gs: to_bf16(to_bf16(d).float() * gs))),
    )  # fmt: skip


MUTATIONS: tuple[Mutation, ...] = _muts()


# ---------------------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------------------


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _counter(device):
    from flint_moe.ops import make_route_counter

    return make_route_counter(device)


def _run_kernel(case, inputs, counter):
    from flint_moe.conformance.run.paths import PATHS

    taps: dict = {}
    out = PATHS[case.path].run(inputs, counter, taps)
    return taps, out


def _changed(a: dict, b: dict) -> bool:
    for name in set(a) | set(b):
        x, y = a.get(name), b.get(name)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return True
            xv = x.contiguous().view(torch.uint8) if x.is_floating_point() else x
            yv = y.contiguous().view(torch.uint8) if y.is_floating_point() else y
            if not torch.equal(xv, yv):
                return True
    return False


def run_mutation(mut: Mutation, *, cache: dict | None = None, device=None) -> MutationResult:
    """Inject ``mut`` and judge the harness: compare_case must FAIL the case and diagnose must name the fault.

    ``cache`` (a dict) keeps the clean inputs and kernel runs per case between mutations. ``device``: default
    CUDA when available, else the CPU (Triton interpreter)."""
    from flint_moe.conformance.inputs.cases import make_inputs

    cache = {} if cache is None else cache
    device = _device() if device is None else torch.device(device)
    counter = cache.get(("counter", str(device)))
    if counter is None:
        counter = cache[("counter", str(device))] = _counter(device)
    case = mut.case()
    key = (mut.case_id, str(device))
    if key not in cache:
        inputs = make_inputs(case, device)
        if mut.prepare:
            inputs = PREPARE[mut.prepare](case, inputs)
        cache[key] = (inputs, *_run_kernel(case, inputs, counter))
    inputs, clean_taps, clean_out = cache[key]
    res = MutationResult(mut.fault, mut.path, mut.case_id, mut.injection)
    if mut.injection == "tap":
        taps = _clone(clean_taps)
        after = mut.inject(case, inputs, taps)
        if after != "out":
            _resimulate(case, inputs, taps, after)
        out = taps["out"]
    else:
        kin = mut.inject(case, inputs)
        taps, out = _run_kernel(case, kin, counter)
    if not _changed({**clean_taps, "_out": clean_out}, {**taps, "_out": out}):
        res.note = "fault invisible on this data (kernel output and taps unchanged)"
        return res
    cmp = compare_case(case, inputs, taps, out)
    res.verdict, res.failed_stages = cmp.verdict, cmp.failed_stages
    res.killed = cmp.verdict == FAIL
    if res.killed:
        res.diagnosis = diagnose(case, inputs, taps, out, cmp)
    names = [d.split(":")[0] for d in res.diagnosis]
    res.named = mut.fault in names
    others = [n for n in names if n != mut.fault]
    if others:
        res.note = f"also reproduced by: {', '.join(others)}"
    return res


def run_mutations(mutations=None, *, device=None) -> list[MutationResult]:
    """Run ``mutations`` (default :data:`MUTATIONS`: every catalogued fault, on each path it has an injection
    for) on ``device`` (default CUDA when available, else the CPU) and return one :class:`MutationResult` each.
    On the CPU the interpreter makes this a few minutes (each weights / path injection is a kernel run)."""
    cache: dict = {}
    return [run_mutation(m, cache=cache, device=device) for m in (MUTATIONS if mutations is None else mutations)]


def mutation_report(results: list[MutationResult]) -> dict:
    """The report.json ``"mutation"`` block: killed, named, total, kill_rate (killed AND named / total),
    catalogue (every catalogued fault name), untested (catalogued faults without a mutation), results."""
    total = len(results)
    ok = sum(r.killed and r.named for r in results)
    tested = {r.fault for r in results}
    return {
        "killed": sum(r.killed for r in results),
        "named": sum(r.named for r in results),
        "total": total,
        "kill_rate": ok / total if total else 0.0,
        "catalogue": [f.name for f in FAULTS],
        "untested": [f.name for f in FAULTS if f.name not in tested],
        "results": [r.to_json() for r in results],
    }


assert all(m.fault in FAULTS_BY_NAME for m in MUTATIONS)
