"""NVFP4 grouped gate/up GEMM + SwiGLU for larger batches on Hopper (rule steps 5-7).

One program computes a ``BC``-column slice of the intermediate (its up and its gate rows) for one row block of
one expert's (token, slot) pairs (``moe_permute``'s schedule): the NVFP4 codes and E4M3 block scales of
``FlintMoEWeights.w1`` are dequantised in the main loop to bf16 (``E2M1 x E4M3`` has at most 2 + 4
significant bits and lies in [2^-10, 2688]: exact in bf16), multiplied with the gathered bf16 token rows on
the tensor cores (``tl.dot``: wgmma with fp32 accumulation on sm_90), and the epilogue applies rule steps 6-7
(global scale on the fp32 accumulator, the SwiGLU with the pinned ``ex2.approx.ftz.f32`` /
``rcp.approx.ftz.f32``, ``cvt.rn.bf16.f32``) exactly as the decode kernel ``nvfp4_gate_up`` does.

The product is computed transposed (``acc[BC, BM] = W[BC, K] . X[BM, K]^T``: weight rows on the MMA's M
side, tokens on its N side) so that small row blocks (16 pairs) still use the 64-row wgmma. Seed: the
SM100 CuTe-DSL grouped GEMM ``moe_cute`` of ``vllm.models.flint`` (semantics only: same weights, same rule).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, check_op_tensor, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import global_scale, swiglu
from flint_moe.kernels.audit.registry import BF16_CVT, register_audit
from flint_moe.kernels.nvfp4.grouped_mainloop import k_loop, k_loop_tail, row_block, tail_rows

__all__ = [
    "accumulation_model",
    "GROUPED_GATE_UP_CONFIG",
    "grouped_config",
    "default_warps",
    "default_bk",
    "default_engine",
    "nvfp4_grouped_gate_up",
    "launch_grouped_gate_up",
    "audit_specs",
]

#: Default launch configuration: ``BC`` intermediate columns per program (32 or 64, so a tile's rows lie in
#: one 128-row [up; gate] group of w1 and number at least 64: the wgmma (m64) of the declared order; a 32-row
#: tile, BC 16, compiles to another MMA and gave other output bits on the H200, so it is refused),
#: ``BK`` K elements per main-loop step (a power of two >= 32;
#: None = ``default_bk(BM, K)``), ``num_stages``; ``num_warps`` None = ``default_warps(BM)``. ``BM`` (pairs
#: per row block) comes from the permutation (:func:`grouped_config`). ``BK`` only groups the chain of
#: k16 tensor-core steps into loop iterations: every BK issues the same wgmma k16 steps in increasing k order
#: on one accumulator (read from the sm_90 PTX; docs/kernels/nvfp4-grouped.md), so it changes neither the
#: order nor the bits where K is a multiple of BK (a partial last step adds exact zero products).
#: ``SCALE_WORD``: load the E4M3 scales as one int32 word per row per 64 K (``grouped_mainloop.scale_words``;
#: needs BK a multiple of 64) instead of byte by byte: at BK 64 a thread's scales then reach the 4 bytes
#: ``cp.async`` needs and are pipelined instead of loaded synchronously in the loop; the same scale values,
#: hence the same bits.
#: ``ENGINE``: "triton" (these kernels), "gluon" (``grouped_gluon``: the weights dequantised straight into the
#: wgmma A registers; sm_90 only, BM <= 128, K a multiple of 64) or "gluon_ws" (``grouped_gluon_ws``: the same
#: warp-specialised, a producer warp group feeding two consumer warpgroups; sm_90 only, BM <= 128, a tail of at most
#: 64 pairs, K a multiple of 128); the same bits; of the other keys only an explicit ``num_stages`` applies to them.
#: None: :func:`default_engine` of the launch. ``PERSISTENT`` ('gluon_ws' only): one program per SM looping over
#: the tiles (else one program per tile; the same bits).
ENGINES = ("triton", "gluon", "gluon_ws")
GROUPED_GATE_UP_CONFIG = {"BC": 64, "BK": None, "num_warps": None, "num_stages": 3, "SCALE_WORD": False,
                          "ENGINE": None, "PERSISTENT": True}  # fmt: skip


def default_engine(perm, k: int) -> str:
    """The engine of a grouped GEMM launch with reduction length ``k`` (H for gate/up, I for down) on the row blocks
    of ``perm``, where the config leaves ``ENGINE`` None. Measured on the H200 (reports/gpu/nvfp4-grouped/engines/,
    same bits): row blocks of 128 pairs with a tail (the default from 65 to 128 pairs per expert) take 'gluon_ws'
    (DeepSeek-V3 M = 4096: gate/up 1.16-1.19x, down 1.21-1.32x the Triton kernels), row blocks of 16 pairs (at most
    16 pairs per expert: the bandwidth-bound token counts) take 'gluon' (M = 128 / 256 on DeepSeek-V3, Qwen3-235B-A22B
    and gpt-oss-120b: kernels 1.15-1.35x); 'triton' where those refuse the launch (no sm_90 GPU, the interpreter,
    K not a multiple of 128 / 64, a one-step K loop) and at the other row-block sizes. Depends only on the
    permutation's BM / tail and ``k`` (never on the routing)."""
    from flint_moe.kernels.nvfp4.grouped_gluon import gluon_refusal
    from flint_moe.kernels.nvfp4.grouped_gluon_ws import ws_refusal

    if perm.block_m == 128 and perm.tail > 0 and ws_refusal(perm, k) is None:
        return "gluon_ws"
    if perm.block_m == 16 and gluon_refusal(perm, k) is None:
        return "gluon"
    return "triton"


def default_bk(block_m: int, k: int) -> int:
    """Default K step of both grouped GEMMs for row blocks of ``block_m`` pairs and reduction length ``k``
    (H for gate/up, I for down): 128 for ``block_m`` 128 when ``k`` is a multiple of 128 (measured on the
    H200 at DeepSeek-V3 M = 4096: 11.99 ms against 12.97 ms with BK 64, same bits; 186 registers, no spill),
    else 64. Both values pad K to the same multiple of 64, so the declared order does not depend on the
    choice (``flint_moe.kernels.orders.nvfp4_grouped_order``)."""
    return 128 if block_m == 128 and k % 128 == 0 else 64


def default_warps(block_m: int) -> int:
    """8 warps (two warpgroups) for row blocks of >= 64 pairs, else 4 (ptxas -v, sm_90a, BK = 64: <= 212
    registers per thread, no spill; docs/kernels/nvfp4-grouped.md)."""
    return 8 if block_m >= 64 else 4


def grouped_config(pairs: int, num_experts: int) -> dict:
    """Row-block size ``BM``, warps and the row-block options (:func:`row_block_options`: ``TAIL``,
    ``SCALE_WORD``) for ``pairs`` (token, slot) pairs over ``num_experts`` experts.

    ``BM`` = the power of two in [16, 256] at or above the mean pairs per expert (so a typical expert fills
    one block without much padding; 256 only from 129 pairs per expert on, where the 128 x 256 x 64 MMA step
    outweighs the dequant); ``num_warps`` from :func:`default_warps`. Depends only on (pairs, E), never on the
    routing, so the configuration of a row never depends on the other rows' values (row independence).
    """
    mean = -(-pairs // max(num_experts, 1))
    bm = 16
    while bm < mean and bm < 256:
        bm *= 2
    return {"BM": bm, "num_warps": default_warps(bm), **row_block_options(mean)}


def row_block_options(mean_pairs: int) -> dict:
    """The launch options of both grouped GEMMs (and of the per-token GEMMs, the same main loop) at ``mean_pairs``
    (token, slot) pairs per expert: from 8 on, expert-wide row blocks (``TAIL`` 32, ``min(32, BM)`` in use)
    with the scales as words (``SCALE_WORD``), else neither. Measured on the H200
    (reports/gpu/nvfp4-grouped/defaults/): at 8 pairs per expert (DeepSeek-V3 and gpt-oss-120b M = 256) both
    together 1.02-1.05x the time without them (expert-wide row blocks alone 0.93-0.94x: without a tail their
    main-only loop is slower), at 16-64 pairs 1.23-1.44x, at 128-512 pairs 1.01-1.49x (DeepSeek-V3 M = 4096
    rows alone 1.03x, with scale words 1.01x: within the spread); below 8 pairs unmeasured, left off. Neither
    option changes a bit (the same k16 wgmma chain per output element)."""
    on = mean_pairs >= 8
    return {"TAIL": 32 if on else 0, "SCALE_WORD": on}


@triton.jit
def _grouped_gate_up_kernel(
    x_ptr,  # bf16 [M, H]
    order_ptr,  # int32 [P]: pair ids sorted by expert
    bexp_ptr,  # int32 [NB]: expert of row block b
    bstart_ptr,  # int32 [NB]: first position of block b in order
    bend_ptr,  # int32 [NB]: one past its last position
    w_ptr,  # uint8 w1 [E, 2 * IP, H / 2]
    s_ptr,  # uint8 w1 scales, 128x4 swizzle [E, roundup(2 * IP, 128), KP]
    alpha_ptr,  # fp32 [E]
    act_ptr,  # bf16 [P, INTER] (out), row = pair id
    gacc_ptr,  # fp32 [P, INTER] (out, TAP only)
    uacc_ptr,  # fp32 [P, INTER] (out, TAP only)
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BM: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    DECODE: tl.constexpr,
    TAP: tl.constexpr,
    SW: tl.constexpr,
):
    """act[p, n] = bf16(RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1))))), g = RN(g_acc * gs), u = RN(u_acc * gs).

    Grid ``(cdiv(INTER, BC), NB)``: program (q, b) handles columns n in [q*BC, q*BC + BC) (n < INTER; padded
    rows of w1 are never read) of the pairs ``order[block_start[b]:block_end[b]]`` of expert
    ``block_expert[b]`` (an empty block does nothing). Up row of n: ``(n // 64) * 128 + n % 64``, gate row:
    that + 64 (docs/layouts.md). One weight tile of ``2 * BC`` rows (the BC up rows, then the BC gate rows;
    for BC = 64 the whole 128-row group, contiguous in memory) and one fp32 accumulator [2 * BC, BM], split
    into up and gate in the epilogue.

    Summation order of g_acc / u_acc (one (pair, column), length H): K steps of ``BK`` elements in increasing
    order, each one ``tl.dot`` of the dequantised bf16 weights (exact) and the bf16 token row (exact
    products) accumulated into the fp32 accumulator (from +0) by the tensor cores (sm_90 wgmma, the hardware's
    internal order and its truncating alignment inside one MMA); columns of a partial last step (H not a
    multiple of BK) add exact zeros. Bound: the plain any-order model with tensor-core truncation,
    ``flint_moe.reference.exact.FP32_TRUNCATE`` (u = 2^-23, d = H). Under the interpreter: numpy fp32 matmul
    per step (round to nearest), within the same bound. No block regrouping: a product is
    ``x * (E2M1 * E4M3)``, not ``(x * E2M1) * E4M3``.

    Rule steps: 6 (``mul.f32`` by w1_alpha[e] on the fp32 accumulator), 7 (``mul``, ``ex2.approx.ftz.f32``,
    ``add``, ``rcp.approx.ftz.f32``, ``mul``, ``mul``, ``cvt.rn.bf16.f32``). TAP: also store g_acc / u_acc.
    """
    gdc_wait()
    gdc_launch_dependents()
    HB: tl.constexpr = H // 2
    KP: tl.constexpr = (H // 16 + 3) // 4 * 4
    MP: tl.constexpr = (2 * IP + 127) // 128 * 128
    q = tl.program_id(0)
    b = tl.program_id(1)
    e, start, end, pos, r_ok = row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM)
    pair = tl.load(order_ptr + pos, mask=r_ok, other=0)
    tok = (pair // TOPK).to(tl.int64)
    R: tl.constexpr = 2 * BC
    r = tl.arange(0, R)
    rcol = q * BC + r % BC  # tile row r: up row of column rcol (r < BC), else its gate row
    r_c_ok = rcol < INTER
    prow = (rcol // 64) * 128 + rcol % 64 + (r // BC) * 64  # physical row in w1
    # codes as int32 words (H / 2 is a multiple of 16 bytes, so every row starts 16-byte aligned)
    w_row = w_ptr.to(tl.pointer_type(tl.int32)) + tl.multiple_of(
        e * (2 * IP * HB // 4) + prow.to(tl.int64) * (HB // 4), 4
    )
    s_base = s_ptr + e * (MP * KP)
    x_row = x_ptr + tl.multiple_of(tok * H, 16)
    acc = tl.zeros([R, BM], dtype=tl.float32)
    if end > start:
        acc = k_loop(acc, w_row, s_base, x_row, prow, r_c_ok, r_ok, H, KP, R, BK, DECODE, SW)
    acc_u, acc_g = tl.split(tl.permute(tl.reshape(acc, [2, BC, BM]), (1, 2, 0)))
    cols = q * BC + tl.arange(0, BC)
    c_ok = cols < INTER
    gs = tl.load(alpha_ptr + e)
    act = swiglu(global_scale(acc_g, gs), global_scale(acc_u, gs))
    off = pair.to(tl.int64)[None, :] * INTER + cols[:, None]
    ok = c_ok[:, None] & r_ok[None, :]
    tl.store(act_ptr + off, act, mask=ok)
    if TAP:
        tl.store(gacc_ptr + off, acc_g, mask=ok)
        tl.store(uacc_ptr + off, acc_u, mask=ok)


@triton.jit
def _gate_up_epilogue(acc, pair, r_ok, gs, q, act_ptr, gacc_ptr, uacc_ptr, INTER: tl.constexpr, N: tl.constexpr,
                      BC: tl.constexpr, TAP: tl.constexpr):  # fmt: skip
    """The gate/up epilogue of ``_grouped_gate_up_kernel`` for an accumulator [2 * BC, N] of the pairs ``pair``
    [N] (mask ``r_ok``): split into up and gate, rule steps 6-7, store ``act`` (and with TAP g_acc / u_acc)."""
    acc_u, acc_g = tl.split(tl.permute(tl.reshape(acc, [2, BC, N]), (1, 2, 0)))
    cols = q * BC + tl.arange(0, BC)
    c_ok = cols < INTER
    act = swiglu(global_scale(acc_g, gs), global_scale(acc_u, gs))
    off = pair.to(tl.int64)[None, :] * INTER + cols[:, None]
    ok = c_ok[:, None] & r_ok[None, :]
    tl.store(act_ptr + off, act, mask=ok)
    if TAP:
        tl.store(gacc_ptr + off, acc_g, mask=ok)
        tl.store(uacc_ptr + off, acc_u, mask=ok)


@triton.jit
def _grouped_gate_up_rows_kernel(
    x_ptr,  # bf16 [M, H]
    order_ptr,  # int32 [P]: pair ids sorted by expert
    bexp_ptr,  # int32 [NB]: expert of row block b
    bstart_ptr,  # int32 [NB]: first position of block b in order
    bend_ptr,  # int32 [NB]: one past its last position (at most BM + TAIL pairs)
    w_ptr,  # uint8 w1 [E, 2 * IP, H / 2]
    s_ptr,  # uint8 w1 scales, 128x4 swizzle [E, roundup(2 * IP, 128), KP]
    alpha_ptr,  # fp32 [E]
    act_ptr,  # bf16 [P, INTER] (out), row = pair id
    gacc_ptr,  # fp32 [P, INTER] (out, TAP only)
    uacc_ptr,  # fp32 [P, INTER] (out, TAP only)
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BM: tl.constexpr,
    TAIL: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    DECODE: tl.constexpr,
    TAP: tl.constexpr,
    SW: tl.constexpr,
):
    """``_grouped_gate_up_kernel`` on expert-wide row blocks (``moe_permute(ids, E, BM, tail=TAIL)``: up to
    ``BM + TAIL`` pairs per block): the first BM pairs of block b in an fp32 accumulator [2 * BC, BM], the next
    (at most TAIL) in a second one [2 * BC, TAIL] whose MMAs run only when the block has more than BM pairs;
    the dequantised weight tile of each K step feeds both. Per (pair, column), the same computation as
    ``_grouped_gate_up_kernel``: K steps of ``BK`` in increasing order, each one ``tl.dot`` of the exact bf16
    weights and the bf16 token row into that element's fp32 accumulator from +0 (tensor cores; the MMA's N,
    BM or TAIL, is the row-block size, which the declared order does not depend on), then rule steps 6-7 with
    the same instructions. Bound ``FP32_TRUNCATE`` (u = 2^-23, d = H). TAP: also store g_acc / u_acc."""
    gdc_wait()
    gdc_launch_dependents()
    HB: tl.constexpr = H // 2
    KP: tl.constexpr = (H // 16 + 3) // 4 * 4
    MP: tl.constexpr = (2 * IP + 127) // 128 * 128
    q = tl.program_id(0)
    b = tl.program_id(1)
    e, start, end, pos, r_ok = row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM)
    pair = tl.load(order_ptr + pos, mask=r_ok, other=0)
    pair_t, t_ok, has_tail = tail_rows(order_ptr, start, end, BM, TAIL)
    R: tl.constexpr = 2 * BC
    r = tl.arange(0, R)
    rcol = q * BC + r % BC  # tile row r: up row of column rcol (r < BC), else its gate row
    r_c_ok = rcol < INTER
    prow = (rcol // 64) * 128 + rcol % 64 + (r // BC) * 64  # physical row in w1
    w_row = w_ptr.to(tl.pointer_type(tl.int32)) + tl.multiple_of(
        e * (2 * IP * HB // 4) + prow.to(tl.int64) * (HB // 4), 4
    )
    s_base = s_ptr + e * (MP * KP)
    x_row = x_ptr + tl.multiple_of((pair // TOPK).to(tl.int64) * H, 16)
    x_row_t = x_ptr + tl.multiple_of((pair_t // TOPK).to(tl.int64) * H, 16)
    acc = tl.zeros([R, BM], dtype=tl.float32)
    acc_t = tl.zeros([R, TAIL], dtype=tl.float32)
    if has_tail:
        acc, acc_t = k_loop_tail(acc, acc_t, w_row, s_base, x_row, x_row_t, prow, r_c_ok, r_ok, t_ok, H, KP, R, BK,
                                 DECODE, SW)  # fmt: skip
    elif end > start:
        acc = k_loop(acc, w_row, s_base, x_row, prow, r_c_ok, r_ok, H, KP, R, BK, DECODE, SW)
    gs = tl.load(alpha_ptr + e)
    _gate_up_epilogue(acc, pair, r_ok, gs, q, act_ptr, gacc_ptr, uacc_ptr, INTER, BM, BC, TAP)
    if has_tail:
        _gate_up_epilogue(acc_t, pair_t, t_ok, gs, q, act_ptr, gacc_ptr, uacc_ptr, INTER, TAIL, BC, TAP)


def _check_perm(perm, tokens: int, top_k: int, num_experts: int, dev: torch.device) -> None:
    """Check ``perm`` (``moe_permute``) against ``tokens`` x ``top_k`` pairs and ``num_experts`` experts."""
    from flint_moe.kernels.nvfp4.permute import MoEPermutation

    if not isinstance(perm, MoEPermutation):
        raise TypeError(f"perm: expected a MoEPermutation (moe_permute), got {type(perm).__name__}")
    if perm.num_experts != num_experts:
        raise ValueError(f"perm: built for {perm.num_experts} experts, weights hold {num_experts}")
    check_op_tensor("perm.order", perm.order, dtype=torch.int32, shape=(tokens * top_k,), device=dev)
    nb = perm.num_blocks
    for name in ("block_expert", "block_start", "block_end"):
        check_op_tensor(f"perm.{name}", getattr(perm, name), dtype=torch.int32, shape=(nb,), device=dev)
    if perm.top_k != top_k:
        raise ValueError(f"perm: built for top_k = {perm.top_k}, ids has k = {top_k}")
    tail = perm.tail
    if not isinstance(tail, int) or (tail and (tail < 16 or tail > perm.block_m or tail & (tail - 1))):
        raise ValueError(f"perm: tail = {tail!r} must be 0 or a power of two in [16, block_m = {perm.block_m}]")


def grouped_launch_kwargs(cfg: dict, block_m: int, tap: bool, k: int) -> dict:
    """The launch keywords both grouped GEMMs share: ``BM`` (the permutation's ``block_m``), ``BK``
    (``default_bk(block_m, k)`` unless set; ``k`` the reduction length), ``DECODE``, ``TAP``, ``SW`` (config
    ``SCALE_WORD``; ValueError unless BK is a multiple of 64), ``num_warps``
    (``default_warps(block_m)`` unless set) and ``num_stages`` of the checked ``cfg``, and ``launch_options()``."""
    bk = int(cfg["BK"] or default_bk(block_m, k))
    sw = bool(cfg.get("SCALE_WORD", False))
    if sw and bk % 64:
        raise ValueError(f"config SCALE_WORD needs BK a multiple of 64, got BK = {bk}")
    return {"BM": block_m, "BK": bk, "DECODE": cfg["DECODE"], "TAP": tap, "SW": sw,
            "num_warps": int(cfg["num_warps"] or default_warps(block_m)), "num_stages": int(cfg["num_stages"]),
            **launch_options()}  # fmt: skip


def _cfg(config: dict | None, default: dict, name: str) -> dict:
    cfg = dict(default)
    if config:
        unknown = set(config) - set(default) - {"DECODE"}
        if unknown:
            raise ValueError(f"{name}: unknown config keys {sorted(unknown)}")
        cfg.update(config)
    if cfg.get("ENGINE") is not None and cfg["ENGINE"] not in ENGINES:
        raise ValueError(f"{name}: config ENGINE must be one of {ENGINES}, got {cfg['ENGINE']!r}")
    if "SCALE_WORD" in cfg and not isinstance(cfg["SCALE_WORD"], bool):
        raise ValueError(f"{name}: config SCALE_WORD must be a bool, got {cfg['SCALE_WORD']!r}")
    if cfg["BK"] is not None:
        bk = int(cfg["BK"])
        if bk < 32 or bk & (bk - 1):
            raise ValueError(f"{name}: config BK = {bk} must be a power of two >= 32 (or None: default_bk)")
    decode = int(cfg.get("DECODE", 0 if INTERPRET else 3))
    if decode not in (0, 1, 2, 3):
        raise ValueError(f"{name}: config DECODE must be 0, 1, 2 or 3, got {decode}")
    cfg["DECODE"] = decode
    return cfg


def nvfp4_grouped_gate_up(
    x: torch.Tensor, ids: torch.Tensor, perm, weights,
    *, taps: dict | None = None, config: dict | None = None, check: bool = True,
) -> torch.Tensor:
    """Rule steps 5-7 for every (token, slot) pair, grouped by expert: act bf16 [M * k, I] (row = pair).

    Args:
        x: bf16 [M, H] contiguous (never modified).
        ids: int32 [M, k] contiguous (rule step 2): the experts ``perm`` was built from.
        perm: ``moe_permute(ids, E, block_m, tail)``; ``block_m`` is the kernel's BM; ``tail`` > 0 launches the
            expert-wide row-block build (``_grouped_gate_up_rows_kernel``: the same bits as tail = 0).
        weights: ``FlintMoEWeights`` (w1 uint8 [E, 2Ip, H/2], 128x4-swizzled E4M3 scales, w1_alpha fp32 [E]).
        taps: if a dict, the tapped build runs and stores ``gate_acc`` / ``up_acc`` fp32 [M, k, I] (before the
            global scale) and ``act`` bf16 [M, k, I].
        config: overrides of ``GROUPED_GATE_UP_CONFIG`` (``BC``, ``BK`` (None: ``default_bk(BM, H)``),
            ``num_warps``, ``num_stages``, ``SCALE_WORD``, ``ENGINE``) and
            ``DECODE`` (GPU: 3 = one inline-PTX call per code word giving bf16 weights times the scale (default),
            2 / 1 = the decode kernels' fp16x2 / bf16x2 E2M1 decodes, 0 = plain integer ops; identical values,
            hence identical bits; the interpreter always takes the plain path).
        check: False skips the tensor checks, for a caller that made them (``launch_grouped_gate_up``); the config
            is checked either way.
    Raises:
        TypeError / ValueError naming the bad argument (dtype, shape, device, contiguity, config).
    """
    if check:
        from flint_moe.kernels.nvfp4.gate_up import check_gate_up_inputs

        E, M, top_k = check_gate_up_inputs(x, ids, weights)
        _check_perm(perm, M, top_k, E, weights.w1.device)
    from flint_moe.kernels.nvfp4.gate_up import decode_sizes, gate_up_buffers, publish_gate_up_taps, w1_operands

    E, H, IP, INTER = decode_sizes(weights)
    dev = weights.w1.device
    M = x.shape[0]
    top_k = ids.shape[1]
    cfg = _cfg(config, GROUPED_GATE_UP_CONFIG, "nvfp4_grouped_gate_up")
    bc = int(cfg["BC"])
    if bc not in (32, 64):
        raise ValueError(f"nvfp4_grouped_gate_up: config BC = {bc} must be 32 or 64 (tiles of 2 BC >= 64 weight rows)")
    P = M * top_k
    tap = taps is not None
    act, gacc, uacc = gate_up_buffers(P, INTER, tap, dev)
    engine = cfg["ENGINE"] or default_engine(perm, H)
    if P > 0 and engine == "gluon":
        from flint_moe.kernels.nvfp4.grouped_gluon import check_gluon_launch, launch_gluon_gate_up

        check_gluon_launch("nvfp4_grouped_gate_up", perm, H)
        launch_gluon_gate_up(x, perm, *w1_operands(weights), act, gacc, uacc, H=H, IP=IP, INTER=INTER, TOPK=top_k,
                             TAP=tap, stages=(config or {}).get("num_stages"))  # fmt: skip
    elif P > 0 and engine == "gluon_ws":
        from flint_moe.kernels.nvfp4.grouped_gluon_ws import check_ws_launch, launch_ws_gate_up

        check_ws_launch("nvfp4_grouped_gate_up", perm, H)
        launch_ws_gate_up(x, perm, *w1_operands(weights), act, gacc, uacc, H=H, IP=IP, INTER=INTER, TOPK=top_k,
                          TAP=tap, stages=(config or {}).get("num_stages"),
                          persistent=bool(cfg["PERSISTENT"]))  # fmt: skip
    elif P > 0:
        grid = (triton.cdiv(INTER, bc), perm.num_blocks)
        kw = grouped_launch_kwargs(cfg, perm.block_m, tap, H)
        if perm.tail:  # expert-wide row blocks: BM + tail pairs per program
            kernel, kw = _grouped_gate_up_rows_kernel, {**kw, "TAIL": perm.tail}
        else:
            kernel = _grouped_gate_up_kernel
        kernel[grid](
            x,
            perm.order,
            perm.block_expert,
            perm.block_start,
            perm.block_end,
            *w1_operands(weights),
            act,
            gacc,
            uacc,
            H=H, IP=IP, INTER=INTER, TOPK=top_k, BC=bc, **kw,
        )  # fmt: skip
    if tap:
        publish_gate_up_taps(taps, M, top_k, act, gacc, uacc)
    return act


def launch_grouped_gate_up(*args, **kwargs) -> torch.Tensor:
    """``nvfp4_grouped_gate_up(..., check=False)``. On arguments already checked by the caller (the op
    ``flint_moe.ops.flint_moe_grouped``: its inputs at its boundary, ``ids`` from ``route``, ``perm`` from
    ``moe_permute``): no tensor checks here; the config is checked (ValueError)."""
    return nvfp4_grouped_gate_up(*args, check=False, **kwargs)


#: (H, I, k, BM) specialisations of the conformance matrix's real shapes audited for sm_90.
AUDIT_CASES = [
    (7168, 2048, 8, 16),
    (7168, 2048, 8, 32),
    (7168, 2048, 8, 64),
    (7168, 2048, 8, 128),
    (7168, 2048, 8, 256),
    (2048, 768, 8, 64),
    (2048, 768, 8, 256),
    (4096, 1536, 8, 128),
    (2880, 2880, 4, 128),
]


def accumulation_model(config: dict | None = None):
    """Summation model of g_acc / u_acc for every launch configuration: ``FP32_TRUNCATE`` (tensor-core
    accumulation, any order; kernel docstring). ``config`` is accepted for symmetry with the decode kernels."""
    del config
    from flint_moe.reference.exact import FP32_TRUNCATE

    return FP32_TRUNCATE


def grouped_audit_runs():
    """The audited builds of both grouped GEMMs: ``(H, I, Ip, k, BM, name suffix, TAP)`` for every
    ``AUDIT_CASES`` entry (production builds), and the tapped build of DeepSeek-V3 (H 7168, I 2048, BM 128)."""
    for h, i, k, bm in AUDIT_CASES:
        ip = (i + 63) // 64 * 64
        for tap in (False, True) if (h, i, bm) == (7168, 2048, 128) else (False,):
            yield h, i, ip, k, bm, f".H{h}.I{i}.BM{bm}{'.tap' if tap else ''}", tap


#: (H, I, k, BM, TAIL) specialisations of the expert-wide row-block build (op config ``TAIL``) audited for sm_90:
#: the benchmark's shapes at M = 4096 (BM 128) and DeepSeek-V3 at M = 16384 (BM 256), and the conformance
#: matrix's ``rows-tail32`` cases at M = 64 (BM 16, tail min(32, 16)).
ROWS_AUDIT_CASES = [
    (7168, 2048, 8, 128, 32),
    (7168, 2048, 8, 256, 32),
    (7168, 2048, 8, 16, 16),
    (2048, 768, 8, 16, 16),
    (4096, 1536, 8, 128, 32),
    (2880, 2880, 4, 128, 32),
]


#: (H, I, k, BM, TAIL) builds audited with ``SCALE_WORD`` (TAIL 0: the default schedule's kernel): the BK 64
#: builds it is for (M = 16384 at BM 256, gpt-oss-120b, BM 16) and DeepSeek-V3 at BM 128 + 32 (BK 128).
SCALE_WORD_AUDIT_CASES = [
    (7168, 2048, 8, 256, 0),
    (7168, 2048, 8, 256, 32),
    (7168, 2048, 8, 16, 0),
    (7168, 2048, 8, 128, 32),
    (2880, 2880, 4, 128, 32),
]


def grouped_sw_audit_runs():
    """``(H, I, Ip, k, BM, TAIL, name suffix)`` of every ``SCALE_WORD_AUDIT_CASES`` entry (production builds)."""
    for h, i, k, bm, tail in SCALE_WORD_AUDIT_CASES:
        yield h, i, (i + 63) // 64 * 64, k, bm, tail, f".H{h}.I{i}.BM{bm}{f'.T{tail}' if tail else ''}.SW"


def grouped_rows_audit_runs():
    """The audited builds of both grouped GEMMs' expert-wide row-block kernels: ``(H, I, Ip, k, BM, TAIL, name
    suffix, TAP)`` for every ``ROWS_AUDIT_CASES`` entry, and the tapped build of DeepSeek-V3 (BM 128, TAIL 32)."""
    for h, i, k, bm, tail in ROWS_AUDIT_CASES:
        ip = (i + 63) // 64 * 64
        for tap in (False, True) if (h, i, bm) == (7168, 2048, 128) else (False,):
            yield h, i, ip, k, bm, tail, f".H{h}.I{i}.BM{bm}.T{tail}{'.tap' if tap else ''}", tap


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of the grouped gate/up kernel (production builds, and the tapped build of
    DeepSeek-V3), of its expert-wide row-block build (``ROWS_AUDIT_CASES``) and of ``SCALE_WORD`` builds
    (``SCALE_WORD_AUDIT_CASES``): the rule's instructions present, wgmma present (tensor cores), no fp64 /
    div.full."""
    sig = {"x_ptr": "*bf16", "order_ptr": "*i32", "bexp_ptr": "*i32", "bstart_ptr": "*i32", "bend_ptr": "*i32",
        "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "act_ptr": "*bf16", "gacc_ptr": "*fp32",
        "uacc_ptr": "*fp32"}
    require = [BF16_CVT, "rcp.approx.ftz.f32", "ex2.approx.ftz.f32", "mul.rn.bf16x2", "wgmma.mma_async",
               "griddepcontrol.wait"]  # fmt: skip
    cfg = GROUPED_GATE_UP_CONFIG
    names = []
    for h, i, ip, k, bm, suffix, tap in grouped_audit_runs():
        consts = {"H": h, "IP": ip, "INTER": i, "TOPK": k, "BM": bm, "BC": cfg["BC"],
                  "BK": cfg["BK"] or default_bk(bm, h), "DECODE": 3, "TAP": tap, "SW": False}  # fmt: skip
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit("nvfp4_grouped_gate_up" + suffix, _grouped_gate_up_kernel, sig, consts, require,
                                    options=options).name)  # fmt: skip
    for h, i, ip, k, bm, tail, suffix, tap in grouped_rows_audit_runs():
        consts = {"H": h, "IP": ip, "INTER": i, "TOPK": k, "BM": bm, "TAIL": tail, "BC": cfg["BC"],
                  "BK": cfg["BK"] or default_bk(bm, h), "DECODE": 3, "TAP": tap, "SW": False}  # fmt: skip
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit("nvfp4_grouped_gate_up_rows" + suffix, _grouped_gate_up_rows_kernel, sig, consts,
                                    require, options=options).name)  # fmt: skip
    for h, i, ip, k, bm, tail, suffix in grouped_sw_audit_runs():
        consts = {"H": h, "IP": ip, "INTER": i, "TOPK": k, "BM": bm, "BC": cfg["BC"],
                  "BK": cfg["BK"] or default_bk(bm, h), "DECODE": 3, "TAP": False, "SW": True}  # fmt: skip
        kernel, base = _grouped_gate_up_kernel, "nvfp4_grouped_gate_up"
        if tail:
            kernel, base, consts = _grouped_gate_up_rows_kernel, base + "_rows", {**consts, "TAIL": tail}
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit(base + suffix, kernel, sig, consts, require, options=options).name)
    return names


audit_specs()
