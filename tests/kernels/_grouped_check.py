"""Golden-model checks of the grouped NVFP4 path's taps (shared by the interpreter and the GPU tests).

Order-free steps are recomputed from the kernels' own taps for EVERY (token, slot) pair, vectorised (so that
M = 16384 stays cheap): step 6 ``RN(acc * gs)`` is one fp32 multiply by the pair's expert's global scale (what
``reference.experts.apply_global_scale`` does for one expert), step 7 ``reference.experts.swiglu``, step 8
``to_bf16``, steps 9-10 ``reference.combine``. Accumulators are checked against the certified bound of the
grouped kernels' documented order, the plain any-order tensor-core model ``FP32_TRUNCATE``, for the pairs
the caller names (a DeepSeek-size golden bound costs about a second per pair on the CPU).
"""

from __future__ import annotations

import torch

from flint_moe.reference.combine import add_shared, combine_fp32
from flint_moe.reference.exact import FP32_TRUNCATE, check_accumulator
from flint_moe.reference.experts import down_accumulate, gate_up_accumulate, swiglu
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.layouts import experts_from_cutedsl

from ._nvfp4_check import _cpu_weights, same

MODEL = FP32_TRUNCATE


def check_grouped_taps(weights, x, ids, tw, shared, taps, out, *, acc_pairs=(), logical=None) -> dict:
    """Assert every order-free step of steps 6-10 bit-exact from the taps for all pairs, and the accumulators
    of ``acc_pairs`` ((token, slot) tuples) within the FP32_TRUNCATE bound. Returns counts."""
    dev = out.device
    ex = logical if logical is not None else experts_from_cutedsl(_cpu_weights(weights))
    M, k = ids.shape
    inter, hidden = weights.valid_intermediate, weights.hidden_size
    t = taps
    assert t["gate_acc"].shape == (M, k, inter) and t["gate_acc"].dtype == torch.float32
    assert t["up_acc"].shape == (M, k, inter) and t["act"].shape == (M, k, inter)
    assert t["down_acc"].shape == (M, k, hidden) and t["y"].shape == (M, k, hidden)
    assert same(t["out"], out), "taps['out'] differs from the returned output"
    e = ids.long()
    gs1 = ex.w13_gs.to(dev)[e][..., None]
    gs2 = ex.w2_gs.to(dev)[e][..., None]
    g = t["gate_acc"] * gs1
    u = t["up_acc"] * gs1
    gold_act = swiglu(g.contiguous(), u.contiguous())
    bad = ~_bits_eq(t["act"], gold_act)
    assert not bool(bad.any()), f"act differs from the golden SwiGLU of the taps at {_first(bad)}"
    gold_y = to_bf16(t["down_acc"] * gs2)
    bad = ~_bits_eq(t["y"], gold_y)
    assert not bool(bad.any()), f"y differs from the golden step 8 of the taps at {_first(bad)}"
    gold_out = add_shared(to_bf16(combine_fp32(tw, t["y"])), shared)
    bad = ~_bits_eq(out, gold_out)
    assert not bool(bad.any()), f"out differs from the golden combine + shared add at {_first(bad)}"
    n_acc = 0
    xc = x.detach()
    for m, j in acc_pairs:
        ei = int(ids[m, j])
        w13, s13 = ex.w13[ei].to(dev), ex.w13_scale[ei].to(dev)
        acc = gate_up_accumulate(xc[m : m + 1], w13, s13, model=MODEL)
        ok_g = check_accumulator(t["gate_acc"][m, j][None].contiguous(), acc[:, :inter], name="gate_acc")
        ok_u = check_accumulator(t["up_acc"][m, j][None].contiguous(), acc[:, inter:], name="up_acc")
        assert bool(ok_g.all()), f"gate_acc outside the bound (token {m}, slot {j}): {int((~ok_g).sum())}"
        assert bool(ok_u.all()), f"up_acc outside the bound (token {m}, slot {j}): {int((~ok_u).sum())}"
        dacc = down_accumulate(
            t["act"][m, j][None].contiguous(), ex.w2[ei].to(dev), ex.w2_scale[ei].to(dev), model=MODEL
        )
        ok_d = check_accumulator(t["down_acc"][m, j][None].contiguous(), dacc, name="down_acc")
        assert bool(ok_d.all()), f"down_acc outside the bound (token {m}, slot {j}): {int((~ok_d).sum())}"
        n_acc += 2 * inter + hidden
    return {"pairs": M * k, "acc_elements": n_acc}


def _bits_eq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    nan = torch.isnan(a) & torch.isnan(b)
    return nan | (a.contiguous().view(iv) == b.contiguous().view(iv))


def _first(mask: torch.Tensor) -> list:
    return torch.nonzero(mask)[:5].tolist()


def ids_with_counts(counts: list[int], k: int, seed: int) -> torch.Tensor:
    """int32 [M, k] with M = sum(counts) / k in which expert e is picked by exactly ``counts[e]`` tokens (each
    count <= M; the experts' runs laid out slot after slot, so a token never picks one expert twice), the
    tokens then shuffled by ``seed``."""
    M = sum(counts) // k
    assert M * k == sum(counts) and max(counts) <= M
    seq = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    ids = seq.view(k, M).t().contiguous()
    g = torch.Generator().manual_seed(seed)
    return ids[torch.randperm(M, generator=g)].contiguous()
