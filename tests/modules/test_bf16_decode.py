"""``FlintBf16DecodeMoE`` (flint_moe/modules/bf16_decode.py): forward over an existing TRT-LLM-layout BF16 layer
== ``flint_moe.ops.flint_moe_bf16_decode`` bit for bit, reading the layer's storage (no copy), both accepted
parameter shapes, shape / dtype rejections, and (GPU) CUDA-graph replay == eager with the shared expert on the
auxiliary stream.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.modules import FlintBf16DecodeMoE
from flint_moe.modules.bf16_decode import trtllm_bf16_views
from flint_moe.ops import flint_moe_bf16_decode, make_route_counter
from tests.kernels._nvfp4_check import check_graph_replays


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


class _Layer(nn.Module):
    """Stand-in for a FusedMoE layer holding TRT-LLM BF16 weights as parameters."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.w13_weight = nn.Parameter(w13, requires_grad=False)
        self.w2_weight = nn.Parameter(w2, requires_grad=False)


def _layer(E, H, I, seed, device="cpu"):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) * 0.05).bfloat16()
    g1, g2 = to_trtllm_bf16(w13, w2)
    return g1.to(device), g2.to(device)


E, H, I, K = 6, 64, 64, 2  # noqa: E741


def test_forward_equals_op_without_copy() -> None:
    g1, g2 = _layer(E, H, I, 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, H, generator=g).bfloat16()
    router = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
    shared_lin = nn.Linear(H, H, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        shared = shared_lin(x)
        ref = flint_moe_bf16_decode(x, router, g1, g2, trtllm_bf16_row_maps(H, I), K, make_route_counter(), shared)
        mod = FlintBf16DecodeMoE(E, H, I, K)
        # parameters in the 4-D BlockMajorK shape, and the same bytes in the checkpoint shape [E, 2I, H] / [E, H, I]
        flat = _Layer(g1.reshape(E, 2 * I, H), g2.reshape(E, H, I))
        for layer in (_Layer(g1, g2), flat, (g1, g2)):
            assert _same(mod(x, router, layer, shared), ref)
        assert _same(mod(x, router, flat, shared_lin), ref)  # shared module, run inline on the CPU
    # taps (for the conformance harness's bf16_module path): the op's raw accumulators, same output
    taps_mod, taps_op = {}, {}
    with torch.no_grad():
        out = FlintBf16DecodeMoE(E, H, I, K)(x, router, (g1, g2), shared, taps=taps_mod)
        flint_moe_bf16_decode(x, router, g1, g2, trtllm_bf16_row_maps(H, I), K, make_route_counter(), shared,
                              taps=taps_op)  # fmt: skip
    assert _same(out, ref) and taps_op and sorted(taps_mod) == sorted(taps_op)
    for name, t in taps_op.items():
        u = taps_mod[name]
        assert isinstance(t, torch.Tensor) and u.shape == t.shape and u.dtype == t.dtype
        assert torch.equal(u.view(torch.uint8), t.view(torch.uint8)), name
    v1, v2 = trtllm_bf16_views(flat.w13_weight.data, flat.w2_weight.data, E, H, I)
    assert v1.data_ptr() == g1.data_ptr() and v2.data_ptr() == g2.data_ptr()  # views, no copy
    assert v1.shape == (E, H // 64, 2 * I, 64) and v2.shape == (E, I // 64, H, 64)


def test_rejections() -> None:
    g1, g2 = _layer(E, H, I, 2)
    x = torch.zeros(1, H, dtype=torch.bfloat16)
    router = torch.zeros(E, H, dtype=torch.bfloat16)
    shared = torch.zeros(1, H, dtype=torch.bfloat16)
    mod = FlintBf16DecodeMoE(E, H, I, K)
    other = _layer(E, H, 128, 3)
    with pytest.raises(
        ValueError, match=r"^w13_weight: expected the TRT-LLM BF16 .* \(6, 1, 128, 64\) .* got \(6, 1, 256, 64\)"
    ):
        mod(x, router, other, shared)
    with pytest.raises(ValueError, match=r"^w2_weight: expected .* \(6, 1, 64, 64\) .* got \(6, 2, 64, 64\)"):
        mod(x, router, (g1, other[1]), shared)
    with pytest.raises(TypeError, match=r"^w13_weight: dtype must be torch.bfloat16, got torch.float32"):
        mod(x, router, (g1.float(), g2), shared)
    with pytest.raises(ValueError, match=r"^w13_weight: a \(6, 128, 64\) tensor holding BlockMajorK bytes must be"):
        mod(x, router, (g1.reshape(E, 2 * I, H).transpose(1, 2).contiguous().transpose(1, 2), g2), shared)
    with pytest.raises(TypeError, match=r"^routed_experts: Linear has no w13_weight"):
        mod(x, router, nn.Linear(2, 2), shared)
    with pytest.raises(TypeError, match=r"^routed_experts: expected an nn.Module"):
        mod(x, router, g1, shared)
    for args, pattern in (
        ((E, 96, I, K), r"^hidden_size: must be a positive int multiple of 64, got 96"),
        ((E, H, 48, K), r"^intermediate_size: must be a positive int multiple of 64, got 48"),
        ((E, H, I, 0), r"^top_k: must be a positive int"),
        ((4, H, I, 5), r"^top_k: must satisfy 1 <= top_k <= min\(E = 4, 16\), got 5"),
    ):
        with pytest.raises(ValueError, match=pattern):
            FlintBf16DecodeMoE(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 8])
def test_cuda_graph_replay_equals_eager(M: int) -> None:
    E2, H2, I2, K2 = 128, 2048, 768, 8
    g1, g2 = _layer(E2, H2, I2, M, device="cuda")
    layer = _Layer(g1, g2)
    g = torch.Generator().manual_seed(20 + M)
    x = torch.randn(M, H2, generator=g).bfloat16().cuda()
    router = (torch.randn(E2, H2, generator=g) * 0.1).bfloat16().cuda()
    shared_mod = nn.Linear(H2, H2, bias=False).to(torch.bfloat16).cuda()
    mod = FlintBf16DecodeMoE(E2, H2, I2, K2, device="cuda")
    with torch.no_grad():
        eager = mod(x, router, layer, shared_mod)
        assert _same(eager, mod(x, router, layer, shared_mod(x)))
        renew = lambda: x.copy_(torch.randn(M, H2, generator=g).bfloat16())  # noqa: E731
        check_graph_replays(lambda: mod(x, router, layer, shared_mod), eager, renew, _same)


def test_check_row_maps_reports_a_buffer_written_through_data() -> None:
    """A row-map buffer changed through ``.data`` (its version counter unchanged): forward reads no row
    outside the layer (a value out of range reads the layout's row: same output), ``check_row_maps`` names
    the entry, and the next forward checks the buffer again (ValueError while it stays wrong)."""
    g1, g2 = _layer(E, H, I, 4)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, H, generator=g).bfloat16()
    router = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
    shared = torch.zeros(1, H, dtype=torch.bfloat16)
    mod = FlintBf16DecodeMoE(E, H, I, K)
    ref = mod(x, router, (g1, g2), shared)
    mod.check_row_maps()
    good = int(mod.row_map2[9])
    mod.row_map2.data[9] = -(1 << 24)
    assert _same(mod(x, router, (g1, g2), shared), ref)
    with pytest.raises(RuntimeError, match=rf"^row_maps\[1\]: .* entry 9 holds -16777216, the layout's value is "
                       rf"{good}\. "):  # fmt: skip
        mod.check_row_maps()
    with pytest.raises(ValueError, match=r"^row_maps\[1\]: not the TRT-LLM BF16 row map"):
        mod(x, router, (g1, g2), shared)
    mod.row_map2.data[9] = good
    assert _same(mod(x, router, (g1, g2), shared), ref)
    mod.check_row_maps()


@pytest.mark.gpu
def test_row_map_fault_reported_after_cuda_graph_replay() -> None:
    """A map buffer written through ``.data`` after capture: the replay reads no row outside the layer and
    ``check_row_maps`` reports the entry; repaired, the replay gives the eager bits again."""
    E2, H2, I2, K2 = 16, 256, 128, 4
    g1, g2 = _layer(E2, H2, I2, 7, device="cuda")
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, H2, generator=g).bfloat16().cuda()
    router = (torch.randn(E2, H2, generator=g) * 0.1).bfloat16().cuda()
    shared = torch.zeros(2, H2, dtype=torch.bfloat16, device="cuda")
    mod = FlintBf16DecodeMoE(E2, H2, I2, K2, device="cuda")
    eager = mod(x, router, (g1, g2), shared)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mod(x, router, (g1, g2), shared)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod(x, router, (g1, g2), shared)
    graph.replay()
    mod.check_row_maps()
    assert _same(out, eager)
    good = mod.row_map13.clone()
    mod.row_map13.data[2 * I2 - 1] = 1 << 30
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, eager)  # out of range: the layout's own row
    with pytest.raises(RuntimeError, match=rf"^row_maps\[0\]: the map13 tensor on cuda:0 .* entry {2 * I2 - 1} "):
        mod.check_row_maps()
    mod.row_map13.data.copy_(good)
    graph.replay()
    mod.check_row_maps()
    assert _same(out, eager)
