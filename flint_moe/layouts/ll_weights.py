"""Weights of the low-latency decode block: router, routed experts and the NVFP4 shared expert, as views.

``LLMoEWeights`` holds, without copying anything:

- ``router_weight`` bf16 [E, H], contiguous;
- ``experts``: the routed experts, a :class:`~flint_moe.layouts.flashinfer_w4a16.FlintMoEWeights`;
- the shared expert as two FlashInfer-prepared NVFP4 linears (ModelOpt packing, row-major codes):
  ``shared_w13`` uint8 [2*SI, H/2] (rows [gate; up], the checkpoint's order and a merged vLLM gate_up
  linear's), ``shared_w13_sf`` uint8 [2*SI, H/16] (its E4M3 block-scale bytes in the 128x4 swizzle,
  shared/notes/layouts.md), ``shared_w13_gs`` fp32 0-d; ``shared_w2`` uint8 [H, SI/2], ``shared_w2_sf``
  uint8 [H, SI/16], ``shared_w2_gs`` fp32 0-d.

Layout of each shared linear [N, K]: N % 128 == 0 and K % 64 == 0, so the swizzled scale block
[roundup(N, 128), roundup(K/16, 4)] has no padding: its storage is exactly N * K/16 bytes. The global scale
multiplies the fp32 accumulator (rule steps 6 and 8; ModelOpt's ``weight_scale_2``).

A shared expert with a sigmoid gate (Qwen3-Next's ``shared_expert_gate``: ``sigmoid(g(x)) * shared(x)``) is
outside the Flint rule and refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flint_moe.layouts._core import check_global_scales, check_no_nan_e4m3, has_data
from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights

__all__ = ["LLMoEWeights", "SHARED_FIELDS", "ll_weights_from_layers", "check_nvfp4_linear"]

#: The shared-expert tensors of :class:`LLMoEWeights`, in declaration order.
SHARED_FIELDS = ("shared_w13", "shared_w13_sf", "shared_w13_gs", "shared_w2", "shared_w2_sf", "shared_w2_gs")

#: Row and column granularity of a shared linear [N, K]: N % 128 (one swizzle row tile, no padding rows),
#: K % 64 (whole 4-column groups of 16-element scale blocks, no padding columns).
ROW_MULTIPLE = 128
COL_MULTIPLE = 64

_SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn)
_OWN_FIELDS = ("", "_sf", "_gs")


def _detached(t: torch.Tensor) -> torch.Tensor:
    # an nn.Parameter's data as a plain tensor over the same storage (no copy)
    return t.detach() if t.requires_grad or isinstance(t, nn.Parameter) else t


def _check_dtype(label: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], want: str) -> None:
    """TypeError naming ``label`` unless ``t`` is a tensor of one of ``dtypes`` (``want`` describes them)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{label}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{label}: dtype must be {want}, got {t.dtype}")


def _check_contiguous(label: str, t: torch.Tensor) -> None:
    """ValueError naming ``label`` unless ``t`` is contiguous."""
    if not t.is_contiguous():
        raise ValueError(f"{label}: must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")


def check_nvfp4_linear(
    name: str,
    codes: object,
    scales: object,
    global_scale: object,
    *,
    n: int | None = None,
    k: int | None = None,
    values: bool = True,
    fields: tuple[str, str, str] = ("weight", "weight_scale", "weight_global_scale"),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check one FlashInfer-prepared NVFP4 linear [N, K] and return views ``(codes, scale_bytes, gs)``.

    Args:
        name: the linear's name in error messages (e.g. ``"shared_gate_up"``).
        codes: uint8 [N, K/2], packed E2M1 (low nibble = even column), contiguous.
        scales: uint8 or float8_e4m3fn, contiguous, any shape whose element count is the swizzled block's
            ``N * K/16`` (128x4 swizzle, no padding since N % 128 == 0 and K % 64 == 0).
        global_scale: fp32, one element (0-d or [1]), finite and >= +0.0.
        n, k: the expected N and K (None: any).
        fields: how the three tensors are named in messages: ``{name}.{field}`` (a module's attributes),
            or, when a field starts with ``_``, ``{name}{field}`` (LLMoEWeights' own field names).
        values: also read the values (NaN scale bytes, global scale); False: host-side checks only.

    Returns:
        ``codes`` (the tensor itself), ``scales`` viewed as uint8 [N, K/16], ``global_scale`` viewed as 0-d:
        views of the same storage, no copy.

    Raises:
        TypeError (not a tensor, dtype) or ValueError (shape, N % 128, K % 64, contiguity, scale storage size,
        device, an E4M3 NaN scale byte, a NaN / infinite / negative global scale), naming ``name.<tensor>``.
    """
    cn, sn, gn = (f"{name}{f}" if not f or f.startswith("_") else f"{name}.{f}" for f in fields)
    _check_dtype(cn, codes, (torch.uint8,), "torch.uint8 (packed E2M1 codes)")
    if codes.dim() != 2:
        raise ValueError(f"{cn}: expected 2 dimensions [N, K/2], got shape {tuple(codes.shape)}")
    rows, kk = codes.shape[0], 2 * codes.shape[1]
    if rows <= 0 or kk <= 0 or rows % ROW_MULTIPLE or kk % COL_MULTIPLE:
        raise ValueError(
            f"{cn}: [N, K/2] = {tuple(codes.shape)} needs N % {ROW_MULTIPLE} == 0 and "
            f"K % {COL_MULTIPLE} == 0 (N = {rows}, K = {kk})"
        )
    if n is not None and rows != n:
        raise ValueError(f"{cn}: N must be {n}, got {rows} (shape {tuple(codes.shape)})")
    if k is not None and kk != k:
        raise ValueError(f"{cn}: K must be {k}, got {kk} (shape {tuple(codes.shape)})")
    _check_contiguous(cn, codes)
    _check_dtype(sn, scales, _SCALE_DTYPES, "torch.uint8 or torch.float8_e4m3fn")
    want = rows * (kk // 16)
    if scales.numel() != want:
        raise ValueError(
            f"{sn}: the 128x4-swizzled scales of [N={rows}, K={kk}] take {rows} x {kk // 16} = "
            f"{want} bytes, got {scales.numel()} (shape {tuple(scales.shape)})"
        )
    _check_contiguous(sn, scales)
    _check_dtype(gn, global_scale, (torch.float32,), "torch.float32")
    if global_scale.numel() != 1:
        raise ValueError(f"{gn}: expected one element (0-d or [1]), got shape {tuple(global_scale.shape)}")
    for label, t in ((sn, scales), (gn, global_scale)):
        if t.device != codes.device:
            raise ValueError(f"{label}: on {t.device}, but {cn} is on {codes.device}")
    sf = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    sf = sf.view(rows, kk // 16)
    gs = global_scale.view(())
    if values and has_data(codes):
        check_no_nan_e4m3(f"{sn}", sf)
        check_global_scales(f"{gn}", gs.view(1))
    return codes, sf, gs


@dataclass(frozen=True, eq=False)
class LLMoEWeights:
    """Everything the low-latency decode block reads, as views (see the module docstring for the layout).

    Fields: ``router_weight`` bf16 [E, H]; ``experts`` FlintMoEWeights (E experts, hidden H);
    ``shared_w13`` uint8 [2*SI, H/2], ``shared_w13_sf`` uint8 [2*SI, H/16], ``shared_w13_gs`` fp32 0-d;
    ``shared_w2`` uint8 [H, SI/2], ``shared_w2_sf`` uint8 [H, SI/16], ``shared_w2_gs`` fp32 0-d.

    The constructor checks every field (TypeError for a type / dtype, ValueError otherwise, naming the field):
    the shared linears as :func:`check_nvfp4_linear` (2*SI and H multiples of 128, H and SI of 64), H and E
    consistent with the router and the experts, one device, contiguity. Immutable; equality is identity.
    Ops repeat the host-side part at entry (:meth:`check_metadata`).
    """

    router_weight: torch.Tensor
    experts: FlintMoEWeights
    shared_w13: torch.Tensor
    shared_w13_sf: torch.Tensor
    shared_w13_gs: torch.Tensor
    shared_w2: torch.Tensor
    shared_w2_sf: torch.Tensor
    shared_w2_gs: torch.Tensor

    def __post_init__(self) -> None:
        self._check("", values=True)

    def _check(self, p: str, *, values: bool) -> None:
        ex = self.experts
        if not isinstance(ex, FlintMoEWeights):
            raise TypeError(f"{p}experts: expected FlintMoEWeights, got {type(ex).__name__}")
        ex.check_metadata(f"{p}experts")
        rw = self.router_weight
        if not isinstance(rw, torch.Tensor):
            raise TypeError(f"{p}router_weight: expected a torch.Tensor, got {type(rw).__name__}")
        if rw.dtype != torch.bfloat16:
            raise TypeError(f"{p}router_weight: dtype must be torch.bfloat16, got {rw.dtype}")
        E, H = ex.num_experts, ex.hidden_size
        if tuple(rw.shape) != (E, H):
            raise ValueError(
                f"{p}router_weight: expected shape [E={E}, H={H}] (the experts' E and H), got {tuple(rw.shape)}"
            )
        if not rw.is_contiguous():
            raise ValueError(f"{p}router_weight: must be contiguous (strides {rw.stride()})")
        if rw.device != ex.w1.device:
            raise ValueError(f"{p}router_weight: on {rw.device}, but {p}experts are on {ex.w1.device}")
        for q, sf, gs in (
            ("shared_w13", self.shared_w13_sf, self.shared_w13_gs),
            ("shared_w2", self.shared_w2_sf, self.shared_w2_gs),
        ):
            # the stored views: uint8 [N, K/16] scales, 0-d global scale (their sizes are checked below)
            if isinstance(sf, torch.Tensor) and (sf.dtype != torch.uint8 or sf.dim() != 2):
                raise ValueError(f"{p}{q}_sf: expected the uint8 [N, K/16] view, got {sf.dtype} {tuple(sf.shape)}")
            if isinstance(gs, torch.Tensor) and gs.dim() != 0:
                raise ValueError(f"{p}{q}_gs: expected a 0-d tensor, got shape {tuple(gs.shape)}")
        w13, _, _ = check_nvfp4_linear(
            f"{p}shared_w13",
            self.shared_w13,
            self.shared_w13_sf,
            self.shared_w13_gs,
            k=H,
            values=values,
            fields=_OWN_FIELDS,
        )
        check_nvfp4_linear(
            f"{p}shared_w2", self.shared_w2, self.shared_w2_sf, self.shared_w2_gs, n=H, k=w13.shape[0] // 2,
            values=values, fields=_OWN_FIELDS,
        )  # fmt: skip
        for q in ("shared_w13", "shared_w2"):
            dev = getattr(self, q).device
            if dev != ex.w1.device:
                raise ValueError(f"{p}{q}: on {dev}, but {p}experts are on {ex.w1.device}")

    def check_metadata(self, name: str = "weights") -> None:
        """Host-side re-check of every field (dtype, shape, device, contiguity; no value read, no
        synchronisation): an op calls it at entry, so a tensor changed in place since construction is refused
        before a kernel reads it. TypeError / ValueError naming ``{name}.<field>``."""
        self._check(f"{name}." if name else "", values=False)

    @property
    def num_experts(self) -> int:
        return self.router_weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.router_weight.shape[1]

    @property
    def shared_intermediate_size(self) -> int:
        """SI, the shared expert's intermediate size."""
        return self.shared_w13.shape[0] // 2


def _linear_tensors(name: str, mod: object, **expect: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if isinstance(mod, nn.Module) and hasattr(mod, "shared_expert_gate"):
        raise ValueError(_SIGMOID_GATE.format(name=name))
    if not isinstance(mod, nn.Module):
        raise TypeError(f"{name}: expected an nn.Module holding an NVFP4 linear, got {type(mod).__name__}")
    missing = [a for a in ("weight", "weight_scale") if getattr(mod, a, None) is None]
    gs_attr = "weight_global_scale" if getattr(mod, "weight_global_scale", None) is not None else "weight_scale_2"
    if getattr(mod, gs_attr, None) is None:
        missing.append("weight_global_scale (or weight_scale_2)")
    if missing:
        raise ValueError(
            f"{name}: {type(mod).__name__} has no {', '.join(missing)}; expected a FlashInfer-prepared NVFP4 "
            "linear (weight uint8 [N, K/2], weight_scale 128x4-swizzled E4M3, weight_global_scale fp32)"
        )
    fields = ("weight", "weight_scale", gs_attr)
    tensors = [getattr(mod, a) for a in fields]
    tensors = [_detached(t) if isinstance(t, torch.Tensor) else t for t in tensors]
    return check_nvfp4_linear(name, *tensors, fields=fields, **expect)


_SIGMOID_GATE = (
    "{name}: a shared expert with a sigmoid gate (shared_expert_gate, as in Qwen3-Next: "
    "sigmoid(gate(x)) * shared(x)) is outside the Flint rule, which adds the shared expert's output ungated; "
    "not supported by the low-latency block"
)


def ll_weights_from_layers(
    router_weight: torch.Tensor | nn.Module,
    shared_gate_up: nn.Module,
    shared_down: nn.Module,
    experts: FlintMoEWeights,
    *,
    shared_expert_gate: object = None,
) -> LLMoEWeights:
    """Build :class:`LLMoEWeights` from a serving engine's layers, as views (no copy).

    Args:
        router_weight: bf16 [E, H], or an ``nn.Module`` whose ``weight`` is (the router linear).
        shared_gate_up: ``nn.Module`` holding the shared expert's merged gate/up NVFP4 linear [2*SI, H]: ``weight``
            uint8 [2*SI, H/2] (rows [gate; up]), ``weight_scale`` the 128x4-swizzled E4M3 bytes (uint8 or
            float8_e4m3fn, 2*SI * H/16 elements), ``weight_global_scale`` fp32 (one element; ``weight_scale_2``
            is read when ``weight_global_scale`` is absent), the factor applied to the fp32 accumulator.
        shared_down: the same for the down linear [H, SI].
        experts: the routed experts (FlintMoEWeights).
        shared_expert_gate: must be None; a sigmoid shared-expert gate is refused (ValueError).

    Raises:
        TypeError / ValueError naming the module and tensor (``shared_gate_up.weight_scale: ...``): a missing
        attribute, dtype, shape, N % 128, K % 64, contiguity, scale storage size, device, values; a module with
        a ``shared_expert_gate`` or a ``shared_expert_gate`` argument (sigmoid gate, outside the rule).
    """
    if shared_expert_gate is not None:
        raise ValueError(_SIGMOID_GATE.format(name="shared_expert_gate"))
    if isinstance(router_weight, nn.Module):
        rw = getattr(router_weight, "weight", None)
        if not isinstance(rw, torch.Tensor):
            raise TypeError(f"router_weight: {type(router_weight).__name__} has no weight tensor")
        router_weight = rw
    if isinstance(router_weight, torch.Tensor):
        router_weight = _detached(router_weight)
    if not isinstance(experts, FlintMoEWeights):
        raise TypeError(f"experts: expected FlintMoEWeights, got {type(experts).__name__}")
    H = experts.hidden_size
    c13, s13, g13 = _linear_tensors("shared_gate_up", shared_gate_up, k=H)
    c2, s2, g2 = _linear_tensors("shared_down", shared_down, n=H, k=c13.shape[0] // 2)
    return LLMoEWeights(router_weight, experts, c13, s13, g13, c2, s2, g2)
