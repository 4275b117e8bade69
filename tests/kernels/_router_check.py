"""Shared checks of route() against the golden model (used by test_router.py and test_router_gpu.py)."""

from __future__ import annotations

import torch

from flint_moe.kernels.router import router_config
from flint_moe.ops.route import router_accumulation_model
from flint_moe.reference import routing
from flint_moe.reference.exact import check_accumulator


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal (NaN matches NaN; NaN payloads are never compared)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.cpu(), b.cpu()
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return False
        iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
        return torch.equal(a[~na].view(iv), b[~nb].view(iv))
    return torch.equal(a, b)


def check_route(x, w, k, ids, weights, taps) -> None:
    """Every order-free step from the kernel's own taps, exactly; router_acc within the certified bound."""
    acc = taps["router_acc"]
    m, e = x.shape[0], w.shape[0]
    assert acc.shape == (m, e) and acc.dtype == torch.float32
    assert ids.shape == (m, k) and ids.dtype == torch.int32
    assert weights.shape == (m, k) and weights.dtype == torch.float32
    acc_c = acc.cpu()
    logits = routing.logits_from_accumulator(acc_c)  # step 1's cast
    assert same_bits(taps["logits"].cpu(), logits), "logits != bf16(router_acc)"
    gold_ids = routing.topk_total_order(logits, k)  # step 2
    assert torch.equal(ids.cpu(), gold_ids), "ids differ from the golden top-k of the kernel's logits"
    sel = torch.gather(logits, 1, gold_ids.long())
    gold_w = routing.renormalize(routing.routing_scores(sel))  # steps 3-4
    assert same_bits(weights.cpu(), gold_w), "weights differ from the golden steps 3-4"
    assert taps["ids"] is ids and taps["weights"] is weights
    # on x's device (the golden model runs on CPU or CUDA), with the summation model of route's path for M
    bound = routing.router_accumulate(x, w, model=router_accumulation_model(m))
    ok = check_accumulator(acc, bound, name="router_acc").cpu()
    assert bool(ok.all()), f"router_acc outside the certified bound at {torch.nonzero(~ok)[:5].tolist()}"


def replay_gemv_order(x: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    """The GEMV kernel's documented summation order, replayed with separate fp32 torch ops (each one RN):
    per lane j sequential over chunks (RN(RN(x*w) + a)), then a pairwise tree over adjacent lanes."""
    m, h = x.shape
    e = w.shape[0]
    bh = router_config(e, h, k)["BLOCK_H"]
    c = -(-h // bh)
    xp = torch.zeros(m, c * bh, dtype=torch.float32)
    wp = torch.zeros(e, c * bh, dtype=torch.float32)
    xp[:, :h] = x.float().cpu()
    wp[:, :h] = w.float().cpu()
    a = torch.zeros(m, e, bh, dtype=torch.float32)
    for ci in range(c):
        prod = xp[:, None, ci * bh : (ci + 1) * bh] * wp[None, :, ci * bh : (ci + 1) * bh]
        a = a + prod
    while a.shape[-1] > 1:
        a = a[..., 0::2] + a[..., 1::2]
    return a[..., 0]
