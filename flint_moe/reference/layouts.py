"""Independent decoders: stored kernel layouts -> logical checkpoint tensors ([gate; up] rows).

Written from the index formulas of shared/notes/layouts.md (docs/layouts.md), NOT from the production
converters in ``flint_moe.layouts`` (never imported here): every decoder computes, for each *logical*
element, where the layout stores it (a forward map from logical to physical position) and gathers it.
Padding (swizzle rows/columns, per-half intermediate padding, MXFP8 hidden padding) is never read, so any
bytes there (0x7F, 0xFF, 0x7E, ...) decode to the same logical tensors.

Logical conventions: w13 rows [gate; up] (gate row g = row g, up row u = row I + u); NVFP4 codes two per byte
(low nibble = even element); scales keep their stored dtype (uint8 or float8_e4m3fn bytes).
"""

from __future__ import annotations

import torch

from flint_moe.reference._checks import check_tensor
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

__all__ = [
    "swizzle_offsets",
    "unswizzle_scales",
    "shuffle_dst_of_src",
    "cutedsl_w13_phys_rows",
    "trtllm_gated_w13_phys_rows",
    "trtllm_swapped_w13_phys_rows",
    "decode_cutedsl_w4a16",
    "experts_from_cutedsl",
    "decode_trtllm_bf16",
    "decode_trtllm_nvfp4",
    "decode_trtllm_fp8_per_tensor",
    "decode_trtllm_deepseek_fp8",
    "decode_trtllm_mxfp8",
    "decode_routed_nvfp4",
]


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


# ---------------------------------------------------------------------------------------------------------
# 128x4 scale swizzle


def swizzle_offsets(rows: int, cols: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Byte offset inside one expert's swizzled block of every logical scale (r, c): int64 [rows, cols].

    ``(r//128)*(Kp/4)*512 + (c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4`` with Kp = roundup(cols, 4).
    """
    kp = _ceil(cols, 4)
    r = torch.arange(rows, dtype=torch.long, device=device)[:, None]
    c = torch.arange(cols, dtype=torch.long, device=device)[None, :]
    return (r // 128) * (kp // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def unswizzle_scales(stored: torch.Tensor, rows: int, cols: int, *, name: str = "scale") -> torch.Tensor:
    """Logical scales [E, rows, cols] from 128x4-swizzled storage.

    ``stored`` is either the 6-D MMA view (32, 4, Mp/128, 4, Kp/4, E) of FlashInfer's
    ``convert_sf_to_mma_layout`` (read through its logical indices ``[r%32, (r%128)//32, r//128, c%4, c//4, e]``),
    or the swizzled bytes as [E, Mp, Kp] / [E, Mp*Kp] (read through the byte-offset formula). Padding is not read.
    Raises ValueError naming ``name`` if the storage is too small for (rows, cols).
    """
    mp, kp = _ceil(rows, 128), _ceil(cols, 4)
    if stored.dim() == 6:
        o, i, mt, ik, kt, e = stored.shape
        if (o, i, ik) != (32, 4, 4) or mt * 128 != mp or kt * 4 != kp:
            raise ValueError(
                f"{name}: MMA view shape {tuple(stored.shape)} does not hold [{rows}, {cols}] scales "
                f"(expected (32, 4, {mp // 128}, 4, {kp // 4}, E))"
            )
        r = torch.arange(rows, device=stored.device)[None, :, None]
        c = torch.arange(cols, device=stored.device)[None, None, :]
        x = torch.arange(e, device=stored.device)[:, None, None]
        return stored[r % 32, (r % 128) // 32, r // 128, c % 4, c // 4, x]
    check_tensor(name, stored, ndim=stored.dim())
    if stored.dim() not in (2, 3):
        raise ValueError(
            f"{name}: expected [E, Mp, Kp], [E, Mp*Kp] or a 6-D MMA view, got {tuple(stored.shape)}"
        )
    e = stored.shape[0]
    flat = stored.reshape(e, -1)
    if flat.shape[1] != mp * kp:
        raise ValueError(
            f"{name}: {flat.shape[1]} bytes per expert, expected {mp}*{kp} for [{rows}, {cols}] scales"
        )
    off = swizzle_offsets(rows, cols, stored.device).reshape(-1)
    return flat[:, off].reshape(e, rows, cols)


# ---------------------------------------------------------------------------------------------------------
# row maps, logical -> physical (forward formulas)


def shuffle_dst_of_src(m: int, epilogue_tile_m: int, device=None) -> torch.Tensor:
    """Where TRT-LLM's ``shuffleMatrixA`` puts input row o (int64 [m]), from its srcToDst table:
    block B = 32 (epilogue_tile_m % 128 == 0) else 16; ``dst = (o//B)*B + (o % (B/8))*8 + (o % B)//(B/8)``."""
    b = 32 if epilogue_tile_m % 128 == 0 else 16
    if m % b:
        raise ValueError(f"rows: {m} must be a multiple of the shuffle block {b}")
    o = torch.arange(m, dtype=torch.long, device=device)
    q = b // 8
    return (o // b) * b + (o % q) * 8 + (o % b) // q


def _logical_rows(inter: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(half-row index, is_up) of logical [gate; up] rows 0..2I-1."""
    l = torch.arange(2 * inter, dtype=torch.long, device=device)
    return l % inter, l >= inter


def cutedsl_w13_phys_rows(inter: int, padded: int, group: int = 64, device=None) -> torch.Tensor:
    """Physical row (of 2*padded) of each logical [gate; up] row: blocks of 2*group rows, up first.
    Up row u -> ``(u//group)*2*group + u%group``; gate row g -> ``(g//group)*2*group + group + g%group``."""
    j, up = _logical_rows(inter, device)
    return (j // group) * 2 * group + torch.where(up, 0, group) + j % group


def trtllm_gated_w13_phys_rows(
    inter: int, padded: int, epilogue_tile_m: int = 128, device=None
) -> torch.Tensor:
    """[up; gate] (halves of ``padded`` rows) -> gated reorder (up u -> 2u, gate g -> 2g+1) -> shuffle."""
    j, up = _logical_rows(inter, device)
    reordered = torch.where(up, 2 * j, 2 * j + 1)
    return shuffle_dst_of_src(2 * padded, epilogue_tile_m, device)[reordered]


def trtllm_swapped_w13_phys_rows(
    inter: int, padded: int, epilogue_tile_m: int = 64, device=None
) -> torch.Tensor:
    """[up; gate] halves (up u -> u, gate g -> padded + g), then shuffle (DeepSeek-FP8 layout)."""
    j, up = _logical_rows(inter, device)
    w31 = torch.where(up, j, padded + j)
    return shuffle_dst_of_src(2 * padded, epilogue_tile_m, device)[w31]


def _unblock(g: torch.Tensor, name: str) -> torch.Tensor:
    """BlockMajorK [E, K/b, M, b] -> row-major [E, M, K]: ``W[e, m, k] = g[e, k // b, m, k % b]``."""
    check_tensor(name, g, ndim=4)
    e, kb, m, b = g.shape
    return g.permute(0, 2, 1, 3).reshape(e, m, kb * b)


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _resolve(stored_i: int, intermediate: int | None, name: str) -> int:
    inter = stored_i if intermediate is None else intermediate
    if not 0 < inter <= stored_i:
        raise ValueError(f"{name}: logical intermediate {inter} must be in (0, {stored_i}] (stored size)")
    return inter


# ---------------------------------------------------------------------------------------------------------
# decoders


def decode_cutedsl_w4a16(
    w1: torch.Tensor,
    w1_sf: torch.Tensor,
    w1_alpha: torch.Tensor,
    w2: torch.Tensor,
    w2_sf: torch.Tensor,
    w2_alpha: torch.Tensor,
    *,
    intermediate: int | None = None,
) -> NVFP4Experts:
    """FlashInfer CuTe-DSL W4A16 layout -> logical ``NVFP4Experts``.

    Args:
        w1: uint8 [E, 2Ip, H/2] ([up; gate] interleaved by 64 rows); w1_sf: its scales as the 6-D MMA view or
            swizzled [E, roundup(2Ip,128), roundup(H/16,4)]; w1_alpha fp32 [E]; w2 uint8 [E, H, Ip/2]; w2_sf
            (view or swizzled [E, roundup(H,128), roundup(Ip/16,4)]); w2_alpha fp32 [E].
        intermediate: logical I (<= Ip) when the layout was padded; default Ip.
    Returns:
        NVFP4Experts with w13 [E, 2I, H/2], scales in w1_sf's dtype, w13_gs = w1_alpha, w2_gs = w2_alpha.
    """
    check_tensor("w1", w1, dtype=torch.uint8, ndim=3)
    e, two_ip, h2 = w1.shape
    ip, hidden = two_ip // 2, 2 * h2
    check_tensor("w2", w2, dtype=torch.uint8, shape=(e, hidden, ip // 2))
    inter = _resolve(ip, intermediate, "intermediate")
    if ip % 64:
        raise ValueError(f"w1: stored intermediate {ip} must be a multiple of 64 (64-row interleave)")
    phys = cutedsl_w13_phys_rows(inter, ip, 64, w1.device)
    s1 = unswizzle_scales(w1_sf, two_ip, hidden // 16, name="w1_sf")
    s2 = unswizzle_scales(w2_sf, hidden, ip // 16, name="w2_sf")
    return NVFP4Experts(
        w13=w1[:, phys].contiguous(),
        w13_scale=s1[:, phys].contiguous(),
        w13_gs=w1_alpha.clone(),
        w2=w2[:, :, : inter // 2].contiguous(),
        w2_scale=s2[:, :, : inter // 16].contiguous(),
        w2_gs=w2_alpha.clone(),
    )


def experts_from_cutedsl(weights: object) -> NVFP4Experts:
    """``decode_cutedsl_w4a16`` of a FlintMoEWeights-like object (attributes w1, w1_sf, w1_alpha, w2, w2_sf,
    w2_alpha, optional valid_intermediate): the golden model's entry for weights held in the kernel layout."""
    try:
        args = [getattr(weights, n) for n in ("w1", "w1_sf", "w1_alpha", "w2", "w2_sf", "w2_alpha")]
    except AttributeError as exc:
        raise TypeError(f"weights: not a FlintMoEWeights-like object ({exc})") from None
    return decode_cutedsl_w4a16(*args, intermediate=getattr(weights, "valid_intermediate", None))


def decode_trtllm_bf16(g1: torch.Tensor, g2: torch.Tensor, *, intermediate: int | None = None) -> BF16Experts:
    """TRT-LLM BF16 BlockMajorK -> logical ``BF16Experts``.

    Args: g1 bf16 [E, H/64, 2Ip, 64] (gated reorder + shuffle(128) of [up; gate]); g2 bf16 [E, Ip/64, H, 64]
        (shuffle(128)); intermediate: logical I (<= Ip).
    Returns: BF16Experts(w13 [E, 2I, H] [gate; up], w2 [E, H, I]) (new tensors).
    """
    check_tensor("g1", g1, dtype=torch.bfloat16, ndim=4)
    check_tensor("g2", g2, dtype=torch.bfloat16, ndim=4)
    w13p, w2p = _unblock(g1, "g1"), _unblock(g2, "g2")
    e, two_ip, hidden = w13p.shape
    ip = two_ip // 2
    if tuple(w2p.shape) != (e, hidden, ip):
        raise ValueError(f"g2: holds {tuple(w2p.shape)} after unblocking, expected {(e, hidden, ip)}")
    inter = _resolve(ip, intermediate, "intermediate")
    p13 = trtllm_gated_w13_phys_rows(inter, ip, 128, g1.device)
    p2 = shuffle_dst_of_src(hidden, 128, g1.device)
    return BF16Experts(w13=w13p[:, p13].contiguous(), w2=w2p[:, p2, :inter].contiguous())


def decode_trtllm_nvfp4(
    g1: torch.Tensor,
    g1_scale: torch.Tensor,
    w13_gs: torch.Tensor,
    g2: torch.Tensor,
    g2_scale: torch.Tensor,
    w2_gs: torch.Tensor,
    *,
    intermediate: int | None = None,
) -> NVFP4Experts:
    """TRT-LLM-gen NVFP4 layout -> logical ``NVFP4Experts``.

    Args: g1 uint8 [E, 2Ip, H/2] (gated reorder + shuffle(128)); g1_scale [E, roundup(2Ip,128),
        roundup(H/16,4)] swizzled (or flat [E, n]) of the same rows; g2 uint8 [E, H, Ip/2] (shuffle(128));
        g2_scale swizzled [E, roundup(H,128), roundup(Ip/16,4)]; global scales fp32 [E].
    """
    check_tensor("g1", g1, dtype=torch.uint8, ndim=3)
    e, two_ip, h2 = g1.shape
    ip, hidden = two_ip // 2, 2 * h2
    check_tensor("g2", g2, dtype=torch.uint8, shape=(e, hidden, ip // 2))
    inter = _resolve(ip, intermediate, "intermediate")
    p13 = trtllm_gated_w13_phys_rows(inter, ip, 128, g1.device)
    p2 = shuffle_dst_of_src(hidden, 128, g1.device)
    s1 = unswizzle_scales(g1_scale, two_ip, hidden // 16, name="g1_scale")
    s2 = unswizzle_scales(g2_scale, hidden, ip // 16, name="g2_scale")
    return NVFP4Experts(
        w13=g1[:, p13].contiguous(), w13_scale=s1[:, p13].contiguous(), w13_gs=w13_gs.clone(),
        w2=g2[:, p2, : inter // 2].contiguous(), w2_scale=s2[:, p2, : inter // 16].contiguous(), w2_gs=w2_gs.clone(),
    )  # fmt: skip


def decode_trtllm_fp8_per_tensor(g1: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TRT-LLM per-tensor FP8 (gated reorder + shuffle(128) / shuffle(128)) -> (w13 [E, 2I, H] [gate; up],
    w2 [E, H, I]), float8_e4m3fn."""
    check_tensor("g1", g1, dtype=torch.float8_e4m3fn, ndim=3)
    e, two_i, hidden = g1.shape
    check_tensor("g2", g2, dtype=torch.float8_e4m3fn, shape=(e, hidden, two_i // 2))
    p13 = trtllm_gated_w13_phys_rows(two_i // 2, two_i // 2, 128, g1.device)
    p2 = shuffle_dst_of_src(hidden, 128, g1.device)
    return _u8(g1)[:, p13].view(g1.dtype), _u8(g2)[:, p2].view(g2.dtype)


def decode_trtllm_deepseek_fp8(
    g1: torch.Tensor, g1_scale: torch.Tensor, g2: torch.Tensor, g2_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRT-LLM DeepSeek-FP8 (shuffle(64) + BlockMajorK 128) -> (w13 [E, 2I, H], w13_scale fp32
    [E, 2I/128, H/128] ([gate; up] blocks), w2 [E, H, I], w2_scale [E, H/128, I/128])."""
    check_tensor("g1", g1, dtype=torch.float8_e4m3fn, ndim=4)
    check_tensor("g2", g2, dtype=torch.float8_e4m3fn, ndim=4)
    w13p, w2p = _unblock(_u8(g1), "g1"), _unblock(_u8(g2), "g2")
    e, two_i, hidden = w13p.shape
    inter = two_i // 2
    check_tensor("g1_scale", g1_scale, dtype=torch.float32, shape=(e, two_i // 128, hidden // 128))
    check_tensor("g2_scale", g2_scale, dtype=torch.float32, shape=(e, hidden // 128, inter // 128))
    p13 = trtllm_swapped_w13_phys_rows(inter, inter, 64, g1.device)
    p2 = shuffle_dst_of_src(hidden, 64, g1.device)
    blk = torch.arange(two_i // 128, device=g1.device)
    half = inter // 128
    scale_src = torch.where(blk < half, blk + half, blk - half)  # logical gate block g is stored at half + g
    return (
        w13p[:, p13].view(torch.float8_e4m3fn), g1_scale[:, scale_src].clone(),
        w2p[:, p2].view(torch.float8_e4m3fn), g2_scale.clone(),
    )  # fmt: skip


def decode_trtllm_mxfp8(
    g1: torch.Tensor,
    g1_scale: torch.Tensor,
    g2: torch.Tensor,
    g2_scale: torch.Tensor,
    *,
    hidden: int,
    intermediate: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRT-LLM MXFP8 (padded to Ip, Hp; gated reorder + shuffle(128); 128x4-swizzled UE8M0 scales) ->
    (w13 float8 [E, 2I, H], w13_scale uint8 [E, 2I, H/32], w2 [E, H, I], w2_scale uint8 [E, H, I/32])."""
    check_tensor("g1", g1, dtype=torch.float8_e4m3fn, ndim=3)
    e, two_ip, hp = g1.shape
    ip = two_ip // 2
    check_tensor("g2", g2, dtype=torch.float8_e4m3fn, shape=(e, hp, ip))
    if not (0 < hidden <= hp and 0 < intermediate <= ip):
        raise ValueError(f"hidden/intermediate: ({hidden}, {intermediate}) must fit the stored ({hp}, {ip})")
    p13 = trtllm_gated_w13_phys_rows(intermediate, ip, 128, g1.device)
    p2 = shuffle_dst_of_src(hp, 128, g1.device)[:hidden]
    s1 = unswizzle_scales(g1_scale, two_ip, hp // 32, name="g1_scale")
    s2 = unswizzle_scales(g2_scale, hp, ip // 32, name="g2_scale")
    return (
        _u8(g1)[:, p13, :hidden].view(torch.float8_e4m3fn), s1[:, p13, : hidden // 32].contiguous(),
        _u8(g2)[:, p2, :intermediate].view(torch.float8_e4m3fn), s2[:, p2, : intermediate // 32].contiguous(),
    )  # fmt: skip


def decode_routed_nvfp4(weights: object):
    """Per-token NVFP4 grouped-GEMM layout (``RoutedNVFP4Weights``-like object) -> logical
    :class:`~flint_moe.reference.pertoken_experts.PerTokenNVFP4Experts`.

    Reads the attributes ``hidden_size``, ``intermediate_size``, ``gated``, ``fc1_data`` uint8 [E, N1p, Hp/2],
    ``fc1_scale`` (the 6-D MMA view, or ``fc1_scale_swizzled`` [E, N1p, Hp/16] when the view is absent),
    ``fc1_alpha`` fp32 [E], ``fc2_data`` uint8 [E, Hp, Ip/2], ``fc2_scale`` (or ``fc2_scale_swizzled``),
    ``fc2_alpha``. Forward map of logical FC1 row l (gated, [gate; up], I rows each): up row u -> physical
    ``(u // 64) * 128 + u % 64``, gate row g -> ``(g // 64) * 128 + 64 + g % 64``; non-gated row l -> l. The
    scales are read through the 128x4 swizzle formula (``unswizzle_scales``); padding is never read.
    Raises TypeError for a missing attribute, ValueError for inconsistent sizes.
    """
    from flint_moe.reference.pertoken_experts import PerTokenNVFP4Experts

    try:
        h, inter, gated = int(weights.hidden_size), int(weights.intermediate_size), bool(weights.gated)
        d1, d2 = weights.fc1_data, weights.fc2_data
        a1, a2 = weights.fc1_alpha, weights.fc2_alpha
        st1 = getattr(weights, "fc1_scale", None)
        st2 = getattr(weights, "fc2_scale", None)
        st1 = weights.fc1_scale_swizzled if st1 is None else st1
        st2 = weights.fc2_scale_swizzled if st2 is None else st2
    except AttributeError as exc:
        raise TypeError(f"weights: not a RoutedNVFP4Weights-like object ({exc})") from None
    check_tensor("fc1_data", d1, dtype=torch.uint8, ndim=3)
    e, n1p, hp2 = d1.shape
    hp = 2 * hp2
    ip = n1p // 2 if gated else n1p
    check_tensor("fc2_data", d2, dtype=torch.uint8, shape=(e, hp, ip // 2))
    if not (0 < h <= hp and 0 < inter <= ip) or h % 16 or inter % 16:
        raise ValueError(f"weights: logical sizes H = {h}, I = {inter} do not fit the stored Hp = {hp}, Ip = {ip}")
    if gated:
        if ip % 64:
            raise ValueError(f"fc1_data: stored intermediate {ip} must be a multiple of 64 (64-row interleave)")
        phys = cutedsl_w13_phys_rows(inter, ip, 64, d1.device)
    else:
        phys = torch.arange(inter, dtype=torch.long, device=d1.device)
    s1 = unswizzle_scales(st1, n1p, hp // 16, name="fc1_scale")
    s2 = unswizzle_scales(st2, hp, ip // 16, name="fc2_scale")
    return PerTokenNVFP4Experts(
        fc1=d1[:, phys, : h // 2].contiguous(),
        fc1_scale=s1[:, phys, : h // 16].contiguous(),
        fc1_alpha=a1.clone(),
        fc2=d2[:, :h, : inter // 2].contiguous(),
        fc2_scale=s2[:, :h, : inter // 16].contiguous(),
        fc2_alpha=a2.clone(),
        gated=gated,
    )
