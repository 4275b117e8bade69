"""How the mutation self-test injects the decode block's faults (``faults.FAULTS`` with paths ``ll_block`` /
``ll_module``): the kernel runs cleanly, its taps are post-processed at the faulty stage by an independent
implementation of the faulty rule, and every later stage (and the returned output) is re-simulated with the
golden model (``judge.block.block_taps``), as the faulty kernel would go on to produce them.

Crafted inputs (:data:`BLOCK_PREPARE`) for the two faults random data rarely shows: ``eps_after_rsqrt`` on
tokens scaled by 2^8 (``rsqrt(mean)`` near 2^-8, so adding eps = 1e-6 moves it by about 2^-12 relative and flips
many bf16 roundings of ``xn``); ``rsqrt_exact`` on token rows rescaled, by a deterministic search, until the
correctly rounded ``1 / sqrt`` and ``rsqrt.approx.ftz`` give different ``xn`` bits for the kernel's sum of
squares (on a GPU the replay of its declared order; on the CPU stand-in RN32 of the exact sum).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from flint_moe.conformance.judge.block import block_taps
from flint_moe.reference.combine import combine_fp32
from flint_moe.reference.decode_block import eps_fp32
from flint_moe.reference.mufu import rsqrt_approx_ftz

__all__ = ["BLOCK_INJECTIONS", "BLOCK_PREPARE", "resimulate_block"]


def resimulate_block(case, inputs, t: dict, after: str) -> None:
    """Recompute, with the golden model, every stage after ``after`` ("xn" or "shared_y") from the mutated taps
    ``t`` (in place)."""
    if after == "xn":
        t.update(block_taps(inputs, xn=t["xn"].contiguous(), taps=t))
    elif after == "shared_y":
        t.update(block_taps(inputs, shared_y=t["shared_y"].contiguous(), taps=t))
    elif after != "out":
        raise ValueError(f"resimulate_block: no re-simulation after {after!r}")


def _s32(inputs) -> np.ndarray:
    """fp32 s = attn_out + residual (numpy: one IEEE fp32 addition per element)."""
    return inputs.x.float().cpu().numpy().astype(np.float32) + inputs.shared.float().cpu().numpy().astype(np.float32)


def _xn_np(inputs, s: np.ndarray, inv: np.ndarray) -> torch.Tensor:
    """bf16(RN(RN(s * inv) * w)) from numpy fp32 ``s`` [M, H], ``inv`` [M]."""
    w = inputs.ln_weight.float().cpu().numpy().astype(np.float32)
    v = (s * inv[:, None].astype(np.float32)).astype(np.float32) * w
    return torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).to(inputs.x.device)


def _mean(inputs, t) -> np.ndarray:
    sq = t["sumsq"].float().cpu().numpy().astype(np.float32)
    return (sq / np.float32(inputs.x.shape[1])).astype(np.float32)


def _rsq(v: np.ndarray) -> np.ndarray:
    return rsqrt_approx_ftz(torch.from_numpy(v.astype(np.float32))).numpy()


def _inj_residual_rounded(case, inputs, t) -> str:
    s = torch.from_numpy(_s32(inputs)).to(torch.bfloat16).float().numpy()  # the residual rounded first
    sq = (s.astype(np.float64) ** 2).sum(axis=1).astype(np.float32)
    t["sumsq"] = torch.from_numpy(sq).to(inputs.x.device)
    eps = np.float32(eps_fp32(inputs.eps))
    inv = _rsq((sq / np.float32(s.shape[1])).astype(np.float32) + eps)
    t["xn"] = _xn_np(inputs, s, inv)
    return "xn"


def _inj_eps_after(case, inputs, t) -> str:
    t["xn"] = _xn_np(inputs, _s32(inputs), (_rsq(_mean(inputs, t)) + np.float32(eps_fp32(inputs.eps))))
    return "xn"


def _inj_rsqrt_exact(case, inputs, t) -> str:
    v = (_mean(inputs, t) + np.float32(eps_fp32(inputs.eps))).astype(np.float32)
    t["xn"] = _xn_np(inputs, _s32(inputs), (np.float32(1.0) / np.sqrt(v)).astype(np.float32))
    return "xn"


def _inj_shared_scale_after(case, inputs, t) -> str:
    gs = float(inputs.shared_w2.global_scale)
    d = t["shared_down_acc"].float().to(torch.bfloat16).float()
    t["shared_y"] = (d * torch.tensor(gs, dtype=torch.float32, device=d.device)).to(torch.bfloat16)
    return "shared_y"


def _inj_shared_skipped(case, inputs, t) -> str:
    t["out"] = combine_fp32(t["weights"], t["y"]).to(torch.bfloat16)
    return "out"


#: fault name -> tap injection ``inject(case, inputs, taps) -> the stage after which to re-simulate``.
BLOCK_INJECTIONS = {
    "residual_rounded_before_norm": _inj_residual_rounded,
    "eps_after_rsqrt": _inj_eps_after,
    "rsqrt_exact": _inj_rsqrt_exact,
    "shared_global_scale_after_round": _inj_shared_scale_after,
    "shared_expert_skipped": _inj_shared_skipped,
}


def _with_tokens(inputs, attn: torch.Tensor, residual: torch.Tensor):
    new = copy.copy(inputs)
    new.x, new.shared = attn.contiguous(), residual.contiguous()
    return new


def _large_tokens(case, inputs):
    """attn_out and residual times 2^8 (exact in bf16)."""
    return _with_tokens(inputs, inputs.x * 256, inputs.shared * 256)


#: Candidate rescalings of a token row in the ``rsqrt_exact`` search.
_PROBE_CANDIDATES = 4096


def _sumsq_as_kernel(case, s: torch.Tensor) -> np.ndarray:
    """fp32 [J] sums of squares of the rows of ``s`` (fp32 [J, H]) as the kernel computes them: on a GPU the
    replay of its declared ``sumsq`` order (``run.paths.block_orders``), else RN32 of the exact sum (the CPU
    stand-in kernel side)."""
    from flint_moe.reference.decode_block import sum_squares

    if s.device.type == "cuda":
        from flint_moe.conformance.run.paths import block_orders
        from flint_moe.reference.orders import replay_dot

        order = block_orders(case).get("sumsq")
        if order is not None:
            return replay_dot(order, s, s).float().cpu().numpy()
    return sum_squares(s).exact.to(torch.float32).cpu().numpy()


def _rsqrt_probe(case, inputs):
    """Each token row (attn_out and residual) rescaled by the first factor ``1 + j / 4096`` (j = 0, 1, ...)
    whose row gives different ``xn`` bits under ``1 / sqrt`` and ``rsqrt.approx.ftz`` with the kernel's sum of
    squares (:func:`_sumsq_as_kernel`), and under ``1 / sqrt`` and ``eps_after_rsqrt``'s form (so that the
    diagnosis can tell the two apart). Raises RuntimeError when a row has no such factor."""
    dev = inputs.x.device
    attn, res = inputs.x.float(), inputs.shared.float()
    h = attn.shape[1]
    eps = np.float32(eps_fp32(inputs.eps))
    w = inputs.ln_weight.float().cpu().numpy().astype(np.float32)
    f = (1.0 + torch.arange(_PROBE_CANDIDATES, dtype=torch.float64, device=dev) / 4096).float()
    new_a, new_r = attn.clone(), res.clone()
    for m in range(attn.shape[0]):
        a = (attn[m][None] * f[:, None]).to(torch.bfloat16).float()
        r = (res[m][None] * f[:, None]).to(torch.bfloat16).float()
        st = a + r  # fp32 [J, H], one RN each
        v = ((_sumsq_as_kernel(case, st) / np.float32(h)).astype(np.float32) + eps).astype(np.float32)
        s = st.cpu().numpy()
        approx = (s * _rsq(v)[:, None]).astype(np.float32) * w
        div = (s * (np.float32(1.0) / np.sqrt(v)).astype(np.float32)[:, None]).astype(np.float32) * w
        late = (s * (_rsq(v - eps) + eps)[:, None]).astype(np.float32) * w  # eps after rsqrt: must differ too
        ta, td, te = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).view(torch.int16)
                      for x in (approx, div, late))  # fmt: skip
        hits = torch.nonzero((ta != td).any(dim=1) & (te != td).any(dim=1)).flatten().tolist()
        if not hits:
            raise RuntimeError(f"rsqrt probe: no rescaling of token row {m} shows the fault")
        new_a[m], new_r[m] = a[hits[0]], r[hits[0]]
    return _with_tokens(inputs, new_a.to(torch.bfloat16), new_r.to(torch.bfloat16))


#: Crafted inputs of the block's mutations: name -> ``prepare(case, inputs) -> inputs``.
BLOCK_PREPARE = {"ll_large_tokens": _large_tokens, "ll_rsqrt_probe": _rsqrt_probe}
