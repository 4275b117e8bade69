"""Router kernels (rule steps 1-4): a fused router GEMV + top-k for few tokens, and a top-k
kernel that follows a cuBLAS fp32 router GEMM for more tokens. Public op: ``flint_moe.ops.route``.

Kernels (seed: ``vllm.models.flint.ops.moe`` ``_router_kernel``, ``_topk_kernel``, ``_topk_row``, semantics
only; this design lifts the seed's E <= 256 and power-of-two E limits, sums the scores sequentially as the
rule says, and pins every rounding instruction):

- ``_router_gemv_topk_kernel``, grid (M, NP) with NP = ceil(E / EB): program (t, p) computes the fp32 sums of
  experts [p*EB, p*EB + EB) for token t, rounds them to bf16 (``cvt.rn.bf16.f32``, rule step 1) and stores
  them in the logits workspace; then it takes a ticket from the token's atomic counter, and the program that
  draws the token's last ticket runs the top-k (steps 2-4) on the whole logits row.
- ``_topk_kernel``, grid (M,): reads the fp32 router GEMM output, rounds it to bf16 (step 1's cast) and runs
  the same top-k.

Counter (``make_route_counter``): int32 [ROUTE_GEMV_MAX_TOKENS], zeroed once, never reset. Invariant between
launches: every entry is a multiple of ``COUNTER_ALIGN`` = 2^16. Each of the NP programs of token t adds 1
(``atom.add.acq_rel.gpu``); the program that receives ``old % 2^16 == NP - 1`` is the last and adds
``2^16 - NP``, so the launch leaves the entry at its start + 2^16. 2^16 divides 2^32, so int32 wraparound is
harmless, NP need not be a power of two (NP <= 2^16), and launches with different E may share a counter.
No host-side reset exists, so CUDA-graph replays are safe. Launches that share a counter must be ordered
(one stream; with PDL each program calls ``gdc_wait`` before its atomic, so the next launch's tickets follow
this launch's completion).

Summation order of the router sums (rule step 1; the only order-dependent values; tap ``router_acc``):
    For token t and expert e, with BH = BLOCK_H and C = ceil(H / BH) chunks, lane j (0 <= j < BH) holds
        a_j = (((0 + p_j) + p_{j+BH}) + p_{j+2 BH}) + ... + p_{j+(C-1) BH}     (sequential over chunks)
    with p_h = x[t, h] * Wr[e, h] for h < H and p_h = 0 for the padding h >= H. On the GPU each step is one
    ``fma.rn.f32(x, w, a)``; under the interpreter it is RN(RN(x*w) + a); a bf16 x bf16 product is exact in
    fp32 unless it underflows, so the two agree except there. Then the BH lane values are combined by a
    balanced pairwise tree over adjacent lanes (``tl.reshape`` + ``tl.split``, not ``tl.sum``):
        level 1: b_i = a_{2i} + a_{2i+1} (i < BH/2); level 2: c_i = b_{2i} + b_{2i+1}; ... ; log2(BH) levels,
    each addition one fp32 RN. Which thread owns which lane does not change these values. The fp32 GEMM path
    (M > ROUTE_GEMV_MAX_TOKENS) sums in cuBLAS's (undocumented) order; both are covered by the golden
    model's FP32_RN bound (n = H, u = 2^-24).

Steps 2-4 in the row's top-k (``_topk_row``), all order-free and bit-exact:
    key(l) = totalOrder key of the bf16 bit pattern b (int16): b >= 0 -> b; b < 0 -> b ^ 0x7FFF (so -0 -> -1
    < +0 -> 0); every NaN -> 32641 (above +inf = 32640, all NaNs equal). Composite int32 key
    ((key + 32768) << IDXB) | (EP2 - 1 - e), EP2 = next power of two >= E, IDXB = log2 EP2: unique per
    expert, larger for a larger logit and, among equal logits, for the lower index. k rounds of a max
    reduction select the ids in descending order (lanes e >= E hold -1 and are never selected since k <= E).
    Round j: l_j = the selected bf16 logit widened exactly (a NaN as 0x7FC0), s_j = div_rn(1, RN(1 +
    expf(-l_j))) (libdevice expf, ``div.rn.f32``), S = s_0, then S = RN(S + s_j) in selection order; finally
    tw_j = bf16(div_rn(s_j, RN(S + 1e-20f))) stored as fp32 holding that bf16 value.

Taps (``taps`` dict given -> TAP=True build): ``router_acc`` fp32 [M, E] (the sums above, before bf16),
``logits`` bf16 [M, E], ``ids`` int32 [M, k], ``weights`` fp32 [M, k]. The TAP build only adds the
``router_acc`` stores; its other outputs equal the production build's bit for bit (tested).

Limits: 1 <= k <= min(E, 16) (``MAX_TOP_K``), E <= 32768, M * E and E * H below 2^31 are not required:
row offsets are computed in int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn, div_rn, expf_libdevice
from flint_moe.kernels.audit.registry import BF16_CVT, EXPF_LIBDEVICE, register_audit

__all__ = [
    "ROUTE_GEMV_MAX_TOKENS",
    "COUNTER_ALIGN",
    "MAX_TOP_K",
    "MAX_EXPERTS",
    "router_config",
    "launch_router_gemv_topk",
    "launch_topk",
    "audit_specs",
]

#: Largest token count routed by the fused GEMV kernel (decode); above it: fp32 GEMM + top-k kernel.
ROUTE_GEMV_MAX_TOKENS = 8
#: Counter entries are multiples of this between launches (see the module docstring).
COUNTER_ALIGN = 1 << 16
MAX_TOP_K = 16
MAX_EXPERTS = 32768
_NUM_WARPS = 4


@triton.jit
def _topk_row(
    vals,
    offs,
    E,
    ids_ptr,
    tw_ptr,
    EP2: tl.constexpr,
    IDXB: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
):
    """Steps 2-4 for one row: ``vals`` bf16 [EP2] (lanes >= E ignored), ``offs`` = arange(EP2) int32.

    Stores ids int32 [TOPK] and weights fp32 [TOPK] (bf16 values) at ids_ptr / tw_ptr (module docstring).
    """
    b = vals.to(tl.int16, bitcast=True).to(tl.int32)  # sign-extended bf16 bit pattern
    key = tl.where(b < 0, b ^ 0x7FFF, b)
    key = tl.where((b & 0x7FFF) > 0x7F80, 32641, key)  # every NaN: one key, above +inf
    comp = ((key + 32768) << IDXB) | (EP2 - 1 - offs)
    comp = tl.where(offs < E, comp, -1)
    koffs = tl.arange(0, TOPK_P2)
    sel_ids = tl.full([TOPK_P2], 0, tl.int32)
    sel_bits = tl.full([TOPK_P2], 0, tl.int32)
    for j in tl.static_range(TOPK):
        best = tl.max(comp, axis=0)
        comp = tl.where(comp == best, -1, comp)
        k16 = (best >> IDXB) - 32768
        bits = tl.where(k16 < 0, k16 ^ 0x7FFF, k16)
        bits = tl.where(k16 == 32641, 0x7FC0, bits)  # NaN (payloads are never compared)
        sel_ids = tl.where(koffs == j, (EP2 - 1) - (best & (EP2 - 1)), sel_ids)
        sel_bits = tl.where(koffs == j, bits, sel_bits)
    logit = sel_bits.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)  # exact widening
    one = tl.full([TOPK_P2], 1.0, tl.float32)
    s = div_rn(one, 1.0 + expf_libdevice(-logit))  # step 3 (lanes >= TOPK: unused)
    # step 4: S = RN(...RN(s_0 + s_1)... + s_{k-1}); s_j is extracted exactly (s_j + zeros, s_j >= +0 or NaN)
    total = tl.sum(tl.where(koffs == 0, s, 0.0), axis=0)
    for j in tl.static_range(1, TOPK):
        total = total + tl.sum(tl.where(koffs == j, s, 0.0), axis=0)
    denom = tl.full([TOPK_P2], 0.0, tl.float32) + (total + 1e-20)  # broadcast: 0 + d = d for d > 0 or NaN
    tw = bf16_rn(div_rn(s, denom)).to(tl.float32)
    kmask = koffs < TOPK
    tl.store(ids_ptr + koffs, sel_ids, mask=kmask)
    tl.store(tw_ptr + koffs, tw, mask=kmask)


@triton.jit
def _lane_tree(acc, EB: tl.constexpr, LOG_BH: tl.constexpr):
    """fp32 [EB, 2^LOG_BH] lane values -> fp32 [EB]: the balanced pairwise tree over adjacent lanes of the
    module docstring (level 1 adds lanes 2i and 2i+1, ...; ``tl.reshape`` + ``tl.split``, not ``tl.sum``)."""
    red = acc
    for _lvl in tl.static_range(LOG_BH):
        lo, hi = tl.split(tl.reshape(red, [EB, red.shape[1] // 2, 2]))
        red = lo + hi
    return tl.reshape(red, [EB])


@triton.jit
def _logits_then_last_topk(
    sums,
    offs_e,
    emask,
    t,
    NP,
    E,
    logits_ptr,
    ids_ptr,
    tw_ptr,
    counter_ptr,
    acc_ptr,
    EP2: tl.constexpr,
    IDXB: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
    TAP: tl.constexpr,
):
    """The end of a router GEMV program of token ``t`` (one of NP): store its fp32 sums (tap) and bf16 logits
    for experts ``offs_e``, take a ticket from the token's counter (module docstring: counter protocol), let
    the dependent launch start, and, in the program that drew the token's last ticket, run the top-k
    (steps 2-4) on the token's whole logits row."""
    if TAP:
        tl.store(acc_ptr + t * E + offs_e, sums, mask=emask)
    tl.store(logits_ptr + t * E + offs_e, bf16_rn(sums), mask=emask)
    tl.debug_barrier()  # every thread's stores precede the release below
    old = tl.atomic_add(counter_ptr + t, 1, sem="acq_rel")
    gdc_launch_dependents()
    if (old & 0xFFFF) == NP - 1:
        tl.atomic_add(counter_ptr + t, 0x10000 - NP, sem="relaxed")
        offs = tl.arange(0, EP2)
        vals = tl.load(logits_ptr + t * E + offs, mask=offs < E, other=0.0, volatile=True)
        _topk_row(vals, offs, E, ids_ptr + t * TOPK, tw_ptr + t * TOPK, EP2, IDXB, TOPK, TOPK_P2)


@triton.jit
def _router_gemv_topk_kernel(
    x_ptr,  # bf16 [M, H]
    w_ptr,  # bf16 [E, H]
    logits_ptr,  # bf16 [M, E] (workspace; the `logits` tap)
    ids_ptr,  # int32 [M, TOPK]
    tw_ptr,  # fp32 [M, TOPK]
    counter_ptr,  # int32 [>= M]
    acc_ptr,  # fp32 [M, E] (router_acc tap; written only when TAP)
    E,
    H: tl.constexpr,
    EB: tl.constexpr,
    BLOCK_H: tl.constexpr,
    LOG_BH: tl.constexpr,
    EP2: tl.constexpr,
    IDXB: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
    TAP: tl.constexpr,
):
    """Router GEMV of experts [p*EB, +EB) for token t = program_id(0), p = program_id(1); the token's last
    program runs the top-k (module docstring: summation order, counter protocol)."""
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    NP = tl.num_programs(1)
    gdc_wait()
    offs_e = p * EB + tl.arange(0, EB)
    emask = offs_e < E
    offs_h = tl.arange(0, BLOCK_H)
    w_rows = w_ptr + offs_e.to(tl.int64)[:, None] * H
    x_row = x_ptr + t * H
    acc = tl.full([EB, BLOCK_H], 0.0, tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + offs_h
        hmask = hh < H
        xv = tl.load(x_row + hh, mask=hmask, other=0.0).to(tl.float32)
        wv = tl.load(w_rows + hh[None, :], mask=emask[:, None] & hmask[None, :], other=0.0).to(tl.float32)
        acc += wv * xv[None, :]
    sums = _lane_tree(acc, EB, LOG_BH)
    _logits_then_last_topk(
        sums, offs_e, emask, t, NP, E, logits_ptr, ids_ptr, tw_ptr, counter_ptr, acc_ptr, EP2, IDXB, TOPK, TOPK_P2, TAP
    )


@triton.jit
def _topk_kernel(
    acc_ptr,  # fp32 [M, E]: the router GEMM output (fp32 sums)
    logits_ptr,  # bf16 [M, E]: bf16_rn of acc (the `logits` tap; written only when TAP)
    ids_ptr,  # int32 [M, TOPK]
    tw_ptr,  # fp32 [M, TOPK]
    E,
    EP2: tl.constexpr,
    IDXB: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
    TAP: tl.constexpr,
):
    """Rule step 1's bf16 cast (``cvt.rn.bf16.f32``) + steps 2-4 for token t = program_id(0)."""
    t = tl.program_id(0).to(tl.int64)
    gdc_wait()
    offs = tl.arange(0, EP2)
    m = offs < E
    acc = tl.load(acc_ptr + t * E + offs, mask=m, other=0.0)
    vals = bf16_rn(acc)
    if TAP:
        tl.store(logits_ptr + t * E + offs, vals, mask=m)
    gdc_launch_dependents()
    _topk_row(vals, offs, E, ids_ptr + t * TOPK, tw_ptr + t * TOPK, EP2, IDXB, TOPK, TOPK_P2)


# ---------------------------------------------------------------------------------------------------------
# launchers (inputs are validated by flint_moe.ops.route)
# ---------------------------------------------------------------------------------------------------------


def router_config(num_experts: int, hidden: int, top_k: int) -> dict[str, int]:
    """Compile-time parameters of both kernels for (E, H, k): EB (experts per GEMV program; 2 on the GPU),
    BLOCK_H (lanes
    per expert row, a power of two), LOG_BH, EP2 (power of two >= E), IDXB = log2 EP2, TOPK_P2."""
    ep2 = triton.next_power_of_2(num_experts)
    block_h = min(1024, max(16, triton.next_power_of_2(hidden)))
    # GPU: 2 experts per program (E / 2 programs per token keep the SMs busy at M = 1). The interpreter's cost
    # is per program, so it takes up to 32 programs per token (same code, another constexpr).
    eb = max(2, ep2 // 32) if INTERPRET else 2
    return {
        "EB": eb,
        "BLOCK_H": block_h,
        "LOG_BH": block_h.bit_length() - 1,
        "EP2": ep2,
        "IDXB": ep2.bit_length() - 1,
        "TOPK_P2": triton.next_power_of_2(top_k),
    }


def _outputs(m: int, top_k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.empty((m, top_k), dtype=torch.int32, device=device)
    tw = torch.empty((m, top_k), dtype=torch.float32, device=device)
    return ids, tw


def launch_router_gemv_topk(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int, counter: torch.Tensor, *, taps: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused router GEMV + top-k: x bf16 [M, H], router_weight bf16 [E, H], counter int32 [>= M] ->
    (ids int32 [M, k], weights fp32 [M, k]). Inputs are assumed valid (``flint_moe.ops.route`` checks them).
    With ``taps``: fills ``router_acc`` fp32 [M, E], ``logits`` bf16 [M, E], ``ids``, ``weights``."""
    m, h = x.shape
    e = router_weight.shape[0]
    cfg = router_config(e, h, top_k)
    ids, tw = _outputs(m, top_k, x.device)
    logits = torch.empty((m, e), dtype=torch.bfloat16, device=x.device)
    tap = taps is not None
    acc = torch.empty((m, e), dtype=torch.float32, device=x.device) if tap else logits
    if m:
        grid = (m, triton.cdiv(e, cfg["EB"]))
        _router_gemv_topk_kernel[grid](
            x, router_weight, logits, ids, tw, counter, acc, e,
            H=h, TOPK=top_k, TAP=tap, num_warps=_NUM_WARPS, **cfg, **launch_options(),
        )  # fmt: skip
    if tap:
        taps.update(router_acc=acc, logits=logits, ids=ids, weights=tw)
    return ids, tw


def launch_topk(
    acc: torch.Tensor, top_k: int, *, taps: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 cast + top-k of fp32 router sums acc [M, E] (contiguous) -> (ids int32 [M, k], weights fp32
    [M, k]). With ``taps``: fills ``router_acc`` (= acc), ``logits`` bf16 [M, E], ``ids``, ``weights``."""
    m, e = acc.shape
    cfg = router_config(e, 1, top_k)
    ids, tw = _outputs(m, top_k, acc.device)
    tap = taps is not None
    logits = torch.empty((m, e), dtype=torch.bfloat16, device=acc.device) if tap else acc
    if m:
        _topk_kernel[(m,)](
            acc, logits, ids, tw, e,
            EP2=cfg["EP2"], IDXB=cfg["IDXB"], TOPK=top_k, TOPK_P2=cfg["TOPK_P2"], TAP=tap,
            num_warps=_NUM_WARPS, **launch_options(),
        )  # fmt: skip
    if tap:
        taps.update(router_acc=acc, logits=logits, ids=ids, weights=tw)
    return ids, tw


# ---------------------------------------------------------------------------------------------------------
# sm_90 PTX audit: the conformance matrix's router shapes
# ---------------------------------------------------------------------------------------------------------

#: (name, E, H, k) of the conformance matrix (DeepSeek-V3, Kimi-K2, Qwen3-Next, GLM-4.5, gpt-oss). The TAP
#: build is audited for the first shape only (it differs by one store; compiles cost ~3 s each).
AUDIT_SHAPES = (
    ("E256_k8", 256, 7168, 8),
    ("E384_k8", 384, 7168, 8),
    ("E512_k10", 512, 2048, 10),
    ("E160_k6", 160, 5120, 6),
    ("E128_k4", 128, 2880, 4),
)

_REQUIRE = [BF16_CVT, "div.rn.f32", *EXPF_LIBDEVICE, "griddepcontrol.wait"]


def audit_specs() -> None:
    """Register the GEMV+top-k and top-k specialisations of AUDIT_SHAPES, production and TAP builds."""
    for i, (name, e, h, k) in enumerate(AUDIT_SHAPES):
        cfg = router_config(e, h, k)
        for tap in (False, True) if i == 0 else (False,):
            suffix = f"{name}" + ("_tap" if tap else "")
            register_audit(
                f"router.gemv_topk.{suffix}",
                _router_gemv_topk_kernel,
                {
                    "x_ptr": "*bf16",
                    "w_ptr": "*bf16",
                    "logits_ptr": "*bf16",
                    "ids_ptr": "*i32",
                    "tw_ptr": "*fp32",
                    "counter_ptr": "*i32",
                    "acc_ptr": "*fp32" if tap else "*bf16",
                    "E": "i32",
                },  # fmt: skip
                {**cfg, "H": h, "TOPK": k, "TAP": tap},
                [*_REQUIRE, "atom.global.gpu.acq_rel.add"],
                options={"num_warps": _NUM_WARPS},
            )
            register_audit(
                f"router.topk.{suffix}",
                _topk_kernel,
                {
                    "acc_ptr": "*fp32",
                    "logits_ptr": "*bf16" if tap else "*fp32",
                    "ids_ptr": "*i32",
                    "tw_ptr": "*fp32",
                    "E": "i32",
                },  # fmt: skip
                {"EP2": cfg["EP2"], "IDXB": cfg["IDXB"], "TOPK": k, "TOPK_P2": cfg["TOPK_P2"], "TAP": tap},
                _REQUIRE,
                options={"num_warps": _NUM_WARPS},
            )


audit_specs()
