"""Fake-tensor inputs of the conformance cases for the launch recorder of ``conformance.audit``.

Inside ``torch._subclasses.fake_tensor.FakeTensorMode`` the harness's paths run on tensors that have the real
cases' shapes, dtypes and device ``cuda`` but no data, so every launcher computes its grid, configuration and
constexprs exactly as on the H200 while nothing compiles or runs:

- :func:`fake_inputs`: a case's ``CaseInputs`` (the stored NVFP4 / BF16 layouts, the per-token paths'
  ``RoutedNVFP4Weights`` and routing map);
- :func:`fake_block_router`: the decode block's one Triton launch (its CuTe DSL expert kernels are listed from
  their plans by ``conformance.audit_block`` and audited by their own compile);
- :data:`MODULE_OP_PATH`: the op path a module path's ``forward`` runs;
- :func:`shape_only_permute` and :func:`fake_row_slicing`: stand-ins for what needs data or a CUDA build of
  PyTorch (``moe_permute``'s index arithmetic, indexing a fake CUDA tensor).
"""

from __future__ import annotations

import torch

__all__ = ["MODULE_OP_PATH", "fake_inputs", "fake_block_router", "fake_row_slicing", "shape_only_permute"]


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="cuda")


def fake_inputs(case):
    """``profiles.CaseInputs`` of ``case`` as fake CUDA tensors (call inside ``FakeTensorMode``): the stored
    layouts' shapes and dtypes on device ``cuda``, no data."""
    from flint_moe.conformance.inputs.pertoken import PERTOKEN_PATHS
    from flint_moe.conformance.inputs.profiles import CaseInputs

    E, H, I, Ip, M = case.E, case.H, case.I, case.Ip, case.M  # noqa: E741

    def t(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="cuda")

    if case.path in PERTOKEN_PATHS:
        return _fake_pertoken_inputs(case, t)
    notes = {"top_k": case.k, "injected_row_maps": True}  # fake maps hold no values to check
    if case.path.startswith("nvfp4"):
        from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights
        from flint_moe.layouts.swizzle import swizzled_scale_shape

        stored = FlintMoEWeights(
            w1=t(E, 2 * Ip, H // 2, dtype=torch.uint8),
            w1_sf_swizzled=t(E, *swizzled_scale_shape(2 * Ip, H // 16), dtype=torch.float8_e4m3fn),
            w1_alpha=t(E, dtype=torch.float32),
            w2=t(E, H, Ip // 2, dtype=torch.uint8),
            w2_sf_swizzled=t(E, *swizzled_scale_shape(H, Ip // 16), dtype=torch.float8_e4m3fn),
            w2_alpha=t(E, dtype=torch.float32),
            valid_intermediate=I,
        )
    else:
        stored = (t(E, H // 64, 2 * Ip, 64), t(E, Ip // 64, H, 64), (t(2 * Ip, dtype=torch.int32),
                  t(H, dtype=torch.int32)))  # fmt: skip
    return CaseInputs(t(M, H), t(E, H), t(M, H), None, stored, notes)


def _fake_pertoken_inputs(case, t):
    """``inputs.pertoken.build_pertoken_inputs`` of ``case`` as fake tensors made by ``t(*shape, dtype=)``: the
    ``RoutedNVFP4Weights`` stacks' padded shapes (``layouts.routed_nvfp4``), the routing map and probabilities,
    and the dispatcher profile's rank offset and token capacity (its pre-filled ``out`` left out: the same
    launches write the op's own output)."""
    from flint_moe.conformance.inputs.pertoken import PERTOKEN_PATHS
    from flint_moe.conformance.inputs.profiles import CaseInputs
    from flint_moe.layouts._core import round_up
    from flint_moe.layouts.routed_nvfp4 import ROUTED_ALIGNMENT, RoutedNVFP4Weights
    from flint_moe.layouts.swizzle import mma_view

    E, H, I, M, k = case.E, case.H, case.I, case.M, case.k  # noqa: E741
    act = PERTOKEN_PATHS[case.path]
    hp, ip = round_up(H, ROUTED_ALIGNMENT), round_up(I, ROUTED_ALIGNMENT)
    n1 = 2 * ip if act == "swiglu" else ip
    s1, s2 = t(E, n1, hp // 16, dtype=torch.float8_e4m3fn), t(E, hp, ip // 16, dtype=torch.float8_e4m3fn)
    stored = RoutedNVFP4Weights(
        H, I, hp, ip, act == "swiglu", t(E, n1, hp // 2, dtype=torch.uint8), s1, mma_view(s1, name="fc1_scale"),
        t(E, dtype=torch.float32), t(E, hp, ip // 2, dtype=torch.uint8), s2, mma_view(s2, name="fc2_scale"),
        t(E, dtype=torch.float32),
    )  # fmt: skip
    disp = case.profile == "dispatcher"
    notes = {
        "top_k": k, "routing_map": t(M, k, dtype=torch.int32), "probabilities": t(M, k, dtype=torch.float32),
        "num_experts": 2 * E if disp else E, "local_expert_offset": E if disp else 0,
        "token_capacity": M - M // 4 if disp else None, "activation": act,
        "out_init": None,  # fake tensors share address 0, which the op's overlap check of ``out=`` refuses
    }  # fmt: skip
    return CaseInputs(t(M, H), t(E, H), t(M, H), None, stored, notes)


#: The op path each module path runs (``modules.FlintNvfp4Experts.forward`` calls ``ops.flint_moe``, the path
#: ``nvfp4_dispatch``: decode or grouped kernels by M, E and k; ``modules.FlintBf16DecodeMoE.forward`` calls
#: ``ops.flint_moe_bf16_decode``; default configurations; the modules only load / repack the weights, and pass
#: their own route counter and shared output).
MODULE_OP_PATH = {"nvfp4_module": "nvfp4_dispatch", "bf16_module": "bf16_decode"}


def fake_row_slicing(getitem):
    """``Tensor.__getitem__`` that takes basic slicing ``t[a:b, ..., :c]`` (unit steps) as ``narrow`` per dimension (the
    same view): indexing a fake CUDA tensor needs a CUDA build of PyTorch, narrowing does not."""

    def item(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if parts.count(Ellipsis) == 1 and len(parts) <= self.dim() + 1:
            i = parts.index(Ellipsis)
            parts = parts[:i] + (slice(None),) * (self.dim() - len(parts) + 1) + parts[i + 1 :]
        if not all(isinstance(p, slice) and p.step in (None, 1) for p in parts) or len(parts) > self.dim():
            return getitem(self, index)
        out = self
        for d, p in enumerate(parts):
            start, stop, _ = p.indices(out.shape[d])
            out = out.narrow(d, start, max(stop - start, 0))
        return out

    return item


def shape_only_permute(ids, num_experts, block_m, tail=0):
    """``moe_permute`` (pure torch, no Triton kernel) reduced to its outputs' shapes: its index arithmetic
    needs a real device, and the grouped launchers read only the sizes, ``block_m`` and ``tail`` on the host."""
    from flint_moe.kernels.nvfp4.permute import MoEPermutation, num_blocks_bound

    m, k = ids.shape
    nb = num_blocks_bound(m * k, num_experts, block_m, tail)

    def i32(n):
        return torch.empty(n, dtype=torch.int32, device=ids.device)

    return MoEPermutation(i32(m * k), i32(num_experts + 1), i32(nb), i32(nb), i32(nb), num_experts, int(k), block_m,
                          tail)  # fmt: skip


def fake_block_router(case, counter, taps) -> None:
    """Launch the decode block's router kernel (``kernels.ll_router.launch_ll_router``: residual add, RMSNorm,
    router GEMV, top-k) for a block case on fake tensors: attn_out and residual [M, H], ln_weight [H], the router
    weight [E, H] (bf16), with ``taps`` (a dict: the compared run's TAP build) or None (the production build)."""
    from flint_moe.kernels.ll_router import launch_ll_router

    m, h = case.M, case.H
    launch_ll_router(_t(m, h), _t(m, h), _t(h), 1e-6, _t(case.E, h), case.k, counter, taps=taps)
