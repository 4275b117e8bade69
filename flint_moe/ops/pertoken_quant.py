"""``quantize_routed_nvfp4_input``: the routed experts' per-token NVFP4 input (docs/numerics.md "Per-token NVFP4
experts", P1-P5), padded to the grouped GEMM's hidden width.

One launch of ``flint_moe.kernels.nvfp4.pertoken_quant`` on the current stream. Golden twin (unpadded):
``flint_moe.reference.pertoken_experts.quantize_routed_nvfp4_input_reference``; the padded columns hold code-0
bytes and 0x00 scale bytes.

Block-scale layout: plain row-major ``[M, Hp/16]`` (row t = token t, column b = block b), not 128x4-swizzled.
The rows of the routed input are gathered per expert before the grouped GEMM (a token appears once per selected
expert, in ``moe_permute`` order), so the swizzle belongs to that gather, not to the token-order quantizer
output; ``flint_moe.layouts.swizzle.swizzle_block_scales`` swizzles a gathered copy.
"""

from __future__ import annotations

import torch

from flint_moe.kernels._launch import check_op_tensor
from flint_moe.kernels.nvfp4.pertoken_quant import PERTOKEN_ALIGNMENT, launch_pertoken_quant, quantize_rows
from flint_moe.ops._checks import check_kernel_device

__all__ = ["quantize_routed_nvfp4_input"]

_OUT_NAMES = ("codes", "block_scale", "token_scale")


def _check_out(out: object, m: int, hp: int, device: torch.device, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if not isinstance(out, tuple) or len(out) != 3:
        raise TypeError(f"out: expected a tuple (codes, block_scale, token_scale), got {type(out).__name__}")
    specs = ((torch.uint8, (m, hp // 2)), (torch.uint8, (m, hp // 16)), (torch.float32, (m,)))
    for name, t, (dtype, shape) in zip(_OUT_NAMES, out, specs, strict=True):
        check_op_tensor(f"out.{name}", t, dtype=dtype, shape=shape, device=device)
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (x, *out)]
    names = ("hidden_states", *(f"out.{n}" for n in _OUT_NAMES))
    for i in range(1, 4):
        for j in range(i):
            if spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]:
                raise ValueError(f"{names[i]}: shares memory with {names[j]}; the outputs must not overlap")
    return out


def quantize_routed_nvfp4_input(
    hidden_states: torch.Tensor,
    padded_hidden_size: int,
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token NVFP4 quantization of the routed input (P1-P5), padded with zero columns to ``Hp``.

    Args:
        hidden_states: bf16 [M, H] contiguous, M >= 1, H a positive multiple of 16, finite (not checked: a
            check would synchronise; a non-finite row's outputs are unspecified). Never modified. On a CUDA
            device, or the CPU under ``TRITON_INTERPRET=1``.
        padded_hidden_size: Hp, an int, a multiple of 256 (the routed layout's alignment) and >= H.
        out: None, or ``(codes, block_scale, token_scale)`` of the shapes and dtypes below, contiguous, on
            ``hidden_states``' device, overlapping neither each other nor ``hidden_states``: filled and returned.
    Returns:
        ``(codes, block_scale, token_scale)``: uint8 [M, Hp/2] packed E2M1 (low nibble = even column; columns
        >= H code 0), uint8 [M, Hp/16] E4M3 block decode-scale bytes, row-major (module docstring; columns
        >= H/16 are 0x00), fp32 [M] the per-token decode scales ``d = div_rn(1, g)`` (1 for an all-zero row).
    Raises:
        TypeError: ``hidden_states`` not a bf16 tensor, ``padded_hidden_size`` not an int, ``out`` not a
            3-tuple or a wrong dtype in it.
        ValueError: rank, M = 0, H not a positive multiple of 16, Hp not a multiple of 256 or < H, not
            contiguous; ``out`` shape, device, contiguity or overlap.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``.
    """
    check_op_tensor("hidden_states", hidden_states, dtype=torch.bfloat16, shape=(None, None))
    m, h = hidden_states.shape
    if m < 1:
        raise ValueError(f"hidden_states: needs at least one row (M >= 1), got shape {tuple(hidden_states.shape)}")
    if h < 16 or h % 16:
        raise ValueError(f"hidden_states: hidden size H = {h} must be a positive multiple of 16")
    hp = padded_hidden_size
    if isinstance(hp, bool) or not isinstance(hp, int):
        raise TypeError(f"padded_hidden_size: expected an int, got {type(hp).__name__}")
    if hp % PERTOKEN_ALIGNMENT or hp < h:
        raise ValueError(f"padded_hidden_size: must be a multiple of {PERTOKEN_ALIGNMENT} and >= H = {h}, got {hp}")
    check_kernel_device("hidden_states", hidden_states)
    if out is None:
        return quantize_rows(hidden_states, hp)[:3]
    codes, scale, token_scale = _check_out(out, m, hp, hidden_states.device, hidden_states)
    launch_pertoken_quant(hidden_states, hp, codes, scale, token_scale)
    return codes, scale, token_scale
