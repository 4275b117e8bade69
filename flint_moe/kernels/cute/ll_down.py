"""Down combine of the low-latency decode block (rule steps 8-10), and its specialisation ``DownSpec``: compiled
for sm_90a and its PTX audited on the CPU; bitwise on the H200 (tests/ops/test_moe_ll_gpu.py).

The routed and shared down partials that feed it are ``ll_partial.py``'s split-K kernel with rows N = H and
reduction K = Ip (routed, x = the pair's ``act`` row; columns at or beyond the valid intermediate size, padding
of any bytes, never read) or K = SI (shared, x = the token's shared ``act`` row), into the fp32 workspaces
[M * k, S, H] and [M, SS, H].

- ``combine``: grid (ceil(H / 128), M), one thread per (token t, output h): for each selected slot j in
  selection order, ``y_acc = p_0 + ... + p_{S-1}`` (``add.rn.f32``, increasing split), ``y_j =
  bf16(mul.rn(y_acc, gs2[e_j]))``, ``acc = fma.rn(tw_j, y_j, acc)`` from +0 (rule steps 8-9); the shared
  expert's ``y_s`` likewise with its own global scale; ``out = bf16(add.rn(bf16(acc), y_s))`` (step 10).
  Taps: ``down_acc`` fp32 [M, k, H] and ``y`` bf16 [M, k, H] (routed), ``shared_down_acc`` fp32 [M, H],
  ``shared_y`` bf16 [M, H]; ``out`` bf16 [M, H] always.

Limits (``DownSpec``, each a ValueError): Ip and SI multiples of 16 with 1 <= S <= Ip / 16 and 1 <= SS <= SI / 16
(the partial kernel's lane and split tails), the valid I a multiple of 16 in (0, Ip], H % 4 == 0 (rows per
CTA), 1 <= top_k <= min(E, 16).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

from flint_moe.kernels.cute import ll_gate_up
from flint_moe.kernels.cute.ll_gate_up import FINISH_THREADS, WARPS

__all__ = ["DownSpec"]


@dataclass(frozen=True)
class DownSpec:
    """One specialisation: hidden H, routed padded intermediate Ip and its valid part I, shared SI, routed
    experts E, top_k, K-splits of the routed (S) and shared (SS) partials."""

    hidden: int
    inter: int
    valid_inter: int
    shared_inter: int
    experts: int
    top_k: int
    splits: int
    shared_splits: int

    def __post_init__(self) -> None:
        for what, k, s in (("inter", self.inter, self.splits), ("shared_inter", self.shared_inter, self.shared_splits)):
            if k <= 0 or k % 16 or not 1 <= s <= k // 16:
                raise ValueError(
                    f"DownSpec: {what} {k} must be a positive multiple of 16 with 1 <= splits ({s}) <= {what} / 16"
                )
        if not (0 < self.valid_inter <= self.inter and self.valid_inter % 16 == 0):
            raise ValueError(f"DownSpec: valid_inter {self.valid_inter} must be a multiple of 16 in (0, {self.inter}]")
        if self.hidden <= 0 or self.hidden % WARPS:
            raise ValueError(f"DownSpec: hidden {self.hidden} must be a positive multiple of {WARPS}")
        if not 1 <= self.top_k <= 16 or self.experts < self.top_k:
            raise ValueError(f"DownSpec: top_k {self.top_k} must be in [1, min(experts = {self.experts}, 16)]")


@functools.cache
def _dsl() -> types.SimpleNamespace:
    """The ``combine`` kernel, defined once on first use (module globals receive ``ll_gate_up``'s DSL helpers,
    which the DSL resolves through globals)."""
    base = ll_gate_up._dsl()
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32

    add_rn, mul_rn, fma_rn = base.add_rn, base.mul_rn, base.fma_rn
    bf16_bits, bits_f32 = base.bf16_bits, base.bits_f32

    @cute.kernel
    def _combine_kernel(
        ws_r: cute.Tensor,  # fp32 [M * k * S * H]
        ws_s: cute.Tensor,  # fp32 [M * SS * H]
        ids: cute.Tensor,  # int32 [M * k]
        tw: cute.Tensor,  # fp32 [M * k] (bf16 values)
        gs2: cute.Tensor,  # fp32 [E]
        gs_s: cute.Tensor,  # fp32 [1]
        out: cute.Tensor,  # int16 [M * H]: bf16 bits
        acc_tap: cute.Tensor,  # fp32 [M * k * H]
        y_tap: cute.Tensor,  # int16 [M * k * H]
        sacc_tap: cute.Tensor,  # fp32 [M * H]
        sy_tap: cute.Tensor,  # int16 [M * H]
        H: cutlass.Constexpr,
        TOPK: cutlass.Constexpr,
        S: cutlass.Constexpr,
        SS: cutlass.Constexpr,
        TAP: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bt, t, _ = cute.arch.block_idx()
        h = bt * FINISH_THREADS + tidx
        cute.arch.griddepcontrol_wait()
        if h < H:
            acc = Float32(0.0)
            for j in cutlass.range_constexpr(TOPK):
                q = t * TOPK + j
                base_q = q * S * H + h
                ya = ws_r[base_q]
                for s in cutlass.range_constexpr(1, S):
                    ya = add_rn(ya, ws_r[base_q + s * H])
                yb = bf16_bits(mul_rn(ya, gs2[ids[q]]))
                if TAP:
                    acc_tap[q * H + h] = ya
                    y_tap[q * H + h] = cutlass.Int16(yb)
                acc = fma_rn(tw[q], bits_f32(yb << 16), acc)
            base_t = t * SS * H + h
            sa = ws_s[base_t]
            for s in cutlass.range_constexpr(1, SS):
                sa = add_rn(sa, ws_s[base_t + s * H])
            sb = bf16_bits(mul_rn(sa, gs_s[0]))
            if TAP:
                sacc_tap[t * H + h] = sa
                sy_tap[t * H + h] = cutlass.Int16(sb)
            routed = bits_f32(bf16_bits(acc) << 16)
            out[t * H + h] = cutlass.Int16(bf16_bits(add_rn(routed, bits_f32(sb << 16))))
        cute.arch.griddepcontrol_launch_dependents()

    globals().update({n: v for n, v in locals().items() if not n.startswith("__")})
    return types.SimpleNamespace(combine=_combine_kernel)
