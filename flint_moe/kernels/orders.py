"""Summation-order declarations of every accumulating kernel (data for ``flint_moe.reference.orders``).

Each function returns the exact order in which one kernel accumulates one fp32 dot product of length K (taps
``router_acc``, ``gate_acc`` / ``up_acc``, ``down_acc``), as a JSON-serialisable dict in the vocabulary of
:mod:`flint_moe.reference.orders` (``format`` ``flint-order/1``), built from the launch configuration (the
kernels' own config keys: ``BN``, ``BH``, ``BKB``, ``num_warps``, ``MMA``, ``SK``, ``BK``, ...) and K. The
golden model replays it (``reference.orders.replay_dot``) and a kernel's tapped accumulator must equal the
replay bit for bit.

How each order was read off the sm_90 build (``triton.compile(..., GPUTarget("cuda", 90, 32))`` on the CPU;
docs/numerics.md, "Order declarations and replay", lists the PTX / TTGIR lines):

- router GEMV: ``acc += w * x`` contracts to ``fma.rn.f32`` (no ``mul.f32`` in the loop); lanes by
  ``h % BLOCK_H``; the lane tree is explicit ``reshape`` + ``split`` (adjacent pairs).
- decode block router (``ll_router.py``): the sum of squares ``tl.fma(s, s, q)`` per lane (``h % BLOCK_H``),
  the router sums as the router GEMV (``acc += w * xn``), both with the router's adjacent-pair lane tree.
- BF16 decode: ``tl.fma`` per lane (``h % 64``), explicit adjacent-pair tree (``bf16/gemv.py``).
- NVFP4 decode, CUDA-core path (BKB = 512): read from the build the GPU runs, whose pointer arguments Triton
  specialises as 16-byte aligned (``tt.divisibility = 16``; every torch allocation is). The code tile
  ``[rows, 512]`` is ``sizePerThread [1, 16]``, ``threadsPerWarp [1, 32]``, ``warpsPerCTA [NW, 1]`` (16-byte
  ``ld.global.v4.b32``), and the ``[rows, 64 blocks, 16]`` product tile ``sizePerThread [1, 2, 16]``,
  ``threadsPerWarp [1, 32, 1]``, ``warpsPerCTA [NW, 1, 1]``: lane ``L`` holds blocks ``2 L + s`` (s = 0, 1) of
  the step whole, warps split the rows (so rows % NW == 0). A block's 16 exact products are chained in the
  thread in element order (``mul.f32`` then 15 ``fma.rn.f32``); ``fma(partial, scale, acc[slot])`` over the K
  steps; at the end the thread adds its two slots, then ``shfl.bfly`` xor 16, 8, 4, 2, 1 over the lanes (no
  shared memory). A build compiled without the alignment specialisation has another layout (and order).
- NVFP4 decode, tensor-core path: the hand-written ``mma.sync.m16n8k16`` PTX (``nvfp4/mma.py mma_ptx``): per
  64-byte step, 8 MMAs (word w = 0..3 of the chunk, half = 0..1); thread c (chunk c) gives element
  ``32 c + 8 w + 2 half + {0, 4, 1, 5}`` to k slots ``2 c + {0, 1, 8, 9}`` (the ``prmt`` re-pairing);
  weights ``E2M1 * E4M3 * 2^-8`` in bf16; the 4 accumulator columns are added with xor 2, 1 (an exact
  ``+ 0`` that turns -0 into +0), times 2^8; split-K parts ``p0 + p1`` / ``(p0 + p1) + (p2 + p3)``.
- decode block, CuTe DSL expert kernels (``kernels/cute/ll_partial.py``, the partial kernel of the gate/up and
  down host functions; read from the kernel source, every operation pinned by inline PTX): K-split s covers the
  16-element blocks ``[s * BPS, (s + 1) * BPS)``, BPS = ceil(K / 16 / S); lane l of the row's warp takes the
  blocks ``s * BPS + l + 32 j`` (j = 0, 1, ...) below the split's end and chains ``fma.rn.f32(x_h, w_h,
  acc)`` from +0 over the 16 elements of each block in order, block after block (``w_h = E2M1 * E4M3``
  exact); then the butterfly ``shfl.sync.bfly`` xor 16, 8, 4, 2, 1 with ``add.rn.f32`` (every lane ends
  with the same value; lane 0 stores it); then ``finish`` / ``combine`` add the S split partials in
  increasing split order from split 0 (``add.rn.f32``). Columns at or beyond the valid length (a padded down
  K) and the lanes past a split's last block are skipped (such a lane reads block 0 and keeps its sum by a
  select); the declaration's zero padding replays them as
  ``fma(+0, +0, acc) = acc`` (``acc`` is never -0: it starts at +0 and a sum
  that is exactly zero rounds to +0), and a split holding only such columns contributes +0, dropped.
- NVFP4 grouped: ``tl.dot`` per BK step lowers to BK / 16 ``wgmma.mma_async ... m64nNk16`` in k order,
  chained from a +0 accumulator (the scale-d predicate is constant true); BK 64 and 128 issue the same k16
  sequence (shared-memory B descriptors at byte offsets 0, 32, 64, 96, then 16384 + the same for the second
  64-column half of a BK 128 tile; one accumulator register set), so the declaration is one k16 chain.
- per-token NVFP4 x NVFP4 (``nvfp4/pertoken_fc1.py``, ``pertoken_fc2.py``): the W4A16 grouped main loop
  (``grouped_mainloop.k_loop``) on the activations' exact bf16 values, hence the grouped order on K = H (FC1)
  and K = I (FC2).
"""

from __future__ import annotations

from flint_moe.reference.orders import FORMAT, OrderError, check_order

__all__ = [
    "router_order",
    "bf16_gate_up_order",
    "bf16_down_order",
    "nvfp4_gate_up_order",
    "nvfp4_down_order",
    "nvfp4_grouped_order",
    "nvfp4_decode_orders",
    "nvfp4_grouped_orders",
    "pertoken_orders",
    "bf16_decode_orders",
    "ll_router_orders",
    "ll_expert_order",
    "ll_block_orders",
    "ll_block_extra_orders",
    "effective_split",
]


def _order(kernel: str, k: int, parts: list, plen: int, axes: list, program: list, operands: dict | None = None):
    d = {
        "format": FORMAT,
        "kernel": kernel,
        "length": int(k),
        "parts": parts,
        "part_length": int(plen),
        "axes": [[n, int(s)] for n, s in axes],
        "program": program,
    }
    if operands:
        d["operands"] = operands
    return check_order(d)


def _k(k, name: str, multiple: int = 1) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k % multiple:
        raise OrderError(f"{name}: reduction length must be a positive int multiple of {multiple}, got {k!r}")
    return k


def _lane_chains(kernel: str, k: int, lanes: int) -> dict:
    """Lane ``l`` (``h % lanes``) chains ``fma`` over ``h = l, l + lanes, ...`` from +0, then an adjacent-pair
    tree over the lanes; K padded to a multiple of ``lanes`` with zero products."""
    steps = -(-k // lanes)
    program = [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": "adjacent"},
    ]
    return _order(kernel, k, [[0, k]], steps * lanes, [["step", steps], ["lane", lanes]], program)


def router_order(H: int, M: int = 1) -> dict:
    """``router_acc`` of ``flint_moe.ops.route`` for M tokens, hidden size H. M <= 8, the fused GEMV + top-k
    kernel: lanes ``BLOCK_H = min(1024, max(16, next_pow2(H)))`` (``kernels.router.router_config``), chains
    over ``ceil(H / BLOCK_H)`` chunks, adjacent-pair tree. M > 8, the tensor-core router GEMM
    (``kernels/router_gemm.py``): K steps of ``BK`` in increasing order, each BK / 16 chained ``wgmma ... k16``
    steps from +0, k slots in element order; H zero-padded to a multiple of BK."""
    from flint_moe.kernels.router import ROUTE_GEMV_MAX_TOKENS
    from flint_moe.kernels.router_gemm import ROUTER_GEMM_CONFIG

    _k(H, "H")
    if M > ROUTE_GEMV_MAX_TOKENS:
        bk = int(ROUTER_GEMM_CONFIG["BK"])
        steps = -(-H // bk)
        axes = [["step", steps], ["k16", bk // 16], ["slot", 16]]
        program = [{"op": "mma_chain", "chain": ["step", "k16"], "slots": ["slot"], "instruction": "wgmma.m64nNk16"}]
        return _order("router_gemm", H, [[0, H]], steps * bk, axes, program, {"w_scale_log2": 0, "w_dtype": "bf16"})
    block_h = min(1024, max(16, 1 << (H - 1).bit_length()))
    return _lane_chains("router_gemv_topk", H, block_h)


def bf16_gate_up_order(config: dict | None, H: int) -> dict:
    """``gate_acc`` / ``up_acc`` of ``bf16_gate_up`` (K = H, a multiple of 64): 64 lane chains + adjacent tree,
    the same for every configuration (``bf16/gemv.py``); ``config`` is accepted and ignored."""
    return _lane_chains("bf16_gate_up", _k(H, "H", 64), 64)


def bf16_down_order(config: dict | None, Ip: int) -> dict:
    """``down_acc`` of ``bf16_down_combine`` (K = Ip, the layout's intermediate size, a multiple of 64)."""
    return _lane_chains("bf16_down_combine", _k(Ip, "Ip", 64), 64)


def effective_split(sk: int, num_warps: int, kbytes: int) -> tuple[int, int]:
    """(SK, num_warps) the tensor-core decode launchers run for a row of ``kbytes`` code bytes: SK and the warps
    halved while the last K-part would be empty (``nvfp4.config.GateUpConfig.mma_launch``)."""
    from flint_moe.kernels.nvfp4.mma import mma_part_bytes

    while sk > 1 and kbytes - (sk - 1) * mma_part_bytes(kbytes, sk) <= 0:
        sk, num_warps = sk // 2, num_warps // 2
    return sk, num_warps


def _mma_decode(kernel: str, k: int, sk: int, num_warps: int) -> dict:
    from flint_moe.kernels.nvfp4.mma import mma_part_bytes

    kbytes = k // 2
    sk, _ = effective_split(sk, num_warps, kbytes)
    if sk not in (1, 2, 4):
        raise OrderError(f"{kernel}: SK = {sk} has no declared part combine (1, 2 or 4)")
    ks = mma_part_bytes(kbytes, sk)
    parts = [[2 * h * ks, 2 * min((h + 1) * ks, kbytes)] for h in range(sk)]
    axes = [["step", ks // 64], ["c", 4], ["w", 4], ["b0", 2], ["half", 2], ["b1", 2]]
    program = [
        {"op": "mma_chain", "chain": ["step", "w", "half"], "slots": ["b1", "c", "b0"],
         "instruction": "mma.sync.m16n8k16"},
        {"op": "add_zero"},
        {"op": "scale", "log2": 8},
    ]  # fmt: skip
    if sk > 1:
        program.append({"op": "tree", "axis": "part", "shape": "adjacent"})
    return _order(kernel, k, parts, 2 * ks, axes, program, {"w_scale_log2": -8, "w_dtype": "bf16"})


def _cuda_core_decode(kernel: str, k: int, cfg: dict, rows_key: str, rows_per_key: int) -> dict:
    bkb, nw = int(cfg["BKB"]), int(cfg["num_warps"])
    if bkb != 512 or cfg.get("WORDS", False):
        raise OrderError(
            f"{kernel}: the CUDA-core order is declared for BKB = 512 without WORDS (read from the sm_90 TTGIR); "
            f"got BKB = {bkb}, WORDS = {cfg.get('WORDS', False)}"
        )
    if nw not in (1, 2, 4, 8):  # the sm_90 builds read: 1, 2, 4 and 8 warps
        raise OrderError(f"{kernel}: num_warps = {nw}: the CUDA-core order is declared for 1, 2, 4 or 8 warps")
    if rows_key not in cfg:
        raise OrderError(f"{kernel}: the CUDA-core order needs the launch configuration's {rows_key}")
    rows = rows_per_key * int(cfg[rows_key])
    if rows % nw:  # fewer rows than warps: the warps split the K step instead, another order
        raise OrderError(
            f"{kernel}: {rows} rows per program ({rows_key} = {cfg[rows_key]}) on {nw} warps: the CUDA-core order "
            "is declared only where the warps split the rows (rows a multiple of num_warps)"
        )
    kbytes = k // 2
    steps = -(-kbytes // bkb)
    axes = [["step", steps], ["lane", 32], ["slot", 2], ["e", 16]]
    program = [
        {"op": "fma_chain", "axis": "e", "init": "first"},  # the block's 16 products, in the thread
        {"op": "scale_fma_chain", "axis": "step"},  # acc[slot] = fma(partial, scale, acc[slot]) over K steps
        {"op": "add_chain", "axis": "slot", "init": "first"},  # tl.sum: the thread's two slots
        {"op": "tree", "axis": "lane", "shape": "halves"},  # shfl.bfly xor 16, 8, 4, 2, 1
    ]
    return _order(kernel, k, [[0, k]], steps * 2 * bkb, axes, program)


def nvfp4_gate_up_order(config: dict, H: int) -> dict:
    """``gate_acc`` / ``up_acc`` of ``nvfp4_gate_up`` launched with the complete ``config`` (e.g.
    ``nvfp4.gate_up.default_config(H, I)`` with overrides), K = H (a multiple of 32). MMA: the tensor-core
    order with the effective SK; else the CUDA-core block order (BKB = 512, 1, 2, 4 or 8 warps dividing the
    2 * BN rows). Raises OrderError for an undeclared configuration or a K that is not a multiple of 32."""
    _k(H, "H", 32)
    if config.get("MMA"):
        return _mma_decode("nvfp4_gate_up", H, int(config["SK"]), int(config["num_warps"]))
    return _cuda_core_decode("nvfp4_gate_up", H, config, "BN", 2)


def nvfp4_down_order(config: dict, I: int) -> dict:  # noqa: E741
    """``down_acc`` of ``nvfp4_down`` launched with the complete ``config``, K = I (the valid intermediate
    size, a multiple of 16; the padded columns are never read). CUDA-core: only the split kernel
    (``SPLIT``, the default) is declared, BKB = 512, 1, 2, 4 or 8 warps dividing the BH rows. Raises OrderError
    otherwise."""
    _k(I, "I", 16)
    if config.get("MMA"):
        return _mma_decode("nvfp4_down", I, int(config["SK"]), int(config["num_warps"]))
    if not config.get("SPLIT", True):
        raise OrderError("nvfp4_down: the sequential kernel (SPLIT = False) has no declared order")
    return _cuda_core_decode("nvfp4_down", I, config, "BH", 1)


def nvfp4_grouped_order(config: dict | None, K: int, *, kernel: str = "nvfp4_grouped") -> dict:
    """``gate_acc`` / ``up_acc`` (K = H) or ``down_acc`` (K = I) of the grouped NVFP4 GEMMs: one chain of
    ``wgmma ... k16`` steps in increasing k order from +0, k slots in element order, K zero-padded to a
    multiple of the K step ``BK``. The loop runs K steps of BK, each BK / 16 chained k16 steps on the same
    accumulator, so BK only sets the padding: ``config["BK"]`` when given, else the launchers' default
    (``nvfp4.grouped_gate_up.default_bk``: 64, or 128 where K is a multiple of 128, the same padded length).
    Weights enter as ``E2M1 * E4M3`` (bf16, exact)."""
    bk = (config or {}).get("BK")
    bk = 64 if bk is None else int(bk)
    if bk < 16 or bk % 16:
        raise OrderError(f"{kernel}: BK = {bk} must be a multiple of 16")
    _k(K, "K", 16)
    padded = -(-K // bk) * bk
    axes = [["k16", padded // 16], ["slot", 16]]
    program = [{"op": "mma_chain", "chain": ["k16"], "slots": ["slot"], "instruction": "wgmma.m64nNk16"}]
    return _order(kernel, K, [[0, K]], padded, axes, program, {"w_scale_log2": 0, "w_dtype": "bf16"})


def nvfp4_decode_orders(H: int, I: int, *, M: int = 1, gate_up: dict | None = None, down: dict | None = None):  # noqa: E741
    """Stage -> order of ``ops.flint_moe`` decode (``router``, ``gate_up``, ``down``) at (H, I) with the
    launchers' default configurations (``default_config(H, I)``) updated by ``gate_up`` / ``down``."""
    from flint_moe.kernels.nvfp4 import down_combine, gate_up as gu

    cg = {**gu.default_config(H, I), **(gate_up or {})}
    cd = {**down_combine.default_config(H, I), **(down or {})}
    return {"router": router_order(H, M), "gate_up": nvfp4_gate_up_order(cg, H), "down": nvfp4_down_order(cd, I)}


def nvfp4_grouped_orders(H: int, I: int, *, M: int, config: dict | None = None) -> dict:  # noqa: E741
    """Stage -> order of ``ops.flint_moe_grouped`` for M tokens at (H, I); ``config`` is the op's
    (``{"gate_up": {...}, "down": {...}, "BM": int, "TAIL": int}``; neither BM nor TAIL, the row-block sizes,
    changes the order)."""
    c = config or {}
    return {
        "router": router_order(H, M),
        "gate_up": nvfp4_grouped_order(c.get("gate_up"), H, kernel="nvfp4_grouped_gate_up"),
        "down": nvfp4_grouped_order(c.get("down"), I, kernel="nvfp4_grouped_down"),
    }


def bf16_decode_orders(H: int, Ip: int, *, M: int = 1) -> dict:
    """Stage -> order of ``ops.flint_moe_bf16_decode`` at hidden size H, layout intermediate size Ip."""
    return {"router": router_order(H, M), "gate_up": bf16_gate_up_order(None, H), "down": bf16_down_order(None, Ip)}


def ll_router_orders(H: int) -> dict:
    """Stage -> order of the decode block's router kernel (``kernels/ll_router.py``) at hidden size H:
    ``sumsq`` (the dot of ``s`` with itself: lane ``h % BLOCK_H`` chains ``fma.rn.f32(s_h, s_h, q)`` over the
    chunks from +0, adjacent-pair tree) and ``router`` (``router_acc``, the router GEMV's order with x = xn);
    BLOCK_H as the router GEMV kernel's (``kernels.router.router_config``). On the GPU each chain step is one
    fused rounding; under Triton's interpreter the sum of squares rounds ``s_h^2`` first."""
    _k(H, "H")
    block_h = min(1024, max(16, 1 << (H - 1).bit_length()))
    return {"sumsq": _lane_chains("ll_router_sumsq", H, block_h), "router": _lane_chains("ll_router", H, block_h)}


def ll_expert_order(kernel: str, K: int, valid: int, S: int) -> dict:  # noqa: N803
    """The order of the decode block's CuTe DSL ``partial`` kernel (module docstring) reducing ``valid``
    columns of a stored reduction length ``K`` (a multiple of 16) in ``S`` K-splits of BPS = ceil(K / 16 / S)
    blocks: parts of 16 BPS columns (the last non-empty one cut at ``valid``), each zero-padded to
    ``part_length`` = ceil(BPS / 32) * 512 (the lanes past a split's last block, which read nothing), axes
    ``j`` (ceil(BPS / 32) lane steps) x ``lane`` (32) x ``e`` (16); program: ``fma_chain`` over (j, e) from
    +0 per lane, ``tree`` over lanes (``halves``: the xor 16, ..., 1 butterfly), then the parts added in
    increasing order (``add_chain`` from the first). OrderError for lengths the kernel does not take."""
    _k(K, "K", 16)
    if not isinstance(S, int) or isinstance(S, bool) or not 1 <= S <= K // 16:
        raise OrderError(f"{kernel}: splits S = {S!r} must be an int in [1, K / 16 = {K // 16}]")
    _k(valid, "valid", 16)
    if valid > K:
        raise OrderError(f"{kernel}: valid length {valid} exceeds K = {K}")
    bps = -(-(K // 16) // S)
    steps = -(-bps // 32)
    span = 16 * bps
    parts = [[s * span, min((s + 1) * span, valid)] for s in range(S) if s * span < valid]
    program = [
        {"op": "fma_chain", "axis": ["j", "e"], "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": "halves"},
    ]
    if len(parts) > 1:
        program.append({"op": "add_chain", "axis": "part", "init": "first"})
    return _order(kernel, valid, parts, steps * 512, [["j", steps], ["lane", 32], ["e", 16]], program)


def ll_block_orders(H: int, I: int, SI: int, *, Ip: int | None = None, top_k: int = 8, E: int = 256) -> dict:  # noqa: E741, N803
    """Stage -> order of ``ops.flint_moe_ll`` for the golden model's routed stages (the ``orders`` argument of
    ``reference.model.moe_decode_block``): ``router`` (``ll_router_orders(H)["router"]``), ``gate_up``
    (K = H) and ``down`` (valid K = I of the stored Ip, default Ip = I), the K-splits as the op chooses them
    (``kernels.cute.ll_launch.plan_shapes``; they depend on H, Ip and SI only). ``top_k`` and ``E`` do not
    change an order (checked shapes only). ValueError / OrderError for shapes the kernels do not take."""
    plan = _ll_plan(H, I, SI, Ip, top_k, E)
    return {
        "router": ll_router_orders(H)["router"],
        "gate_up": ll_expert_order("ll_gate_up", H, H, plan.s_gate_up),
        "down": ll_expert_order("ll_down", plan.padded_inter, I, plan.s_down),
    }


def ll_block_extra_orders(H: int, I: int, SI: int, *, Ip: int | None = None, top_k: int = 8, E: int = 256) -> dict:  # noqa: E741, N803
    """The block's other declared accumulators (for an accumulate policy, not ``moe_decode_block``'s
    ``orders``): ``sumsq`` (``ll_router_orders(H)["sumsq"]``), ``shared_gate_up`` (taps ``shared_gate_acc`` /
    ``shared_up_acc``, K = H) and ``shared_down`` (tap ``shared_down_acc``, K = SI)."""
    plan = _ll_plan(H, I, SI, Ip, top_k, E)
    return {
        "sumsq": ll_router_orders(H)["sumsq"],
        "shared_gate_up": ll_expert_order("ll_shared_gate_up", H, H, plan.s_shared_gate_up),
        "shared_down": ll_expert_order("ll_shared_down", SI, SI, plan.s_shared_down),
    }


def _ll_plan(H, I, SI, Ip, top_k, E):  # noqa: E741, N803
    from flint_moe.kernels.cute.ll_launch import plan_shapes

    return plan_shapes(H, I, I if Ip is None else Ip, SI, E, top_k)


def pertoken_orders(H: int, I: int, *, config: dict | None = None) -> dict:  # noqa: E741
    """Stage -> order of ``ops.routed_nvfp4_moe`` at (H, I) (the valid sizes; padded columns are never read):
    ``fc1`` (``fc1_acc``, K = H) and ``fc2`` (``fc2_acc``, K = I), each K steps of ``BK`` (the op's
    ``config["fc1"]`` / ``config["fc2"]``, default 64) in increasing order, BK / 16 chained ``wgmma ... k16``
    from +0, k slots in element order, K padded to a multiple of BK with zeros; both operands enter as their
    exact ``E2M1 * E4M3`` bf16 values. The keys are the golden model's (``routed_nvfp4_moe_reference(orders=)``)."""
    c = config or {}
    return {
        "fc1": nvfp4_grouped_order(c.get("fc1"), H, kernel="pertoken_fc1"),
        "fc2": nvfp4_grouped_order(c.get("fc2"), I, kernel="pertoken_fc2"),
    }
