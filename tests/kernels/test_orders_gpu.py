"""Declared summation orders on the H200 (marked gpu): every tapped fp32 accumulator equals the golden model's
replay of its kernel's declaration (flint_moe.kernels.orders, flint_moe.reference.orders) bit for bit.

Random data, small shapes and DeepSeek-V3's H = 7168, I = 2048 (16 experts, random ids); each kernel with its
default launch configuration and the harness's other configurations. Down accumulators are replayed from the
kernel's own ``act`` tap (teacher forcing). Tensor-core orders need the bit-accurate MMA model
``flint_moe.reference.mma`` (``needs_mma``); a tree without it skips those tests with that reason.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from flint_moe.kernels import orders as K
from flint_moe.reference.formats import E2M1_VALUES, e4m3_to_float, to_bf16
from flint_moe.reference.layouts import decode_trtllm_bf16, experts_from_cutedsl
from flint_moe.reference.orders import order_summary, replay_matmul
from flint_moe.reference.weights import scale_bytes

pytestmark = pytest.mark.gpu

HAS_MMA_MODEL = importlib.util.find_spec("flint_moe.reference.mma") is not None
needs_mma = pytest.mark.skipif(
    not HAS_MMA_MODEL, reason="flint_moe.reference.mma (the bit-accurate tensor-core model) is not in this tree"
)
DEV = "cuda"


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """int64 keys, monotone in the fp32 value (-0 and +0 one apart): ulp distance = key difference."""
    b = t.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(b < 0, -(b & 0x7FFFFFFF) - 1, b)


def assert_bitwise(kernel: torch.Tensor, replay: torch.Tensor, what: str, order: dict) -> None:
    """Bitwise equality (NaN as NaN-ness); on failure: how many differ, the first ones with ulp distances."""
    kernel, replay = kernel.reshape(replay.shape), replay
    kn, rn = torch.isnan(kernel), torch.isnan(replay)
    diff = (kernel.view(torch.int32) != replay.view(torch.int32)) & ~(kn & rn)
    n = int(diff.sum())
    if n:
        idx = diff.nonzero()[:8]
        ulps = (_ordered(kernel) - _ordered(replay)).abs()
        lines = [
            f"  {tuple(i.tolist())}: kernel {kernel[tuple(i)].item()!r} replay {replay[tuple(i)].item()!r} "
            f"({int(ulps[tuple(i)])} ulp)"
            for i in idx
        ]
        raise AssertionError(
            f"{what}: {n} of {kernel.numel()} accumulators differ from the replay of the declared order "
            f"[{order_summary(order)}]; max {int(ulps[diff].max())} ulp; first:\n" + "\n".join(lines)
        )


_E2M1 = None


def _values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> E2M1 values fp32 [..., K] (low nibble = even element)."""
    global _E2M1
    if _E2M1 is None:
        _E2M1 = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=DEV)
    n = torch.stack((codes & 15, codes >> 4), dim=-1).reshape(*codes.shape[:-1], -1).long()
    return _E2M1[n]


def _scales(s: torch.Tensor) -> torch.Tensor:
    return e4m3_to_float(scale_bytes(s)).to(torch.float32)


def _nvfp4_layer(E, H, I, seed, pad_to=None):  # noqa: E741
    """Random ModelOpt NVFP4 experts on the GPU (every code, E4M3 scales of both signs in a moderate range)
    -> (FlintMoEWeights, the logical experts read back by the golden model's own decoder)."""
    from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights

    g = torch.Generator(device=DEV).manual_seed(seed)

    def scales(shape):
        b = torch.randint(50, 64, shape, generator=g, device=DEV)
        sign = torch.randint(0, 2, shape, generator=g, device=DEV) << 7
        return (b | sign).to(torch.uint8).view(torch.float8_e4m3fn)

    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, device=DEV, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), generator=g, device=DEV, dtype=torch.uint8)
    gs1 = torch.rand(E, generator=g, device=DEV) * 2.0**-6 + 2.0**-8
    gs2 = torch.rand(E, generator=g, device=DEV) * 2.0**-6 + 2.0**-8
    w = FlintMoEWeights.from_modelopt(
        w13, scales((E, 2 * I, H // 16)), gs1, w2, scales((E, H, I // 16)), gs2, pad_intermediate_to=pad_to
    )
    return w, experts_from_cutedsl(w)


def _tokens(M, H, E, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed + 77)
    x = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g, device=DEV)[:k] for _ in range(M)]).to(torch.int32)
    tw = to_bf16(torch.rand(M, k, generator=g, device=DEV) / k).float()
    shared = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    return x, ids, tw, shared


def _replay_pairs(ids, x_pairs, weights_of, order, n):
    """fp32 [M, k, n]: for every (token, slot) pair the replay of ``order`` on its input row ``x_pairs[t, j]``
    and its expert's weight rows (``weights_of(e)`` -> (values [n, K], block scales [n, K/16] or None)), one
    selected expert at a time."""
    m, k = ids.shape
    out = torch.full((m, k, n), float("nan"), dtype=torch.float32, device=DEV)
    for e in torch.unique(ids).tolist():
        t, j = torch.nonzero(ids == e, as_tuple=True)
        vals, sc = weights_of(e)
        out[t, j] = replay_matmul(order, x_pairs[t, j], vals, block_scales=sc)
    return out


def _check_nvfp4_expert_taps(L, x, ids, taps, o_gu, o_dn, what):
    """gate_acc / up_acc / down_acc taps [M, k, .] against the replays (selected experts only)."""
    m, k = ids.shape
    i, h = L.intermediate, x.shape[1]
    xp = x[:, None, :].expand(m, k, h)
    g13 = _replay_pairs(ids, xp, lambda e: (_values(L.w13[e]), _scales(L.w13_scale[e])), o_gu, 2 * i)
    assert_bitwise(taps["gate_acc"], g13[..., :i], f"{what} gate_acc", o_gu)
    assert_bitwise(taps["up_acc"], g13[..., i:], f"{what} up_acc", o_gu)
    d = _replay_pairs(ids, taps["act"], lambda e: (_values(L.w2[e]), _scales(L.w2_scale[e])), o_dn, h)
    assert_bitwise(taps["down_acc"], d, f"{what} down_acc", o_dn)


# ---------------------------------------------------------------------------------------------------------
# router
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "E,H,M", [(16, 7168, 1), (16, 7168, 8), (130, 96, 3), (256, 7168, 9), (8, 4096, 200), (130, 100, 65)]
)
def test_router_acc_equals_replay(E, H, M):
    """The GEMV kernel (M <= 8) and the tensor-core router GEMM (M > 8), both through ``route``."""
    from flint_moe.ops.route import make_route_counter, route

    g = torch.Generator(device=DEV).manual_seed(E + H + M)
    x = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    w = (torch.randn(E, H, generator=g, device=DEV) * 0.05).to(torch.bfloat16)
    taps = {}
    route(x, w, min(4, E), make_route_counter(DEV), taps=taps)
    o = K.router_order(H, M)
    assert_bitwise(taps["router_acc"], replay_matmul(o, x, w), "router_acc", o)


# ---------------------------------------------------------------------------------------------------------
# NVFP4 decode: both paths, every SK
# ---------------------------------------------------------------------------------------------------------


def _nvfp4_configs():
    from flint_moe.kernels.nvfp4 import tuned

    mma_keys = {"RT": 2, "S": 2, "FENCE": False}
    return {
        "default": (None, None, True),
        "cuda-core": (tuned.GATE_UP_CUDA_CORE, tuned.DOWN_CUDA_CORE, False),
        "mma-sk2-sk4": (
            {"MMA": True, "BN": 16, "num_warps": 4, "SK": 2, **mma_keys},
            {"MMA": True, "BH": 16, "num_warps": 4, "SK": 4, **mma_keys, "EARLY": 0, "MAXNREG": 0},
            True,
        ),
        "mma-sk1": (  # rows * SK = 8 * num_warps * RT
            {"MMA": True, "BN": 16, "num_warps": 2, "SK": 1, **mma_keys},
            {"MMA": True, "BH": 16, "num_warps": 1, "SK": 1, **mma_keys, "S": 4, "EARLY": 0, "MAXNREG": 0},
            True,
        ),
    }


_NVFP4_SHAPES = {  # name: (E, H, I, pad_to, M, k)
    "small": (9, 512, 256, None, 3, 4),
    "partial-steps": (9, 2880, 1040, 64, 2, 4),  # H/2 = 1440: a partial 64-byte step; I/2 = 520: half a chunk
    "deepseek-v3": (16, 7168, 2048, None, 1, 8),
}
#: (configuration, shape) pairs: every configuration once with a partial step or a small shape, the two
#: measured paths also at DeepSeek-V3 (each pair compiles its own kernels: H, I and the config are constexprs).
_NVFP4_CASES = [
    pytest.param(cfg, shp, marks=[needs_mma] if _nvfp4_configs()[cfg][2] else [], id=f"{cfg}-{shp}")
    for cfg, shp in (
        ("default", "small"),
        ("default", "partial-steps"),
        ("default", "deepseek-v3"),
        ("cuda-core", "partial-steps"),
        ("cuda-core", "deepseek-v3"),
        ("mma-sk2-sk4", "partial-steps"),
        ("mma-sk1", "small"),
    )
]


@pytest.mark.parametrize("cfg,shape", _NVFP4_CASES)
def test_nvfp4_decode_accumulators_equal_replay(cfg, shape):
    from flint_moe.kernels.nvfp4 import down_combine, gate_up as gu
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

    E, H, I, pad_to, M, k = _NVFP4_SHAPES[shape]  # noqa: E741
    gcfg, dcfg, _ = _nvfp4_configs()[cfg]
    w, L = _nvfp4_layer(E, H, I, seed=H + I, pad_to=pad_to)
    x, ids, tw, shared = _tokens(M, H, E, k, seed=M)
    taps = {}
    act = nvfp4_gate_up(x, ids, w, taps=taps, config=gcfg)
    nvfp4_down(act, ids, tw, w, shared, taps=taps, config=dcfg)
    o_gu = K.nvfp4_gate_up_order({**gu.default_config(H, I), **(gcfg or {})}, H)
    o_dn = K.nvfp4_down_order({**down_combine.default_config(H, I), **(dcfg or {})}, I)
    _check_nvfp4_expert_taps(L, x, ids, taps, o_gu, o_dn, f"nvfp4 decode {cfg} {shape}")


# ---------------------------------------------------------------------------------------------------------
# BF16 decode
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("E,H,I,k,M", [(8, 256, 128, 4, 3), (16, 7168, 2048, 8, 1)])
def test_bf16_decode_accumulators_equal_replay(E, H, I, k, M):  # noqa: E741
    from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps
    from flint_moe.ops.moe_bf16 import flint_moe_bf16_decode
    from flint_moe.ops.route import make_route_counter

    g = torch.Generator(device=DEV).manual_seed(E + H)
    w13 = (torch.randn(E, 2 * I, H, generator=g, device=DEV) * 0.03).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g, device=DEV) * 0.03).to(torch.bfloat16)
    g1, g2 = to_trtllm_bf16(w13, w2)
    L = decode_trtllm_bf16(g1, g2, intermediate=I)
    router = (torch.randn(E, H, generator=g, device=DEV) * 0.05).to(torch.bfloat16)
    x = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    shared = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    taps = {}
    flint_moe_bf16_decode(
        x, router, g1, g2, trtllm_bf16_row_maps(H, I, DEV), k, make_route_counter(DEV), shared, taps=taps
    )
    orders = K.bf16_decode_orders(H, I, M=M)
    assert_bitwise(taps["router_acc"], replay_matmul(orders["router"], x, router), "bf16 router_acc", orders["router"])
    ids = taps["ids"]
    xp = x[:, None, :].expand(M, k, H)
    g13 = _replay_pairs(ids, xp, lambda e: (L.w13[e].float(), None), orders["gate_up"], 2 * I)
    assert_bitwise(taps["gate_acc"], g13[..., :I], "bf16 gate_acc", orders["gate_up"])
    assert_bitwise(taps["up_acc"], g13[..., I:], "bf16 up_acc", orders["gate_up"])
    d = _replay_pairs(ids, taps["act"], lambda e: (L.w2[e].float(), None), orders["down"], H)
    assert_bitwise(taps["down_acc"], d, "bf16 down_acc", orders["down"])


# ---------------------------------------------------------------------------------------------------------
# NVFP4 grouped (tensor cores through tl.dot)
# ---------------------------------------------------------------------------------------------------------


@needs_mma
@pytest.mark.parametrize(
    "E,H,I,k,M,config",
    [(8, 512, 256, 4, 40, None), (8, 512, 256, 4, 40, {"BM": 64}), (16, 7168, 2048, 8, 16, None)],
)
def test_nvfp4_grouped_accumulators_equal_replay(E, H, I, k, M, config):  # noqa: E741
    from flint_moe.ops import flint_moe_grouped, make_route_counter

    w, L = _nvfp4_layer(E, H, I, seed=E + H)
    g = torch.Generator(device=DEV).manual_seed(M)
    x = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    router = (torch.randn(E, H, generator=g, device=DEV) * 0.05).to(torch.bfloat16)
    shared = torch.randn(M, H, generator=g, device=DEV).to(torch.bfloat16)
    taps = {}
    flint_moe_grouped(x, router, w, k, make_route_counter(DEV), shared, taps=taps, config=config)
    o = K.nvfp4_grouped_orders(H, I, M=M, config=config)
    if o["router"] is not None:  # M <= 8 only: the fused router GEMV
        assert_bitwise(taps["router_acc"], replay_matmul(o["router"], x, router), "grouped router_acc", o["router"])
    _check_nvfp4_expert_taps(L, x, taps["ids"], taps, o["gate_up"], o["down"], f"nvfp4 grouped {config}")
