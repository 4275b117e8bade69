"""The decode block's entry (flint_moe/ops/moe_ll.py): ``ll_route`` under the Triton interpreter (the kernel's
stages against the golden model, fed its own taps) and every argument check of ``ll_route`` and
``check_ll_inputs``, each error naming the argument."""

from __future__ import annotations

import pytest
import torch

from flint_moe.layouts import FlintMoEWeights
from flint_moe.layouts.ll_weights import LLMoEWeights
from flint_moe.ops import flint_moe_ll, make_route_counter
from flint_moe.ops.moe_ll import LL_MOE_MAX_TOKENS, check_ll_inputs, ll_route
from flint_moe.reference.decode_block import residual_add, rmsnorm_apply
from flint_moe.reference.formats import to_bf16
from tests.kernels._router_check import check_route, same_bits
from tests.layouts._gen import nvfp4

E, H, I, SI, K = 4, 128, 64, 64, 2  # noqa: E741


def _front(m: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    attn = torch.randn(m, H, generator=g).bfloat16()
    res = torch.randn(m, H, generator=g).bfloat16()
    lnw = (torch.rand(H, generator=g) + 0.5).bfloat16()
    rw = torch.randn(E, H, generator=g).bfloat16()
    return attn, res, lnw, rw


def _weights(rw: torch.Tensor) -> LLMoEWeights:
    w13, s13, w2, s2 = nvfp4(E, H, I, 1)
    ex = FlintMoEWeights.from_modelopt(w13, s13, torch.ones(E), w2, s2, torch.ones(E))
    z = torch.zeros
    return LLMoEWeights(
        rw, ex, z(2 * SI, H // 2, dtype=torch.uint8), z(2 * SI, H // 16, dtype=torch.uint8), torch.tensor(1.0),
        z(H, SI // 2, dtype=torch.uint8), z(H, SI // 16, dtype=torch.uint8), torch.tensor(1.0),
    )  # fmt: skip


def test_ll_route_stages_match_golden() -> None:
    attn, res, lnw, rw = _front()
    taps: dict = {}
    ids, tw, xn, res_out = ll_route(attn, res, lnw, 1e-6, rw, K, make_route_counter("cpu"), taps=taps)
    s = residual_add(attn, res)
    assert same_bits(res_out, to_bf16(s))
    # eps is used as fp32(1e-6), the golden model's rounding of the same Python float
    assert same_bits(xn, rmsnorm_apply(s, taps["sumsq"], lnw, 1e-6))
    check_route(xn, rw, K, ids, tw, taps)


def test_ll_route_argument_errors() -> None:
    attn, res, lnw, rw = _front()
    c = make_route_counter("cpu")
    ok = {"attn_out": attn, "residual": res, "ln_weight": lnw, "eps": 1e-6, "router_weight": rw, "top_k": K,
          "counter": c}  # fmt: skip
    cases = [
        ({"attn_out": attn.float()}, TypeError, r"^attn_out: dtype must be torch.bfloat16"),
        ({"attn_out": attn.t()}, ValueError, r"^attn_out: must be contiguous"),
        ({"attn_out": torch.zeros(LL_MOE_MAX_TOKENS + 1, H, dtype=torch.bfloat16)}, ValueError,
         r"^attn_out: the block takes 1 <= M <= LL_MOE_MAX_TOKENS = 8 tokens, got M = 9"),
        ({"attn_out": attn[:0]}, ValueError, r"^attn_out: the block takes 1 <= M"),
        ({"residual": res[:1]}, ValueError, r"^residual: dimension 0 must be 2, got 1"),
        ({"residual": torch.zeros(H, 2, dtype=torch.bfloat16).t()}, ValueError, r"^residual: must be contiguous"),
        ({"ln_weight": lnw[:-1]}, ValueError, r"^ln_weight: dimension 0 must be 128, got 127"),
        ({"eps": "1e-6"}, TypeError, r"^eps: expected a Python float"),
        ({"eps": float("nan")}, ValueError, r"^eps: must be finite and >= 0 in fp32"),
        ({"eps": 1e39}, ValueError, r"^eps: must be finite and >= 0 in fp32, got 1e\+39 \(fp32 inf\)"),
        ({"eps": -1e-6}, ValueError, r"^eps: must be finite and >= 0"),
        ({"router_weight": rw[:, :64]}, ValueError, r"^router_weight: dimension 1 must be 128, got 64"),
        ({"top_k": E + 1}, ValueError, r"^top_k: must satisfy 1 <= top_k <= min\(E = 4, 16\), got 5"),
        ({"top_k": 2.0}, TypeError, r"^top_k: expected an int"),
        ({"counter": c[:1]}, ValueError, r"^counter: needs >= 2 entries \(one per token\), got 1"),
        ({"counter": c.long()}, TypeError, r"^counter: dtype must be torch.int32"),
    ]  # fmt: skip
    for change, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            ll_route(**(ok | change))
    with pytest.raises(TypeError, match=r"^taps: expected a dict or None"):
        ll_route(**ok, taps=[])


def test_check_ll_inputs() -> None:
    attn, res, lnw, rw = _front()
    w = _weights(rw)
    c = make_route_counter("cpu")
    assert check_ll_inputs(attn, res, lnw, 0.1, w, K, c) == float(torch.tensor(0.1, dtype=torch.float32))
    with pytest.raises(TypeError, match=r"^w: expected LLMoEWeights, got FlintMoEWeights"):
        check_ll_inputs(attn, res, lnw, 0.1, w.experts, K, c)
    with pytest.raises(ValueError, match=r"^w\.router_weight: dimension 1 must be 256, got 128"):
        big = torch.zeros(2, 256, dtype=torch.bfloat16)
        check_ll_inputs(big, big, torch.zeros(256, dtype=torch.bfloat16), 0.1, w, K, c)
    w.shared_w2_sf.resize_(H, 2)  # changed in place after construction
    with pytest.raises(ValueError, match=r"^w\.shared_w2_sf: .* take 128 x 4 = 512 bytes, got 256"):
        check_ll_inputs(attn, res, lnw, 0.1, w, K, c)


def test_block_op_without_a_gpu_says_what_is_missing() -> None:
    """On the CPU (the Triton interpreter takes the router, but CuTe DSL has no interpreter) the block op checks
    its arguments, then refuses before any launch, naming the missing device."""
    attn, res, lnw, rw = _front()
    w = _weights(rw)
    counter = make_route_counter("cpu")
    with pytest.raises(RuntimeError, match=r"^flint_moe_ll: the CuTe DSL expert kernels need a CUDA device .*got "
                                           r"tensors on cpu; CuTe DSL has no CPU interpreter"):  # fmt: skip
        flint_moe_ll(attn, res, lnw, 1e-6, w, K, counter)
    assert int(counter.abs().sum()) == 0  # nothing ran
    with pytest.raises(ValueError, match=r"^attn_out: the block takes 1 <= M"):  # the checks come first
        flint_moe_ll(attn[:0], res, lnw, 1e-6, w, K, counter)


def test_block_op_end_to_end_with_a_cpu_model_of_the_kernels(monkeypatch) -> None:
    """The op's host side end to end on the CPU: the router under the interpreter, the CuTe launches replaced by
    a CPU model of the kernels written from their source (tests/ops/_ll_emulate.py) that reads the launchers'
    own arguments; every tap checked against the golden model as on the GPU (tests/ops/_ll_check.py: teacher
    forcing, declared orders replayed bit for bit). attn_out = 0 keeps s^2 exact, so the interpreter's unfused
    sum of squares equals the declared fused order. Tails everywhere: H = 1152 (72 blocks) in 4 gate/up
    splits of 18 blocks (lanes 18-31 idle), I = 288 stored as 320 and SI = 320 in 2 down splits of 10 blocks
    (the routed split 1 holds 2 padding blocks)."""
    from flint_moe.kernels.cute import ll_launch
    from tests.ops import _ll_emulate
    from tests.ops._ll_check import EPS, check_block, make_block, make_block_inputs

    monkeypatch.setattr(ll_launch, "_run", _ll_emulate.run)
    monkeypatch.setattr(ll_launch, "ll_experts_status", lambda device: (True, "CPU model"))
    b = make_block(4, 1152, 288, 320, 2, pad_to=64, seed=2, device="cpu")
    plan = ll_launch.ll_plan(b.w, 2)
    assert (plan.padded_inter, plan.s_gate_up, plan.s_shared_gate_up, plan.s_down, plan.s_shared_down) == (
        320, 4, 4, 2, 2,
    )  # fmt: skip
    _, res, lnw = make_block_inputs(3, 1152, seed=2, device="cpu")
    attn = torch.zeros_like(res)
    taps: dict = {}
    out, res_out = flint_moe_ll(attn, res, lnw, EPS, b.w, 2, make_route_counter("cpu"), taps=taps)
    check_block(b, attn, res, lnw, taps, out, res_out)
    out2, _ = flint_moe_ll(attn, res, lnw, EPS, b.w, 2, make_route_counter("cpu"))
    assert torch.equal(out2.view(torch.int16), out.view(torch.int16))
