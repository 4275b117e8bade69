"""``FlintNvfp4Experts`` (flint_moe/modules/nvfp4_experts.py): loading per-expert ModelOpt tensors in any order,
the repack (bitwise ``FlintMoEWeights.from_modelopt`` of the same stack), forward == ``flint_moe.ops.flint_moe``
bit for bit (shared output given as a tensor or as a module), every rejection, and (GPU) CUDA-graph replay ==
eager and the load-time compile.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from flint_moe.layouts import FlintMoEWeights
from flint_moe.modules import FlintNvfp4Experts
from flint_moe.modules.nvfp4_experts import warmup_token_counts
from flint_moe.ops import decode_max_tokens, flint_moe, make_route_counter
from tests.kernels._nvfp4_check import check_graph_replays

FP8 = torch.float8_e4m3fn


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a.cpu()), _bits(b.cpu()))


def _checkpoint(E, H, I, seed=0):  # noqa: E741
    """Random ModelOpt per-expert tensors {name: tensor} and the same data stacked [gate; up]."""
    g = torch.Generator().manual_seed(seed)
    sc = lambda *s: torch.randint(0x28, 0x48, s, generator=g, dtype=torch.uint8).view(FP8)  # noqa: E731
    named = {}
    for e in range(E):
        for proj, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            named[f"{e}.{proj}.weight"] = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
            named[f"{e}.{proj}.weight_scale"] = sc(n, k // 16)
            named[f"{e}.{proj}.input_scale"] = torch.tensor(3.0)
        gs13 = torch.rand((), generator=g) * 2.0**-6 + 2.0**-9
        named[f"{e}.gate_proj.weight_scale_2"] = gs13.clone()
        named[f"{e}.up_proj.weight_scale_2"] = gs13.clone().reshape(1)  # [1] accepted as well as 0-d
        named[f"{e}.down_proj.weight_scale_2"] = torch.rand((), generator=g) * 2.0**-6 + 2.0**-9
    st = lambda p, k: torch.stack([named[f"{e}.{p}.{k}"] for e in range(E)])  # noqa: E731
    stacked = (
        torch.cat([st("gate_proj", "weight"), st("up_proj", "weight")], 1),
        torch.cat([st("gate_proj", "weight_scale"), st("up_proj", "weight_scale")], 1),
        st("gate_proj", "weight_scale_2").reshape(E),
        st("down_proj", "weight"),
        st("down_proj", "weight_scale"),
        st("down_proj", "weight_scale_2").reshape(E),
    )
    return named, stacked


def _load_shuffled(mod: FlintNvfp4Experts, named: dict, seed: int = 1) -> None:
    items = list(named.items())
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    half = len(order) // 2
    mod.load_weights(items[i] for i in order[:half])
    assert not mod.loaded
    mod.load_weights(items[i] for i in order[half:])


def _same_weights(a: FlintMoEWeights, b: FlintMoEWeights) -> None:
    for f in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
        assert _same(getattr(a, f), getattr(b, f)), f
    assert a.valid_intermediate == b.valid_intermediate


E, H, I, K = 6, 96, 64, 3  # noqa: E741


def test_load_repack_forward_cpu() -> None:
    named, stacked = _checkpoint(E, H, I)
    keep = {n: t.clone() for n, t in named.items()}
    mod = FlintNvfp4Experts(E, H, I, K, max_num_tokens=16)
    with pytest.raises(RuntimeError, match=r"^FlintNvfp4Experts: forward before loading completed \(0 tensors"):
        mod(torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(E, H, dtype=torch.bfloat16), torch.zeros(1, H))
    _load_shuffled(mod, named)
    assert mod.loaded and mod._stack is None  # checkpoint-layout buffers released
    assert mod.compiled_token_counts == []  # CPU: nothing compiled
    for n, t in named.items():
        assert _same(t, keep[n]), f"{n} was modified"
    want = FlintMoEWeights.from_modelopt(*stacked)
    _same_weights(mod.weights, want)
    # the unpadded repack is in place: w1 is the module's own former w13 stack (no second copy kept)
    assert mod.weights.w1.untyped_storage().nbytes() == E * 2 * I * H // 2

    g = torch.Generator().manual_seed(2)
    M = 2
    x = torch.randn(M, H, generator=g).bfloat16()
    router = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
    shared_lin = nn.Linear(H, H, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        shared_lin.weight.copy_((torch.randn(H, H, generator=g) * 0.05).bfloat16())
        shared = shared_lin(x)
        ref = flint_moe(x, router, want, K, make_route_counter(), shared)
        out_t = mod(x, router, shared)
        out_m = mod(x, router, shared_lin)  # module: run inline on the CPU
    assert _same(out_t, ref) and _same(out_m, ref)
    with pytest.raises(ValueError, match=r"^0.gate_proj.weight: every expert is already loaded"):
        mod.load_weights([("0.gate_proj.weight", named["0.gate_proj.weight"])])
    with pytest.raises(TypeError, match=r"^shared: expected a tensor or an nn.Module, got int"):
        mod(x, router, 3)


def test_padded_intermediate() -> None:
    named, stacked = _checkpoint(4, 64, 48, seed=5)
    with pytest.raises(ValueError, match=r"^intermediate_size: 48 is not a multiple of 64 .*pad_intermediate_to=64"):
        FlintNvfp4Experts(4, 64, 48, 2)
    mod = FlintNvfp4Experts(4, 64, 48, 2, pad_intermediate_to=64)
    mod.load_weights(named.items())
    _same_weights(mod.weights, FlintMoEWeights.from_modelopt(*stacked, pad_intermediate_to=64))
    assert mod.weights.valid_intermediate == 48 and mod.weights.intermediate_size == 64


def _expect(named: dict, name: str, value, exc, pattern: str) -> None:
    mod = FlintNvfp4Experts(E, H, I, K)
    rest = [(n, t) for n, t in named.items() if n != name]
    with pytest.raises(exc, match=pattern):
        mod.load_weights([(name, value), *rest])  # the bad tensor first: loading stops there


def test_rejections() -> None:
    named, _ = _checkpoint(E, H, I)
    nan = named["4.down_proj.weight_scale"].clone()
    nan.view(torch.uint8)[7, 2] = 0xFF
    _expect(
        named,
        "4.down_proj.weight_scale",
        nan,
        ValueError,
        r"^4.down_proj.weight_scale: E4M3 NaN scale byte 0xFF at index \(7, 2\)",
    )
    nan7f = named["0.gate_proj.weight_scale"].clone()
    nan7f.view(torch.uint8)[0, 0] = 0x7F
    _expect(named, "0.gate_proj.weight_scale", nan7f, ValueError, r"NaN scale byte 0x7F at index \(0, 0\)")
    _expect(
        named,
        "1.up_proj.weight_scale_2",
        torch.tensor(0.25),
        ValueError,
        r"^w13_scale_2: gate and up global scales differ for experts \[1\]",
    )
    _expect(
        named,
        "1.up_proj.weight",
        named["1.up_proj.weight"][:, :8],
        ValueError,
        r"^1.up_proj.weight: dimension 1 must be 48",
    )
    _expect(
        named,
        "2.down_proj.weight",
        named["2.down_proj.weight"].float(),
        TypeError,
        r"^2.down_proj.weight: dtype must be torch.uint8 or torch.int8",
    )
    _expect(
        named,
        "2.down_proj.weight_scale_2",
        torch.tensor(float("nan")),
        ValueError,
        r"^2.down_proj.weight_scale_2: global scale must be finite and >= \+0\.0, got nan",
    )
    _expect(
        named,
        "2.down_proj.weight_scale_2",
        torch.tensor(-0.0),
        ValueError,
        r"^2.down_proj.weight_scale_2: global scale must be finite and >= \+0\.0, got -0\.0",
    )
    _expect(
        named,
        "2.down_proj.weight_scale_2",
        torch.ones(2),
        ValueError,
        r"^2.down_proj.weight_scale_2: expected one fp32 global scale, got shape \(2,\)",
    )
    _expect(
        named,
        "6.gate_proj.weight",
        named["0.gate_proj.weight"],
        ValueError,
        r"^6.gate_proj.weight: expert index 6 out of range \[0, 6\)",
    )
    _expect(named, "0.w1.weight", named["0.gate_proj.weight"], ValueError, r"^0.w1.weight: unknown expert tensor name")
    _expect(named, "0.gate_proj.bias", named["0.gate_proj.weight"], ValueError,
            r"^0.gate_proj.bias: unknown expert tensor name")  # fmt: skip
    mod = FlintNvfp4Experts(E, H, I, K)
    with pytest.raises(ValueError, match=r"gate and up global scales differ for experts \[1\]"):
        mod.load_weights([("1.up_proj.weight_scale_2", torch.tensor(0.25)),
                          *((n, t) for n, t in named.items() if n != "1.up_proj.weight_scale_2")])  # fmt: skip
    with pytest.raises(RuntimeError, match=r"^FlintNvfp4Experts: loading failed: w13_scale_2: gate and up"):
        mod(torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(E, H, dtype=torch.bfloat16), torch.zeros(1, H))
    mod = FlintNvfp4Experts(E, H, I, K)
    mod.load_weights([("3.up_proj.weight", named["3.up_proj.weight"])])
    with pytest.raises(ValueError, match=r"^3.up_proj.weight: loaded twice"):
        mod.load_weights([("3.up_proj.weight", named["3.up_proj.weight"])])
    # incomplete: forward names what is missing
    rest = [(n, t) for n, t in named.items() if n not in ("3.up_proj.weight", "5.down_proj.weight_scale")]
    mod.load_weights(rest)
    with pytest.raises(RuntimeError, match=r"forward before loading completed .*missing e.g. 5.down_proj.weight_scale"):
        mod(torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(E, H, dtype=torch.bfloat16), torch.zeros(1, H))
    for args, pattern in (
        ((0, H, I, 1), r"^num_experts: must be a positive int"),
        ((E, H, I, 7), r"^top_k: must satisfy 1 <= top_k <= min\(E = 6, 16\), got 7"),
        ((E, 40, I, K), r"^hidden_size: must be a positive int multiple of 16, got 40"),
        ((E, H, I, K, -1), r"^max_num_tokens: must be an int >= 0"),
    ):
        with pytest.raises(ValueError, match=pattern):
            FlintNvfp4Experts(*args)


def test_expert_indices_are_canonical_and_every_slot_counts() -> None:
    named, _ = _checkpoint(E, H, I)
    # expert 5's down weight is absent; expert 0's spelt '00' must not fill in for it (nor count towards completion)
    items = [(n, t) for n, t in named.items() if n != "5.down_proj.weight"]
    mod = FlintNvfp4Experts(E, H, I, K)
    with pytest.raises(ValueError, match=r"^00.down_proj.weight: expert index '00' is not a canonical decimal integer"):
        mod.load_weights([*items, ("00.down_proj.weight", named["0.down_proj.weight"])])
    assert not mod.loaded
    with pytest.raises(RuntimeError, match=r"forward before loading completed .*missing e.g. 5.down_proj.weight\)$"):
        mod(torch.zeros(1, H, dtype=torch.bfloat16), torch.zeros(E, H, dtype=torch.bfloat16), torch.zeros(1, H))
    for index in ("+3", " 3", "3 ", "\u0663", "03"):  # U+0663: ARABIC-INDIC DIGIT THREE (int() reads it as 3)
        mod = FlintNvfp4Experts(E, H, I, K)
        name = f"{index}.gate_proj.weight"
        with pytest.raises(ValueError, match=rf"^{re.escape(name)}: expert index {re.escape(repr(index))} is not a"):
            mod.load_weights([(name, named["3.gate_proj.weight"])])
    mod = FlintNvfp4Experts(E, H, I, K)
    with pytest.raises(
        ValueError, match=r"^99999999999.up_proj.weight: expert index '99999999999' out of range \[0, 6\)"
    ):
        mod.load_weights([("99999999999.up_proj.weight", named["0.up_proj.weight"])])


def test_warmup_token_counts() -> None:
    # the decode limit load_weights passes is the op's, per shape (ops.decode_max_tokens): every M up to it
    # Qwen3 (E 128, k 8): limit 16; M 17..26 average ceil(M / 16) = 2 pairs per expert, one row block of 16
    # (smallest 17, largest 26, no multiple of 16)
    assert decode_max_tokens(128, 8) == 16
    assert warmup_token_counts(26, decode_max_tokens(128, 8), 8, 128) == [*range(1, 18), 26]
    # DeepSeek-V3 (E 256, k 8): limit 24; M 25..40 average ceil(M / 32) = 1 or 2 pairs, one row block of 16
    # (smallest 25, largest 40, smallest multiple of 16: 32)
    assert decode_max_tokens(256, 8) == 24
    assert warmup_token_counts(40, decode_max_tokens(256, 8), 8, 256) == [*range(1, 26), 32, 40]
    assert warmup_token_counts(0, 8) == []
    assert warmup_token_counts(5, 8) == [1, 2, 3, 4, 5]
    assert warmup_token_counts(8, 8) == list(range(1, 9))
    assert warmup_token_counts(9, 8) == list(range(1, 10))
    # k = 1, E = 1: M pairs on one expert -> row block 16 (M <= 16), 32 (<= 32), 64 (<= 64), 128 above;
    # per block: smallest M, largest M, smallest multiple of 16 (none in 33..40)
    assert warmup_token_counts(40, 8) == [*range(1, 10), 16, 17, 32, 33, 40]
    # k = 8, E = 256 (DeepSeek): mean pairs per expert ceil(M / 32): block 16 up to M = 512, 32 up to 1024,
    # 64 up to 2048, 128 up to 4096, 256 above (grouped_config caps BM at 256)
    assert warmup_token_counts(16384, 8, 8, 256) == [
        *range(1, 10),
        16,
        512,
        513,
        528,
        1024,
        1025,
        1040,
        2048,
        2049,
        2064,
        4096,
        4097,
        4112,
        16384,
    ]


# ------------------------------------------------------------------------------------------------------
# GPU: load-time compile, CUDA graph capture / replay == eager, shared expert on the auxiliary stream
# ------------------------------------------------------------------------------------------------------


class _SharedMLP(nn.Module):
    def __init__(self, h: int, g: torch.Generator) -> None:
        super().__init__()
        self.w = nn.Parameter((torch.randn(h, h, generator=g) * 0.05).bfloat16(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x @ self.w.t())


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 5, 8, 12, 16, 17])
def test_cuda_graph_replay_equals_eager(M: int) -> None:
    """E 64, k 4: ``flint_moe`` runs the decode kernels up to M = 16 (``ops.decode_max_tokens``: 64 // 4; past 8
    the router GEMM feeds them), the grouped path at 17; the load compiles every M up to 17."""
    E2, H2, I2, K2 = 64, 2048, 768, 4
    named, _ = _checkpoint(E2, H2, I2, seed=M)
    mod = FlintNvfp4Experts(E2, H2, I2, K2, max_num_tokens=17, device="cuda")
    mod.load_weights((n, t.cuda()) for n, t in named.items())
    assert decode_max_tokens(E2, K2) == 16 and mod.compiled_token_counts == list(range(1, 18))
    g = torch.Generator().manual_seed(10 + M)
    x = torch.randn(M, H2, generator=g).bfloat16().cuda()
    router = (torch.randn(E2, H2, generator=g) * 0.1).bfloat16().cuda()
    shared_mod = _SharedMLP(H2, g).cuda()
    with torch.no_grad():
        eager_m = mod(x, router, shared_mod)
        eager_t = mod(x, router, shared_mod(x))
        assert _same(eager_m, eager_t)
        renew = lambda: x.copy_(torch.randn(M, H2, generator=g).bfloat16())  # noqa: E731
        check_graph_replays(lambda: mod(x, router, shared_mod), eager_m, renew, _same)
