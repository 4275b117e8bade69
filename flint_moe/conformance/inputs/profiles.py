"""Data profiles of the conformance matrix: deterministic generators of tokens, router weights, shared output
and expert weights for a ``Case`` (shared/notes/field-cases.md), delivered as :class:`CaseInputs`.

Token / router profiles (both paths): ``gaussian``; ``heavy_tailed`` (log-normal-scaled tokens plus outlier
hidden channels x64); ``tied_logits`` (router rows that are power-of-two multiples of one vector, so equal
levels give bitwise-equal logits, with a tie group straddling the k-th place); ``skewed_routing`` (expert 0
wins every token, the upper experts never do); ``tiny_sigmoids`` (every logit in about [-85, -30]);
``subnormal_tokens`` (bf16 subnormal activations: whole token rows of them, and a quarter of the other rows'
channels).
Weight profiles: NVFP4 codes and E4M3 scales are synthesised directly (no bf16 stack; DeepSeek-V3 sized
layers are cheap): ``global_scales`` (per-expert global scales 2^-20..2^4), ``e4m3_scales`` (every finite
scale byte incl. subnormals and 448), ``zero_blocks`` (zero codes / zero scales / a zero row),
``poisoned_padding`` (every padding byte of the swizzled scales set to 0x7F / 0xFF / 0x7E=448),
``asymmetric`` (gate strongly negative, up identity-like), ``modelopt`` (bf16 experts quantized with the
ModelOpt recipe, ``reference.quantize_experts``), ``modelopt_quantizer`` (the same quantized by nvidia-modelopt
itself). BF16 weights are random bf16 then ``to_trtllm_bf16``. ``flashinfer_layout`` (both formats): the stored
weights made by FlashInfer's own preparation functions instead of ``flint_moe.layouts`` (cases.ORACLE_PROFILES).
A case's ``route`` (``routing.py``) then steers the tokens and router weights so that the routing follows it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from flint_moe.layouts import FlintMoEWeights, pad_intermediate_bf16, to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

__all__ = ["POISON_BYTES", "CaseInputs", "build_inputs", "weight_key", "scale_padding_mask"]

FP8 = torch.float8_e4m3fn
#: Bytes written into the scale padding by ``poisoned_padding`` (E4M3 NaN 0x7F / 0xFF and 448 = 0x7E).
POISON_BYTES = (0x7F, 0xFF, 0x7E)
_ROUTER_PROFILES = ("gaussian", "heavy_tailed", "tied_logits", "skewed_routing", "tiny_sigmoids", "subnormal_tokens")

@dataclass
class CaseInputs:
    """Everything a path and the golden model need for one case (all on one device).

    Fields:
        x: bf16 [M, H] tokens. router_weight: bf16 [E, H]. shared: bf16 [M, H] shared-expert output.
        logical: the golden model's weights in checkpoint layout, logical (unpadded) I:
            ``reference.weights.NVFP4Experts`` (nvfp4_decode) or ``BF16Experts`` (bf16_decode).
        stored: what the kernel reads: ``layouts.FlintMoEWeights`` (nvfp4_decode) or
            ``(g1, g2, row_maps)`` of ``layouts.to_trtllm_bf16`` / ``trtllm_bf16_row_maps`` (bf16_decode).
        notes: profile facts for tests and reports (e.g. ``poison_bytes``, ``tie_levels``).
    """

    x: torch.Tensor
    router_weight: torch.Tensor
    shared: torch.Tensor
    logical: object
    stored: object
    notes: dict


_cache: dict = {}


def weight_key(case) -> tuple:
    """Key of the weights a case uses: cases with equal keys share weights."""
    wp = "default" if case.profile in _ROUTER_PROFILES else case.profile
    return (case.path, case.shape, wp, case.seed)


def _gen(device: torch.device, text: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(zlib.crc32(text.encode()))


def build_inputs(case, device: torch.device):
    """``CaseInputs`` of ``case`` (see ``cases.make_inputs``)."""
    key = (*weight_key(case), str(device))
    if key not in _cache:
        _cache.clear()  # one entry: real layers are large
        g = _gen(device, "/".join(map(str, key[:4])))
        build = _nvfp4_weights if case.path.startswith("nvfp4_") else _bf16_weights
        _cache[key] = build(case, g, device)
    logical, stored, notes = _cache[key]
    x, router, shared, rnotes = _tokens(case, _gen(device, case.id), device)
    return CaseInputs(x, router, shared, logical, stored, {"top_k": case.k, **notes, **rnotes})


# ------------------------------------------------------------------------------------------------------
# tokens, router, shared output
# ------------------------------------------------------------------------------------------------------


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16)


def _tokens(case, g: torch.Generator, dev: torch.device):
    M, H, E, k = case.M, case.H, case.E, case.k
    f32 = dict(generator=g, device=dev, dtype=torch.float32)
    x = torch.randn(M, H, **f32)
    router = torch.randn(E, H, **f32) * (2.0 / H**0.5)
    shared = torch.randn(M, H, **f32) * 0.5
    notes: dict = {}
    p = case.profile
    if p == "heavy_tailed":
        x = x * torch.exp(torch.randn(M, H, **f32))
        n_out = max(1, H // 64)
        chans = torch.randperm(H, generator=g, device=dev)[:n_out]
        x[:, chans] *= 64.0
        notes["outlier_channels"] = sorted(chans.tolist())
    elif p == "tied_logits":
        # logit_e = level_e * (x_T . u_T) with u_T >= 0, x_T > 0 on the tie channels T, router zero elsewhere:
        # power-of-two levels scale every product and partial sum exactly, so equal levels tie bitwise.
        t = H // 2
        x[:, :t] = x[:, :t].abs() + 0.25
        u = _bf16(torch.rand(t, **f32) / t).float()
        top = k // 2
        levels = [2.0] * top + [1.0] * (k - top + 2)
        rest = E - len(levels)
        levels += [-(2.0 ** -(j // 2)) for j in range(rest)]  # pairs of negative ties
        perm = torch.randperm(E, generator=g, device=dev)
        lv = torch.empty(E, device=dev)
        lv[perm] = torch.tensor(levels[:E], device=dev)
        router = torch.zeros(E, H, device=dev)
        router[:, :t] = lv[:, None] * u[None, :]
        notes["tie_levels"] = lv.tolist()
    elif p == "skewed_routing":
        s = max(1, H // 8)
        x[:, :s] = x[:, :s].abs() + 1.0
        router = router * 0.1
        router[0, :s] = 8.0 / s
        never = list(range(max(k, E // 2), E))
        router[never, :s] = -8.0 / s
        notes["never_routed"] = never
    elif p == "tiny_sigmoids":
        # x in [0.5, ~1.7], router rows -c_e / H: every logit = -c_e * mean(x) in about [-85, -32].
        x = 0.5 + x.abs() * 0.25
        c = 64.0 + torch.linspace(0, 46, E, device=dev)
        c = c[torch.randperm(E, generator=g, device=dev)]
        router = (-c / H)[:, None].expand(E, H).clone()
    elif p == "subnormal_tokens":
        # even token rows: every channel a bf16 subnormal (+-m * 2^-133, m in 1..127) or a signed zero; odd
        # rows: gaussian with a quarter of the channels replaced the same way. Every long reduction then sums
        # products of subnormal activations (fp32 subnormal or tiny partial sums, logits that round to bf16
        # subnormals and tie).
        m = torch.randint(0, 128, (M, H), generator=g, device=dev).float()
        sign = torch.where(torch.rand(M, H, **f32) < 0.5, -1.0, 1.0)
        sub = sign * m * 2.0**-133
        rows = torch.arange(M, device=dev)[:, None] % 2 == 0
        x = torch.where(rows | (torch.rand(M, H, **f32) < 0.25), sub, x)
        notes["subnormal_rows"] = list(range(0, M, 2))
    if getattr(case, "route", None) is not None:  # forced routing on top of the profile's tokens (routing.py)
        from flint_moe.conformance.inputs.routing import apply_route

        x, router, rnotes = apply_route(case.route, x, router, k)
        notes.update(rnotes)
    return _bf16(x), _bf16(router), _bf16(shared), notes


# ------------------------------------------------------------------------------------------------------
# NVFP4 weights (ModelOpt checkpoint layout, synthesised directly) -> FlintMoEWeights
# ------------------------------------------------------------------------------------------------------


def _scales(shape, g, dev, lo=50, hi=63) -> torch.Tensor:
    """E4M3 bytes of both signs with magnitude byte in [lo, hi] (0.5 .. 1.875 by default)."""
    b = torch.randint(lo, hi + 1, shape, generator=g, device=dev)
    sign = torch.randint(0, 2, shape, generator=g, device=dev) << 7
    return (b | sign).to(torch.uint8)


def _nvfp4_weights(case, g, dev):
    E, H, I = case.E, case.H, case.I  # noqa: E741
    p = case.profile
    notes: dict = {}
    if p == "modelopt":
        from flint_moe.reference.quantize import quantize_experts

        gate = torch.randn(E, I, H, generator=g, device=dev) * 0.05 + 0.01
        up = torch.randn(E, I, H, generator=g, device=dev) * 0.25 - 0.03
        w2f = torch.randn(E, H, I, generator=g, device=dev) * 0.05
        ex = quantize_experts(_bf16(torch.cat([gate, up], 1)), _bf16(w2f))
        c13, s13, gs1, c2, s2, gs2 = ex.w13, ex.w13_scale, ex.w13_gs, ex.w2, ex.w2_scale, ex.w2_gs
    elif p == "modelopt_quantizer":
        gate = torch.randn(E, I, H, generator=g, device=dev) * 0.05 + 0.01
        up = torch.randn(E, I, H, generator=g, device=dev) * 0.25 - 0.03
        w2f = torch.randn(E, H, I, generator=g, device=dev) * 0.05
        c13, s13, gs1, c2, s2, gs2 = _modelopt_quantize(_bf16(torch.cat([gate, up], 1)), _bf16(w2f))
        notes["quantizer"] = "nvidia-modelopt NVFP4QTensor.quantize"
    else:
        c13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, device=dev, dtype=torch.uint8)
        c2 = torch.randint(0, 256, (E, H, I // 2), generator=g, device=dev, dtype=torch.uint8)
        s13 = _scales((E, 2 * I, H // 16), g, dev)
        s2 = _scales((E, H, I // 16), g, dev)
        gs1 = torch.rand(E, generator=g, device=dev) * 2.0**-6 + 2.0**-8
        gs2 = torch.rand(E, generator=g, device=dev) * 2.0**-6 + 2.0**-8
        if p == "global_scales":
            gs1 = torch.exp2(torch.rand(E, generator=g, device=dev) * 24 - 20)
            gs2 = torch.exp2(torch.rand(E, generator=g, device=dev) * 24 - 20)
            gs1[0], gs2[-1] = 2.0**-20, 2.0**4
        elif p == "e4m3_scales":
            s13, s2 = (_all_e4m3(s.shape, g, dev) for s in (s13, s2))
            gs1 = gs1 * 2.0**-8
            gs2 = gs2 * 2.0**-8
        elif p == "zero_blocks":
            c13, s13 = _zero_blocks(c13, s13, g, dev)
            c2, s2 = _zero_blocks(c2, s2, g, dev)
        elif p == "asymmetric":
            c13, s13 = _asymmetric(c13, s13, E, I, H, dev)
    if p == "flashinfer_layout":
        stored = _flashinfer_nvfp4(c13, s13, gs1, c2, s2, gs2, case)
        notes["layout"] = "flashinfer.fused_moe.prepare (interleave_cute_dsl_moe_weights, _swizzle_cutile_fp4_scales)"
    else:
        stored = FlintMoEWeights.from_modelopt(
            c13, s13.view(FP8), gs1, c2, s2.view(FP8), gs2, pad_intermediate_to=case.pad_to
        )
    if p == "poisoned_padding":
        for name in ("w1_sf_swizzled", "w2_sf_swizzled"):
            t = getattr(stored, name).view(torch.uint8)
            mask = scale_padding_mask(stored, name)
            poison = torch.tensor(POISON_BYTES, dtype=torch.uint8, device=dev)
            fill = poison[torch.arange(t.numel(), device=dev) % len(POISON_BYTES)].view(t.shape)
            t[mask] = fill[mask]
        notes["poison_bytes"] = list(POISON_BYTES)
    logical = NVFP4Experts(c13, s13.view(FP8), gs1.clone(), c2, s2.view(FP8), gs2.clone())
    return logical, stored, notes


def _all_e4m3(shape, g, dev) -> torch.Tensor:
    """Every finite E4M3 byte (NaN 0x7F / 0xFF excluded), with subnormals (0x01..0x07) and 448 (0x7E)
    forced into the first blocks of every row."""
    b = torch.randint(0, 254, shape, generator=g, device=dev)
    b = torch.where(b >= 0x7F, b + 1, b)  # skip 0x7F; 0xFF is out of range
    b[..., 0] = 0x7E
    if shape[-1] > 1:
        b[..., 1] = torch.randint(1, 8, shape[:-1], generator=g, device=dev) | 0x80 * (
            torch.arange(shape[-2], device=dev) % 2
        )
    return b.to(torch.uint8)


def _zero_blocks(codes, scales, g, dev):
    """~20% of 16-element blocks get zero codes (+0 / -0 nibbles), ~10% zero scales (+0 / -0 bytes), and row 0
    of every expert is all zero codes."""
    codes, scales = codes.clone(), scales.clone()
    blocks = codes.view(*codes.shape[:-1], -1, 8)
    zc = torch.rand(blocks.shape[:-1], generator=g, device=dev) < 0.2
    neg = torch.randint(0, 2, blocks.shape[:-1], generator=g, device=dev, dtype=torch.uint8) * 0x88
    blocks[zc] = neg[zc][:, None].expand(-1, 8)
    zs = torch.rand(scales.shape, generator=g, device=dev) < 0.1
    scales[zs] = (torch.randint(0, 2, scales.shape, generator=g, device=dev, dtype=torch.uint8) * 0x80)[zs]
    codes[:, 0] = 0
    return codes, scales


def _asymmetric(c13, s13, E, I, H, dev):  # noqa: E741
    """Gate: every code negative (sign bit in both nibbles), scales 2.0; up: identity-like (row i holds one
    6.0 at column i mod H, scale 1.0)."""
    c13, s13 = c13.clone(), s13.clone()
    c13[:, :I] |= 0x88
    s13[:, :I] = 0x40  # E4M3 2.0
    up = torch.zeros(E, I, H, dtype=torch.uint8, device=dev)
    up[:, torch.arange(I, device=dev), torch.arange(I, device=dev) % H] = 0x7  # E2M1 6.0
    c13[:, I:] = up[..., 0::2] | (up[..., 1::2] << 4)
    s13[:, I:] = 0x38  # E4M3 1.0
    return c13, s13


def scale_padding_mask(weights: FlintMoEWeights, name: str) -> torch.Tensor:
    """bool mask of ``weights.<name>`` (``w1_sf_swizzled`` / ``w2_sf_swizzled``) that is padding: the bytes a
    one-expert conversion of all-0x38 scales leaves at 0 (rows to 128, scale columns to 4, intermediate
    padding), broadcast over the experts."""
    H, Ip, I = weights.hidden_size, weights.intermediate_size, weights.valid_intermediate  # noqa: E741
    dev = weights.w1.device
    pad = Ip if Ip != I else None
    one = torch.full((1, 2 * I, H // 16), 0x38, dtype=torch.uint8, device=dev).view(FP8)
    one2 = torch.full((1, H, I // 16), 0x38, dtype=torch.uint8, device=dev).view(FP8)
    c13 = torch.zeros(1, 2 * I, H // 2, dtype=torch.uint8, device=dev)
    c2 = torch.zeros(1, H, I // 2, dtype=torch.uint8, device=dev)
    gs = torch.ones(1, device=dev)
    probe = FlintMoEWeights.from_modelopt(c13, one, gs, c2, one2, gs, pad_intermediate_to=pad)
    mask = getattr(probe, name).view(torch.uint8) == 0
    return mask.expand_as(getattr(weights, name))


# ------------------------------------------------------------------------------------------------------
# BF16 weights -> TRT-LLM BlockMajorK
# ------------------------------------------------------------------------------------------------------


def _bf16_weights(case, g, dev):
    """BF16 expert weights of ``case`` drawn in fp32 a few experts at a time and rounded to bf16 at once (a
    real layer's fp32 draws would not fit the GPU: Kimi-K2 is 67 GB in fp32)."""
    E, H, I = case.E, case.H, case.I  # noqa: E741
    p = case.profile
    f32 = dict(generator=g, device=dev, dtype=torch.float32)
    notes: dict = {}
    mag = None
    if p == "global_scales":
        mag = torch.exp2(torch.rand(E, **f32) * 24 - 20)
        mag[0], mag[-1] = 2.0**-20, 2.0**4
    w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=dev)
    w2b = torch.empty(E, H, I, dtype=torch.bfloat16, device=dev)
    step = max(1, (1 << 28) // max(3 * I * H, 1))
    for e0 in range(0, E, step):
        n = min(E, e0 + step) - e0
        gate = torch.randn(n, I, H, **f32) * 0.05 + 0.01
        up = torch.randn(n, I, H, **f32) * 0.25 - 0.03
        w2 = torch.randn(n, H, I, **f32) * 0.05
        if mag is not None:
            m = mag[e0 : e0 + n, None, None]
            gate, up, w2 = gate * m, up * m, w2 * m
        elif p == "zero_blocks":
            for t in (gate, up, w2):
                blocks = t.view(*t.shape[:-1], -1, 64)
                blocks[torch.rand(blocks.shape[:-1], **f32) < 0.2] = 0.0
            gate[:, 0] = 0.0
        elif p == "asymmetric":
            gate = -gate.abs() * 4.0 - 0.5
            up = torch.zeros(n, I, H, device=dev)
            up[:, torch.arange(I, device=dev), torch.arange(I, device=dev) % H] = 1.0
        w13[e0 : e0 + n, :I] = _bf16(gate)
        w13[e0 : e0 + n, I:] = _bf16(up)
        w2b[e0 : e0 + n] = _bf16(w2)
        del gate, up, w2
    logical = BF16Experts(w13, w2b)
    if case.pad_to is not None:
        w13p, w2p, ip = pad_intermediate_bf16(w13, w2b, case.pad_to)
    else:
        w13p, w2p, ip = w13, w2b, I
    if p == "flashinfer_layout":
        g1, g2 = _flashinfer_bf16(w13p, w2p, case)
        notes["layout"] = "flashinfer.fused_moe.prepare.prepare_trtllm_bf16_weights"
    else:
        g1, g2 = to_trtllm_bf16(w13p, w2p)
    return logical, (g1, g2, trtllm_bf16_row_maps(H, ip, device=dev)), notes


# ------------------------------------------------------------------------------------------------------
# inputs made by the field's own tools (cases.ORACLE_PROFILES; the ``oracle`` extra)
# ------------------------------------------------------------------------------------------------------


def _w31(t: torch.Tensor) -> torch.Tensor:
    """[gate; up] rows -> [up; gate] (FlashInfer's w3_w1 order) along dim 1."""
    half = t.shape[1] // 2
    return torch.cat([t[:, half:], t[:, :half]], dim=1)


def _modelopt_quantize(w13: torch.Tensor, w2: torch.Tensor):
    """bf16 w13 [E, 2I, H] ([gate; up]), w2 [E, H, I] -> ModelOpt checkpoint tensors (codes uint8, block scales
    uint8 E4M3 bytes, fp32 [E] global scales), quantized by nvidia-modelopt's ``NVFP4QTensor.quantize`` with
    block 16; gate and up of an expert quantized together (one global scale, as fused exports have)."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    def one(w: torch.Tensor):
        q, s, g2 = NVFP4QTensor.quantize(w.clone(), 16)
        return q._quantized_data.view(torch.uint8), s.view(torch.uint8), g2.float().reshape(())

    parts13 = [one(w13[e]) for e in range(w13.shape[0])]
    parts2 = [one(w2[e]) for e in range(w2.shape[0])]
    c13, s13, gs1 = (torch.stack([p[i] for p in parts13]) for i in range(3))
    c2, s2, gs2 = (torch.stack([p[i] for p in parts2]) for i in range(3))
    return c13, s13, gs1, c2, s2, gs2


def _flashinfer_nvfp4(c13, s13, gs1, c2, s2, gs2, case) -> FlintMoEWeights:
    """FlintMoEWeights whose stored tensors FlashInfer's own CuTe-DSL W4A16 preparation made (64-row
    interleave of [up; gate], 128x4 scale swizzle); the global scales are the checkpoint's."""
    from flashinfer.fused_moe.prepare import _swizzle_cutile_fp4_scales, interleave_cute_dsl_moe_weights

    from flint_moe.layouts.swizzle import swizzled_scale_shape

    if case.pad_to is not None:
        raise ValueError(f"{case.id}: flashinfer_layout needs an unpadded shape (FlashInfer does not pad)")
    E, two_i, h2 = c13.shape
    H, I = 2 * h2, two_i // 2  # noqa: E741
    w1, s1 = interleave_cute_dsl_moe_weights(_w31(c13), _w31(s13.view(FP8)), swap_ab=False)
    sw1 = _swizzle_cutile_fp4_scales(s1.view(torch.uint8), scale_block_size=16)
    sw2 = _swizzle_cutile_fp4_scales(s2.view(torch.uint8).contiguous(), scale_block_size=16)
    return FlintMoEWeights(
        w1.contiguous(), sw1.reshape(E, *swizzled_scale_shape(two_i, H // 16)).view(FP8), gs1.float().clone(),
        c2.clone(), sw2.reshape(E, *swizzled_scale_shape(H, I // 16)).view(FP8), gs2.float().clone(), I,
    )  # fmt: skip


def _flashinfer_bf16(w13: torch.Tensor, w2: torch.Tensor, case):
    """(g1, g2) of the TRT-LLM BlockMajorK BF16 layout made by FlashInfer's ``prepare_trtllm_bf16_weights``."""
    from flashinfer.fused_moe.prepare import prepare_trtllm_bf16_weights

    if case.pad_to is not None:
        raise ValueError(f"{case.id}: flashinfer_layout needs an unpadded shape")
    E, two_i, H = w13.shape
    I = two_i // 2  # noqa: E741
    ref = prepare_trtllm_bf16_weights(_w31(w13), w2, num_local_experts=E, hidden_size=H, intermediate_size=I,
                                      permute_cache={})  # fmt: skip
    return (
        ref["gemm1_weights"].reshape(E, H // 64, 2 * I, 64).contiguous(),
        ref["gemm2_weights"].reshape(E, I // 64, H, 64).contiguous(),
    )
