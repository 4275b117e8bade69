"""Inputs and cases of the low-latency decode block's conformance paths (``ll_block``: the op
``flint_moe.ops.flint_moe_ll``; ``ll_module``: the module ``flint_moe.modules.FlintLLDecodeBlock``).

A block case runs rule step 11 then steps 1-10 with an NVFP4 shared expert (the golden model's
``reference.model.moe_decode_block``). Its inputs (:class:`BlockInputs`, a ``profiles.CaseInputs``) keep the
fields every path has, so the invariances and the routed-stage judge read them unchanged: ``x`` is the
attention output ``attn_out`` and ``shared`` the residual stream ``residual`` (both bf16 [M, H], the block's
per-token inputs); ``logical`` / ``stored`` are the routed experts (``NVFP4Experts`` / ``FlintMoEWeights``,
built as the ``nvfp4_decode`` path builds them). Added: ``ln_weight`` bf16 [H], ``eps`` (a Python float),
the shared expert ``shared_w13`` NVFP4Linear [2*SI, H] ([gate; up]) and ``shared_w2`` NVFP4Linear [H, SI]
(logical, row-major scales) and ``ll``: the ``layouts.LLMoEWeights`` the op reads (router, routed experts,
the shared linears with 128x4-swizzled scale bytes and 0-d global scales).

Shapes: a block shape is a ``flint_moe.shapes.MODEL_SHAPES`` entry with a shared expert, or its scaled-down
copy (``cpu-<model>``); SI is its ``shared_intermediate``. A model whose shared expert has a sigmoid gate
(:data:`SIGMOID_GATED_MODELS`, Qwen3-Next) is refused: the rule adds the shared output ungated.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from flint_moe.conformance.inputs.profiles import CaseInputs
from flint_moe.reference.weights import NVFP4Linear
from flint_moe.shapes import MODEL_SHAPES, MoEShape

__all__ = [
    "BLOCK_PATHS",
    "BLOCK_PROFILES",
    "BlockInputs",
    "GPU_BLOCK_SHAPES",
    "RMS_EPS",
    "SIGMOID_GATED_MODELS",
    "block_shape",
    "build_block_inputs",
    "gpu_block_specs",
    "swizzled_scale_bytes",
]

#: The block's conformance paths (``run.paths.PATHS`` keys).
BLOCK_PATHS = ("ll_block", "ll_module")

#: Data profiles of the block: the routed NVFP4 profiles the CuTe kernels read the same way (the layout-tool
#: oracles and ``modelopt_quantizer`` excluded: not on the H200). Token profiles shape the residual stream;
#: weight profiles apply to the routed and the shared expert alike.
BLOCK_PROFILES = (
    "gaussian", "heavy_tailed", "tied_logits", "skewed_routing", "global_scales", "e4m3_scales", "zero_blocks",
    "poisoned_padding", "asymmetric", "tiny_sigmoids", "modelopt", "subnormal_tokens",
)  # fmt: skip

#: Models whose shared expert is gated by ``sigmoid(shared_expert_gate(x))``: outside the rule, refused.
SIGMOID_GATED_MODELS = ("qwen3-next-80b",)

#: RMSNorm epsilon of each model's post-attention norm (its config's ``rms_norm_eps``); 1e-6 otherwise.
RMS_EPS = {"deepseek-v3": 1e-6, "kimi-k2": 1e-6, "glm-4.5": 1e-5, "glm-4.5-air": 1e-5, "ling-mini-2.0": 1e-6}

#: Real shapes of the block on the gpu profile (the first gets every M in 1..8).
GPU_BLOCK_SHAPES = ("deepseek-v3", "kimi-k2", "glm-4.5", "ling-mini-2.0")


def _model_of(name: str) -> tuple[str, MoEShape] | None:
    for model, s in MODEL_SHAPES.items():
        if name == s.name:
            return model, s
        d = s.scaled_down()
        if name == d.name:
            return model, d
    return None


def block_shape(name: str) -> tuple[MoEShape, float]:
    """``(MoEShape, eps)`` of the block shape ``name`` (a ``MODEL_SHAPES`` name or its ``cpu-<model>`` copy).

    Raises ValueError: an unknown shape, a model without a shared expert, or one whose shared expert has a
    sigmoid gate (:data:`SIGMOID_GATED_MODELS`)."""
    found = _model_of(name)
    if found is None:
        raise ValueError(f"ll_block: shape {name!r} is not a model shape (known: {', '.join(MODEL_SHAPES)} and "
                         "their cpu-<model> copies)")  # fmt: skip
    model, s = found
    if model in SIGMOID_GATED_MODELS or s.name.removeprefix("cpu-") in SIGMOID_GATED_MODELS:
        raise ValueError(
            f"ll_block: shape {name!r}: the shared expert of {model} has a sigmoid gate "
            "(sigmoid(shared_expert_gate(x)) * shared(x)); the Flint rule adds the shared output ungated, so the "
            "decode block does not serve it"
        )
    if s.shared_intermediate is None:
        raise ValueError(f"ll_block: shape {name!r}: {model} has no shared expert")
    return s, RMS_EPS.get(model, 1e-6)


@dataclass
class BlockInputs(CaseInputs):
    """A block case's inputs (module docstring): ``x`` = attn_out, ``shared`` = residual, plus ``ln_weight``
    bf16 [H], ``eps`` float, ``shared_w13`` / ``shared_w2`` (``NVFP4Linear``), ``ll`` (``LLMoEWeights``)."""

    ln_weight: torch.Tensor | None = None
    eps: float = 1e-6
    shared_w13: NVFP4Linear | None = None
    shared_w2: NVFP4Linear | None = None
    ll: object = None

    @property
    def attn_out(self) -> torch.Tensor:
        return self.x

    @property
    def residual(self) -> torch.Tensor:
        return self.shared


_cache: dict = {}


def _gen(device: torch.device, text: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(zlib.crc32(text.encode()))


def _shared_linear(n: int, k: int, profile: str, g: torch.Generator, dev) -> NVFP4Linear:
    """One shared linear [n, k] under ``profile`` (the routed experts' weight profiles on a one-expert stack)."""
    from flint_moe.conformance.inputs import profiles as P

    codes = torch.randint(0, 256, (1, n, k // 2), generator=g, device=dev, dtype=torch.uint8)
    scales = P._scales((1, n, k // 16), g, dev)
    gs = torch.rand(1, generator=g, device=dev) * 2.0**-6 + 2.0**-8
    if profile == "global_scales":
        gs = torch.exp2(torch.rand(1, generator=g, device=dev) * 24 - 20)
    elif profile == "e4m3_scales":
        scales, gs = P._all_e4m3(scales.shape, g, dev), gs * 2.0**-8
    elif profile == "zero_blocks":
        codes, scales = P._zero_blocks(codes, scales, g, dev)
    return NVFP4Linear(codes[0].contiguous(), scales[0].contiguous().view(P.FP8), gs.reshape(()).float().clone())


def _shared_modelopt(h: int, si: int, g: torch.Generator, dev) -> tuple[NVFP4Linear, NVFP4Linear]:
    from flint_moe.reference.quantize import quantize_experts

    gate = torch.randn(1, si, h, generator=g, device=dev) * 0.05 + 0.01
    up = torch.randn(1, si, h, generator=g, device=dev) * 0.25 - 0.03
    down = torch.randn(1, h, si, generator=g, device=dev) * 0.05
    ex = quantize_experts(torch.cat([gate, up], 1).to(torch.bfloat16), down.to(torch.bfloat16))
    return (
        NVFP4Linear(ex.w13[0].contiguous(), ex.w13_scale[0].contiguous(), ex.w13_gs[0].reshape(()).clone()),
        NVFP4Linear(ex.w2[0].contiguous(), ex.w2_scale[0].contiguous(), ex.w2_gs[0].reshape(()).clone()),
    )


def swizzled_scale_bytes(lin: NVFP4Linear) -> torch.Tensor:
    """The 128x4-swizzled E4M3 scale bytes of ``lin`` as the block op reads them: uint8 [N, K/16] (N % 128 and
    K % 64 == 0, so the swizzled block has no padding), made by ``layouts.swizzle_block_scales``."""
    from flint_moe.layouts.swizzle import swizzle_block_scales

    n, k = lin.out_features, lin.in_features
    sw = swizzle_block_scales(lin.scale_bytes()[None].contiguous())[0]
    if sw.numel() != n * (k // 16):
        raise ValueError(f"shared linear [{n}, {k}]: needs N % 128 == 0 and K % 64 == 0 (swizzle without padding)")
    return sw.reshape(n, k // 16).contiguous()


def _block_weights(case, dev):
    """(routed logical, routed stored, notes, ln_weight, shared_w13, shared_w2, swizzled scale bytes w13, w2)."""
    from flint_moe.conformance.inputs.profiles import _nvfp4_weights

    s, _eps = block_shape(case.shape)
    g = _gen(dev, f"{case.path}/{case.shape}/{_weight_profile(case.profile)}/{case.seed}")
    logical, stored, notes = _nvfp4_weights(case, g, dev)
    si, h = s.shared_intermediate, case.H
    if case.profile == "modelopt":
        w13, w2 = _shared_modelopt(h, si, g, dev)
    else:
        w13 = _shared_linear(2 * si, h, case.profile, g, dev)
        w2 = _shared_linear(h, si, case.profile, g, dev)
    ln = (1.0 + 0.25 * torch.randn(h, generator=g, device=dev)).to(torch.bfloat16)
    return logical, stored, notes, ln, w13, w2, swizzled_scale_bytes(w13), swizzled_scale_bytes(w2)


def _weight_profile(profile: str) -> str:
    from flint_moe.conformance.inputs.profiles import _ROUTER_PROFILES

    return "default" if profile in _ROUTER_PROFILES else profile


def build_block_inputs(case, device: torch.device) -> BlockInputs:
    """:class:`BlockInputs` of a block case on ``device``: deterministic from the case id (weights from the
    weight-relevant part only: one cached entry). ``residual`` carries the case's token profile
    (``profiles._tokens``); ``attn_out`` is N(0, 1/16) in bf16, zero on the all-subnormal rows of
    ``subnormal_tokens`` (their sum of squares underflows to 0 and ``eps`` alone sets the scale).
    Raises ValueError for a shape :func:`block_shape` refuses."""
    from flint_moe.conformance.inputs.profiles import _tokens
    from flint_moe.layouts.ll_weights import LLMoEWeights

    s, eps = block_shape(case.shape)
    key = (case.path, case.shape, _weight_profile(case.profile), case.seed, str(device))
    if key not in _cache:
        _cache.clear()  # one entry: real layers are large
        _cache[key] = _block_weights(case, device)
    logical, stored, notes, ln, w13, w2, sf13, sf2 = _cache[key]
    residual, router, _unused, rnotes = _tokens(case, _gen(device, case.id), device)
    attn = torch.randn(case.M, case.H, generator=_gen(device, case.id + "/attn_out"), device=device) * 0.25
    for r in rnotes.get("subnormal_rows", []):
        attn[r] = 0.0
    attn = attn.to(torch.bfloat16)
    ll = LLMoEWeights(router, stored, w13.codes, sf13, w13.global_scale, w2.codes, sf2, w2.global_scale)
    return BlockInputs(
        attn, router, residual, logical, stored, {"top_k": case.k, "shared_intermediate": s.shared_intermediate,
                                                  "eps": eps, **notes, **rnotes},
        ln_weight=ln, eps=eps, shared_w13=w13, shared_w2=w2, ll=ll,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------------
# gpu profile cases
# ------------------------------------------------------------------------------------------------------

#: (M, data profile) of the block shapes on the gpu profile beside DeepSeek-V3's every M in 1..8 on gaussian data.
#: The weight profiles (a new layer each) sit on the smallest layer, Ling-mini-2.0, and one on GLM-4.5; the
#: token profiles (the same layer) on the large ones, so the block adds few large weight builds to the profile.
_GPU_SPREAD = {
    "deepseek-v3": ((3, "heavy_tailed"), (5, "tied_logits")),
    "kimi-k2": ((1, "gaussian"), (8, "gaussian"), (2, "skewed_routing"), (4, "subnormal_tokens"), (6, "tiny_sigmoids")),
    "glm-4.5": ((1, "gaussian"), (8, "gaussian"), (5, "global_scales")),
    "ling-mini-2.0": ((1, "gaussian"), (8, "gaussian"), (2, "asymmetric"), (3, "e4m3_scales"), (4, "zero_blocks"),
                      (6, "poisoned_padding"), (7, "modelopt")),
}  # fmt: skip
#: ``ll_module`` on the gpu profile: both ends of the token range and skewed routing on Ling-mini-2.0.
_GPU_MODULE = tuple(("ling-mini-2.0", m, p) for m, p in ((1, "gaussian"), (8, "gaussian"), (4, "skewed_routing")))


def gpu_block_specs() -> list[tuple[str, str, int, str]]:
    """The block's gpu-profile cases as ``(path, shape, M, profile)``: ``ll_block`` on :data:`GPU_BLOCK_SHAPES`
    (every M in 1..8 on DeepSeek-V3, a spread of (M, data profile) on the others) and ``ll_module``
    (:data:`_GPU_MODULE`); ``cases._gpu_matrix`` makes them Cases."""
    specs = [("ll_block", "deepseek-v3", m, "gaussian") for m in range(1, 9)]
    for name in GPU_BLOCK_SHAPES:
        specs += [("ll_block", name, m, p) for m, p in _GPU_SPREAD[name]]
    specs += [("ll_module", name, m, p) for name, m, p in _GPU_MODULE]
    return specs
