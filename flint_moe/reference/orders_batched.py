"""Order replay of many matmuls at once: the experts of one MoE layer, each against its own tokens.

:func:`replay_matmuls` returns, for every expert ``i``, exactly what :func:`.orders.replay_matmul` returns for
``(xs[i], ws[i])`` (the same fp32 operations in the same order, so the same bits). A tensor-core order (the
program opens with an ``mma_chain`` over every element axis; after it only ``add_zero``, ``scale``, ``tree`` or
``add_chain`` over the split-K parts) is evaluated for a group of experts per tensor-core step: the weights
of the group are stacked once ([G, N, K] bf16, their k positions permuted into the chain's step / slot
order), and one call of :func:`.mma.mma_bf16_f32_outer` per k16 step advances every (token, output row) pair
of the group, broadcasting instead of materialising ``tokens x rows x K``. Any other order is replayed one
expert at a time by :func:`.orders.replay_matmul`.
"""

from __future__ import annotations

import torch

from .orders import BLOCK, OrderError, _check_exact, _tree, check_order, replay_matmul

__all__ = ["replay_matmuls", "is_chain_order", "group_size"]

#: Stacked weight elements per group (G x N x parts x part_length) on a GPU / on the CPU.
_GROUP_ELEMENTS_CUDA = 1 << 28
_GROUP_ELEMENTS = 1 << 22
_TAIL_OPS = ("add_zero", "scale", "tree", "add_chain")


def is_chain_order(order: dict) -> bool:
    """True when ``order`` (checked) is one tensor-core chain over every element axis followed only by
    elementwise stages and reductions over the split-K ``part`` axis (the form :func:`replay_matmuls` groups)."""
    prog = check_order(order)["program"]
    first = prog[0]
    if first["op"] != "mma_chain":
        return False
    if sorted(first["chain"] + first["slots"]) != sorted(a[0] for a in order["axes"]):
        return False
    return all(st["op"] in _TAIL_OPS and st.get("axis", "part") == "part" for st in prog[1:])


def group_size(order: dict, n: int, device: torch.device | str) -> int:
    """Experts of N = ``n`` rows :func:`replay_matmuls` stacks per group for ``order`` on ``device``."""
    budget = _GROUP_ELEMENTS_CUDA if torch.device(device).type == "cuda" else _GROUP_ELEMENTS
    return max(1, budget // max(n * order["part_length"] * len(order["parts"]), 1))


def _slot_positions(order: dict, start: int, stop: int, k: int) -> torch.Tensor:
    """int64 [steps, 16]: the K position each (chain step, k slot) of the part ``[start, stop)`` reads, ``k``
    (a zero column) for the part's padding."""
    first = order["program"][0]
    names = [a[0] for a in order["axes"]]
    sizes = [a[1] for a in order["axes"]]
    plen = order["part_length"]
    idx = torch.arange(plen, dtype=torch.int64).reshape(sizes)
    idx = idx.permute(*[names.index(a) for a in first["chain"] + first["slots"]]).reshape(-1, 16)
    return torch.where(idx < stop - start, idx + start, torch.full_like(idx, k))


def _tail(order: dict, v: torch.Tensor) -> torch.Tensor:
    """The value stages after the chain on ``v`` [..., parts] (or [...] with one part) -> [...]."""
    for st in order["program"][1:]:
        op = st["op"]
        if op == "add_zero":
            v = v + 0.0
        elif op == "scale":
            v = v * (2.0 ** st["log2"])
        elif op == "tree":
            v = _tree(v, st["shape"])
        else:  # add_chain over the parts
            acc, start = (torch.zeros_like(v[..., 0]), 0) if st["init"] == "zero" else (v[..., 0], 1)
            for i in range(start, v.shape[-1]):
                acc = acc + v[..., i]
            v = acc
    return v


def _weights_bf16(order: dict, w: torch.Tensor, sc: torch.Tensor | None) -> torch.Tensor:
    wf = w.float()
    if sc is not None:
        wf = wf * sc.float().repeat_interleave(BLOCK, dim=-1)
    s = order.get("operands", {}).get("w_scale_log2", 0)
    if s:
        wf = wf * (2.0**s)
    _check_exact("w", wf, torch.bfloat16, "scaled weights entering a bf16 product")
    return wf.to(torch.bfloat16)


def _check_lists(order: dict, xs, ws, block_scales) -> None:
    k = order["length"]
    if not isinstance(xs, (list, tuple)) or not isinstance(ws, (list, tuple)) or len(xs) != len(ws):
        raise OrderError("xs, ws: expected two lists of one length (one entry per expert)")
    if block_scales is not None and (not isinstance(block_scales, (list, tuple)) or len(block_scales) != len(ws)):
        raise OrderError("block_scales: expected None or a list with one entry per expert")
    for i, (x, w) in enumerate(zip(xs, ws, strict=True)):
        for name, t in ((f"xs[{i}]", x), (f"ws[{i}]", w)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] != k:
                raise OrderError(f"{name}: expected a 2-d tensor [rows, {k}], got {getattr(t, 'shape', type(t))}")
        if w.shape[0] != ws[0].shape[0] or w.device != ws[0].device or x.device != w.device:
            raise OrderError(f"ws[{i}]: every expert needs the same row count and device as ws[0]")


def replay_matmuls(
    order: dict,
    xs: list[torch.Tensor],
    ws: list[torch.Tensor],
    *,
    block_scales: list[torch.Tensor] | None = None,
    mma=None,
) -> list[torch.Tensor]:
    """fp32 [len(xs[i]), N] per expert: ``replay_matmul(order, xs[i], ws[i], block_scales=block_scales[i])``
    bit for bit, tensor-core orders evaluated a group of experts per k16 step (module docstring).

    xs: per expert float [m_i, K] (bf16 values; m_i may be 0); ws: per expert float [N, K] (one N, one device);
    block_scales: None or per expert float [N, K / 16]; mma: the tensor-core step as in ``replay_matmul``
    (default :func:`.mma.mma_bf16_f32_outer`; an injected step is called on broadcast [G, R, N, 16] operands).
    Raises OrderError / ValueError / TypeError as :func:`.orders.replay_matmul`, and OrderError for lists of
    different lengths or experts of different N or device.
    """
    check_order(order)
    _check_lists(order, xs, ws, block_scales)
    if not ws:
        return []
    if not is_chain_order(order):
        return [
            replay_matmul(order, x, w, block_scales=None if block_scales is None else block_scales[i], mma=mma)
            for i, (x, w) in enumerate(zip(xs, ws, strict=True))
        ]
    k, n, dev = order["length"], ws[0].shape[0], ws[0].device
    parts = order["parts"]
    per = group_size(order, n, dev)
    todo = sorted((i for i in range(len(xs)) if xs[i].shape[0] > 0), key=lambda i: xs[i].shape[0])
    out = [torch.empty((x.shape[0], n), dtype=torch.float32, device=dev) for x in xs]
    positions = [_slot_positions(order, a, b, k).to(dev) for a, b in parts]
    instr = order["program"][0]["instruction"]
    if mma is None:
        from .mma import mma_bf16_f32_outer as outer

        def step(acc, a, b):
            return outer(acc, a, b, instruction=instr)
    else:

        def step(acc, a, b):
            g, r, nn = acc.shape
            return mma(acc, a[:, None].expand(g, r, nn, 16), b[:, :, None].expand(g, r, nn, 16), instruction=instr)

    for g0 in range(0, len(todo), per):
        grp = todo[g0 : g0 + per]
        # at least two experts and two rows: a size-1 dimension would make the fused step specialise per size
        rows = max(2, max(xs[i].shape[0] for i in grp))
        size = max(2, len(grp))
        wz = torch.zeros((size, n, k + 1), dtype=torch.bfloat16, device=dev)
        xz = torch.zeros((size, rows, k + 1), dtype=torch.bfloat16, device=dev)
        for j, i in enumerate(grp):
            wz[j, :, :k] = _weights_bf16(order, ws[i], None if block_scales is None else block_scales[i])
            xf = xs[i].float()
            _check_exact("x", xf, torch.bfloat16, "tensor-core operand")
            xz[j, : xf.shape[0], :k] = xf.to(torch.bfloat16)
        vals = []
        for pos in positions:
            flat = pos.reshape(-1)
            wp, xp = wz.index_select(2, flat), xz.index_select(2, flat)
            acc = torch.zeros((size, rows, n), dtype=torch.float32, device=dev)
            for t in range(pos.shape[0]):
                acc = step(acc, wp[:, :, 16 * t : 16 * t + 16], xp[:, :, 16 * t : 16 * t + 16])
            vals.append(acc)
        v = _tail(order, torch.stack(vals, dim=-1) if len(parts) > 1 else vals[0])
        for j, i in enumerate(grp):
            out[i].copy_(v[j, : xs[i].shape[0]])
    return out
