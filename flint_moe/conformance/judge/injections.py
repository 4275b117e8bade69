"""How the mutation self-test (:mod:`flint_moe.conformance.judge.mutation`) injects a fault: tampered stored
weights (``_w_*``: the faulty logical checkpoint built on the kernel side with the production layout code and
byte edits), a wrapped path (``_p_maps``: the BF16 row maps of a faulty layout), or a post-processed tap
(``_tap_*``: the faulty stage by an independent implementation of the faulty rule, every later stage
re-simulated with the golden model, ``_resimulate``); and the crafted inputs of faults that random data rarely
shows (:data:`PREPARE`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from flint_moe.conformance.judge.expert_steps import expert_down, expert_gate_up, expert_y
from flint_moe.reference.combine import add_shared, fma_f32
from flint_moe.reference.experts import SWIGLU_C, apply_global_scale, gate_up_accumulate, swiglu
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.routing import renormalize, routing_scores, topk_total_order

__all__ = ["PREPARE"]

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
            r = expert_gate_up(wl, e, xr, nv).exact.to(torch.float32)[0]
            t["gate_acc"][m, j, :I], t["up_acc"][m, j, :I] = r[:I], r[I:]
            g, u = r[:I].contiguous(), r[I:].contiguous()
            if nv:
                g, u = apply_global_scale(g, wl.w13_gs[e : e + 1]), apply_global_scale(u, wl.w13_gs[e : e + 1])
            t["act"][m, j, :I] = swiglu(g, u)
    if after in ("ids", "act"):
        for m, j, e in pairs:
            a = t["act"][m, j, :I].contiguous()[None]
            d = expert_down(wl, e, a, nv).exact.to(torch.float32)[0]
            t["y"][m, j] = expert_y(wl, e, d, nv)
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
