"""CuTe DSL down projections + combine of the low-latency decode block (rule steps 5, 8-10): a first version,
compiled for sm_90 and its PTX audited on the CPU, bitwise on the H200 (tests/ops/test_moe_ll_gpu.py); not yet tuned.

Three launches, chained by programmatic dependent launch:

- the routed down partials and the shared expert's: ``ll_gate_up``'s ``partial`` kernel with rows N = H and
  reduction K = Ip (routed, x = the pair's ``act`` row) or K = SI (shared, x = the token's shared ``act``
  row), the same per-lane ``fma.rn.f32`` chains, butterfly tree and K-split workspace; columns at or beyond
  the valid intermediate size (padding, any bytes) are never read;
- ``combine``: grid (ceil(H / 128), M), one thread per (token t, output h): for each selected slot j in
  selection order, ``y_acc = p_0 + ... + p_{S-1}`` (``add.rn.f32``, increasing split), ``y_j =
  bf16(mul.rn(y_acc, gs2[e_j]))``, ``acc = fma.rn(tw_j, y_j, acc)`` from +0 (rule steps 8-9); the shared
  expert's ``y_s`` likewise with its own global scale; ``out = bf16(add.rn(bf16(acc), y_s))`` (step 10).
  Taps: ``down_acc`` fp32 [M, k, H] and ``y`` bf16 [M, k, H] (routed), ``shared_down_acc`` fp32 [M, H],
  ``shared_y`` bf16 [M, H]; ``out`` bf16 [M, H] always.

Limits: Ip and SI multiples of 16 with 1 <= S <= Ip / 16 and 1 <= SS <= SI / 16 (the ``partial`` kernel's lane
and split tails), H % 4 == 0 (rows per CTA).
"""

from __future__ import annotations

import functools
import tempfile
import types
from dataclasses import dataclass

from flint_moe.kernels.cute import ll_gate_up
from flint_moe.kernels.cute.ll_gate_up import FINISH_THREADS, PTX_FORBID, WARPS, cute_available

__all__ = ["AUDIT_SPECS", "DownSpec", "PTX_REQUIRE", "audit_down", "compile_down"]

#: Instructions the generated PTX must contain (rule steps 5, 8-10 pinned); forbidden: ``ll_gate_up``'s list.
PTX_REQUIRE = (
    "fma.rn.f32", "mul.rn.f32", "add.rn.f32", "cvt.rn.bf16.f32", "shfl.sync.bfly.b32", "griddepcontrol.wait",
    "griddepcontrol.launch_dependents",
)  # fmt: skip


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
    """The kernels, defined once on first use (module globals receive ``ll_gate_up``'s DSL helpers, which the
    DSL resolves through globals)."""
    base = ll_gate_up._dsl()
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32

    add_rn, mul_rn, fma_rn = base.add_rn, base.mul_rn, base.fma_rn
    bf16_bits, bits_f32, _partial_kernel = base.bf16_bits, base.bits_f32, base._partial_kernel

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

    @cute.jit
    def _down_host(
        act: cute.Tensor,  # bf16 [M * k * Ip]
        sact: cute.Tensor,  # bf16 [M * SI]
        ids: cute.Tensor,
        tw: cute.Tensor,
        w2: cute.Tensor,  # int32 [E * H * Ip / 8]
        sf2: cute.Tensor,  # uint8 [E * Mp * Kp]
        gs2: cute.Tensor,
        sw2: cute.Tensor,  # int32 [H * SI / 8]
        ssf2: cute.Tensor,  # uint8 [H * SI / 16]
        gs_s: cute.Tensor,
        ws_r: cute.Tensor,
        ws_s: cute.Tensor,
        out: cute.Tensor,
        acc_tap: cute.Tensor,
        y_tap: cute.Tensor,
        sacc_tap: cute.Tensor,
        sy_tap: cute.Tensor,
        tokens: Int32,
        H: cutlass.Constexpr,
        IP: cutlass.Constexpr,
        IV: cutlass.Constexpr,
        SI: cutlass.Constexpr,
        TOPK: cutlass.Constexpr,
        S: cutlass.Constexpr,
        SS: cutlass.Constexpr,
        TAP: cutlass.Constexpr,
        stream: cuda.CUstream,
    ):
        _partial_kernel(act, ids, w2, sf2, ws_r, TOPK, IP, H, IV, S, True, True).launch(
            grid=[H // WARPS, S, tokens * TOPK], block=[32 * WARPS, 1, 1], stream=stream, use_pdl=True
        )
        _partial_kernel(sact, ids, sw2, ssf2, ws_s, TOPK, SI, H, SI, SS, False, True).launch(
            grid=[H // WARPS, SS, tokens], block=[32 * WARPS, 1, 1], stream=stream, use_pdl=True
        )
        _combine_kernel(
            ws_r, ws_s, ids, tw, gs2, gs_s, out, acc_tap, y_tap, sacc_tap, sy_tap, H, TOPK, S, SS, TAP
        ).launch(
            grid=[(H + FINISH_THREADS - 1) // FINISH_THREADS, tokens, 1],
            block=[FINISH_THREADS, 1, 1],
            stream=stream,
            use_pdl=True,
        )

    globals().update({n: v for n, v in locals().items() if not n.startswith("__")})
    return types.SimpleNamespace(cute=cute, cuda=cuda, host=_down_host)


#: The block's shapes with a shared expert (K-splits each shape allows; Ling-mini-2.0's I = SI = 512: S = 1);
#: GLM-4.5-Air's I = SI = 1408 is not a multiple of 512 (lane tail).
AUDIT_SPECS = {
    "dsv3.S4": DownSpec(7168, 2048, 2048, 2048, 256, 8, 4, 4),
    "kimi.S2": DownSpec(7168, 2048, 2048, 2048, 384, 8, 2, 2),
    "glm45.S3": DownSpec(5120, 1536, 1536, 1536, 160, 8, 3, 3),
    "ling.S1": DownSpec(2048, 512, 512, 512, 256, 8, 1, 1),
    "padded.S1": DownSpec(2048, 1024, 960, 512, 16, 4, 1, 1),
    "glm45air.S1": DownSpec(4096, 1408, 1408, 1408, 128, 8, 1, 1),  # K / 16 = 88 blocks: a lane tail
}


def compile_down(spec: DownSpec, tokens: int = 1, *, tap: bool = False, arch: str = "sm_90a"):
    """Compile ``spec`` for ``arch`` (no GPU needed) with placeholder CPU tensors of the right dtypes; returns
    the compiled function (``.artifacts.PTX`` / ``.artifacts.CUBIN``). RuntimeError without nvidia-cutlass-dsl."""
    ok, why = cute_available()
    if not ok:
        raise RuntimeError(why)
    import torch

    ns = _dsl()
    from cutlass.cute.runtime import from_dlpack

    h, ip, si, e, k = spec.hidden, spec.inter, spec.shared_inter, spec.experts, spec.top_k
    s, ss, m = spec.splits, spec.shared_splits, tokens
    mp, kp = ll_gate_up.scale_block_shape(h, ip)
    z = torch.zeros
    t = [
        z(m * k * ip, dtype=torch.bfloat16), z(m * si, dtype=torch.bfloat16), z(m * k, dtype=torch.int32),
        z(m * k, dtype=torch.float32), z(e * h * ip // 8, dtype=torch.int32), z(e * mp * kp, dtype=torch.uint8),
        z(e, dtype=torch.float32), z(h * si // 8, dtype=torch.int32), z(h * si // 16, dtype=torch.uint8),
        z(1, dtype=torch.float32), z(m * k * s * h, dtype=torch.float32), z(m * ss * h, dtype=torch.float32),
        z(m * h, dtype=torch.int16), z(m * k * h, dtype=torch.float32), z(m * k * h, dtype=torch.int16),
        z(m * h, dtype=torch.float32), z(m * h, dtype=torch.int16),
    ]  # fmt: skip
    args = [from_dlpack(v).mark_layout_dynamic() for v in t]
    with tempfile.TemporaryDirectory(prefix="flint-cute-") as d:
        opts = f"--gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {d}"
        stream = ns.cuda.CUstream(0)
        return ns.cute.compile(ns.host, *args, m, h, ip, spec.valid_inter, si, k, s, ss, tap, stream, options=opts)


def audit_down(spec: DownSpec, *, tap: bool = False) -> list[str]:
    """Problems of ``spec``'s sm_90 PTX against :data:`PTX_REQUIRE` / ``ll_gate_up.PTX_FORBID`` (empty: passes)."""
    from flint_moe.kernels.audit.ptx import audit_ptx

    return audit_ptx(compile_down(spec, tap=tap).artifacts.PTX, PTX_REQUIRE, PTX_FORBID)
