"""Shared pieces of the BF16 TRT-LLM-layout decode GEMVs.

The summation order of every length-H / length-I reduction of the BF16 decode kernels
(``bf16/gate_up.py``, ``bf16/down_combine.py``) is the one order below, the same for every tile configuration
(rows per program, warps, loop unrolling), so tuning a launch never changes a bit:

**Lane chains, then a pairwise tree over the 64 lanes.** A reduction ``sum_h w[h] * v[h]`` of length
``K = 64 * NB`` (K = H for gate/up, K = Ip for down; the TRT-LLM BlockMajorK block is 64 elements) is split
into 64 lanes by ``h % 64``. Lane ``l`` (0 <= l < 64) starts from ``+0.0`` and adds its terms
``h = l, 64 + l, 128 + l, ..., 64 * (NB - 1) + l`` in increasing ``h``, one ``fma.rn.f32`` each:
``p_l = fma(w[h], v[h], p_l)``. The 64 lane partials are then combined by a balanced binary tree of
``add.rn.f32`` that adds neighbours first: level 1 forms ``q_i = p_{2i} + p_{2i+1}`` (32 values), level 2
adds neighbouring pairs of those, ... level 6 gives the sum. In closed form, with ``T(a, n)`` the sum of lanes
``a .. a+n-1``: ``T(a, 1) = p_a``, ``T(a, n) = T(a, n/2) + T(a + n/2, n/2)``; the result is ``T(0, 64)``.

Where this lives in the code: each program holds a ``[rows, 64]`` fp32 accumulator tile, one column per lane,
updated with ``tl.fma`` once per 64-element K block (a bf16 weight and a bf16 activation, both widened exactly
to fp32, so the product is exact in fp32 unless it underflows and ``fma(w, v, p) = RN(w * v + p)``); the tree
is ``_sum64_pairwise`` (explicit ``reshape`` + ``split`` + ``+``, not ``tl.sum``, whose tree depends on the
register layout). Which thread or warp owns a lane never matters: every lane chain is sequential and the tree
is fixed by lane index.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flint_moe.kernels._launch import launch_options
from flint_moe.kernels.audit.registry import register_audit

__all__ = [
    "LANES",
    "AUDIT_SHAPES",
    "checked_row",
    "sum64_pairwise",
    "trtllm_row",
    "tile_config",
    "gemv_constexprs",
    "gemv_launch_kwargs",
    "register_gemv_audits",
]

#: Lanes of one reduction = elements of one TRT-LLM BF16 BlockMajorK block (128 bytes).
LANES = 64


@triton.jit
def _pair_add(acc, R: tl.constexpr, W: tl.constexpr):
    """[R, W] -> [R, W // 2]: element i of the result is ``acc[:, 2i] + acc[:, 2i+1]`` (one add.rn.f32)."""
    a, b = tl.split(tl.reshape(acc, [R, W // 2, 2]))
    return a + b


@triton.jit
def sum64_pairwise(acc, R: tl.constexpr):
    """Pairwise tree over the 64 lane partials of each row: fp32 [R, 64] -> fp32 [R] (module docstring).

    Six levels of neighbour additions (64 -> 32 -> 16 -> 8 -> 4 -> 2 -> 1), so the result is
    ``T(0, 64)`` with ``T(a, n) = T(a, n/2) + T(a + n/2, n/2)``.
    """
    acc = _pair_add(acc, R, 64)
    acc = _pair_add(acc, R, 32)
    acc = _pair_add(acc, R, 16)
    acc = _pair_add(acc, R, 8)
    acc = _pair_add(acc, R, 4)
    a, b = tl.split(acc)  # [R, 2] -> 2 x [R]
    return a + b


# ---------------------------------------------------------------------------------------------------------
# Row maps: loads that cannot leave the weights
# ---------------------------------------------------------------------------------------------------------
#
# The kernels read the TRT-LLM BF16 weights through the logical -> physical row maps of
# ``flint_moe.layouts.trtllm_bf16_row_maps``. A map value is data the op cannot keep checked for free (writes
# through ``.data`` or ``.numpy()`` leave no trace in the tensor's version counter), so every loaded value
# goes through :func:`checked_row`: a value outside the map's range is replaced by the layout's own row at
# that index (:func:`trtllm_row`, computed from the index), so no value, however it got there, makes a kernel
# read outside the weights. An in-range value is used as given (a wrong in-range permutation reads wrong
# rows; ``flint_moe.ops.check_row_map_status`` reports it). A correct map passes unchanged: the weights read,
# the arithmetic and every output bit are as without the check.


@triton.jit
def trtllm_row(j):
    """Closed form of the TRT-LLM BF16 row maps: the physical row of shuffle position ``j`` (int32, any shape).

    The epilogue-tile shuffle (32-row blocks, ``flint_moe.layouts.rows.shuffle_rows``) puts source row
    ``32 b + 4 w + q`` (0 <= w < 8, 0 <= q < 4) at physical row ``32 b + 8 q + w``. So
    ``map2[h] = trtllm_row(h)``, ``map13[n] = trtllm_row(2 n + 1)`` (gate row n) and
    ``map13[Ip + n] = trtllm_row(2 n)`` (up row n): the gated reorder puts up row n at position 2n, gate
    row n at 2n + 1. Integer and/shift/or only."""
    return (j & -32) | ((j & 3) << 3) | ((j & 31) >> 2)


@triton.jit
def checked_row(v, expected, ROWS: tl.constexpr):
    """Row of a loaded map value ``v`` (int32): ``v`` where it lies in ``[0, ROWS)``, else ``expected`` (the
    layout's own row, always in range). One unsigned compare and one select per loaded index."""
    return tl.where(v.to(tl.uint32, bitcast=True) < ROWS, v, expected)


# ---------------------------------------------------------------------------------------------------------
# Launch configurations and the PTX audit of both kernels
# ---------------------------------------------------------------------------------------------------------


def tile_config(config: dict | None, defaults: dict, tile: str) -> dict:
    """``defaults`` updated by ``config`` (launch overrides), checked: only known keys, ``tile`` (rows per
    program) a power of two dividing 64, ``UNROLL`` a positive int. Raises ``ValueError`` naming the key."""
    cfg = dict(defaults)
    if config:
        unknown = set(config) - set(cfg)
        if unknown:
            raise ValueError(f"config: unknown keys {sorted(unknown)} (known: {sorted(cfg)})")
        cfg.update(config)
    rows = cfg[tile]
    if not (isinstance(rows, int) and 1 <= rows <= 64 and 64 % rows == 0):
        raise ValueError(f"config: {tile} = {rows!r} must be a power of two dividing 64")
    if not (isinstance(cfg["UNROLL"], int) and cfg["UNROLL"] >= 1):
        raise ValueError(f"config: UNROLL = {cfg['UNROLL']!r} must be a positive int")
    return cfg


def gemv_constexprs(hidden: int, inter: int, top_k: int, cfg: dict, tile: str, tap: bool) -> dict:
    """The compile-time arguments of both BF16 decode kernels: ``H``, ``INTER``, ``TOPK``, the rows per program
    ``tile`` (``BN`` / ``BH``) and ``UNROLL`` of the checked ``cfg`` (``tile_config``), ``TAP``."""
    return {"H": hidden, "INTER": inter, "TOPK": top_k, tile: cfg[tile], "UNROLL": cfg["UNROLL"], "TAP": tap}


def gemv_launch_kwargs(hidden: int, inter: int, top_k: int, cfg: dict, tile: str, tap: bool) -> dict:
    """The keyword arguments of a BF16 decode launch: ``gemv_constexprs``, ``num_warps`` of ``cfg`` and
    ``launch_options()``."""
    return {**gemv_constexprs(hidden, inter, top_k, cfg, tile, tap), "num_warps": cfg["num_warps"], **launch_options()}


#: (H, Ip, k) of the conformance matrix's BF16 specialisations, audited for both kernels: Qwen3-30B-A3B,
#: gpt-oss-120b (I = 2880 read as is, and padded to 2944 for the TRT-LLM launcher), DeepSeek-V3-like, and odd
#: sizes (H 5120, Ip 704).
AUDIT_SHAPES = ((2048, 768, 8), (2880, 2880, 4), (2880, 2944, 4), (7168, 2048, 8), (5120, 704, 8))


def register_gemv_audits(
    prefix: str, kernel, sig: dict, defaults: dict, tile: str, require: list, configs: tuple
) -> list[str]:
    """Register the sm_90 PTX audit specialisations of a BF16 decode kernel: every ``(H, Ip, k)`` of
    ``AUDIT_SHAPES`` at ``defaults``, and each of ``configs`` (overrides) at the first one, TAP off and on; names
    ``{prefix}.H{H}_I{Ip}_k{k}[_cfg{j}][_tap]``. Returns the names."""
    names = []
    runs = [(h, i, k, defaults, "") for h, i, k in AUDIT_SHAPES]
    h0, i0, k0 = AUDIT_SHAPES[0]
    runs += [(h0, i0, k0, {**defaults, **c}, f"_cfg{j}") for j, c in enumerate(configs)]
    for h, i, k, cfg, suffix in runs:
        for tap in (False, True):
            name = f"{prefix}.H{h}_I{i}_k{k}{suffix}" + ("_tap" if tap else "")
            consts = gemv_constexprs(h, i, k, cfg, tile, tap)
            register_audit(name, kernel, dict(sig), consts, list(require), options={"num_warps": cfg["num_warps"]})
            names.append(name)
    return names
