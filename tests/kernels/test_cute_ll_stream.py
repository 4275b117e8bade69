"""The streaming CuTe DSL partial kernel of the decode block (flint_moe/kernels/cute/ll_stream.py) on the CPU:
its gate/up (routed, shared) and down builds compiled for sm_90a and their PTX audited (the exact f16x2 decode,
the 64-bit code loads and 128-bit input loads, the pinned rule instructions present, the forbidden ones absent),
and the launcher's streaming arguments (recorded in place of the launch) compiled through the launcher's own
compile call. Values need the GPU (tests/ops/test_moe_ll_gpu.py, ``test_streaming_*``)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.cute import ll_gate_up, ll_launch, ll_stream
from flint_moe.kernels.cute.ll_down import DownSpec
from flint_moe.kernels.cute.ll_gate_up import GateUpSpec

BACKEND = "any"

needs_cute = pytest.mark.skipif(
    not ll_gate_up.cute_available()[0], reason="the cute extra (nvidia-cutlass-dsl) is not installed"
)

#: name -> (kind, spec, top_k, tap): Ling-mini-2.0 shapes (small K: quick to compile; gate/up S = 4, a split
#: loop), GLM-4.5-Air's down (88 blocks: a lane tail), a padded intermediate (valid 960 of 1024).
_SPECS = {
    "ling.routed.S4": ("gate_up", GateUpSpec(2048, 512, 256, 4, True), 8, False),
    "ling.shared.S4.tap": ("gate_up", GateUpSpec(2048, 512, 1, 4, False), 1, True),
    "ling.down.S1.tap": ("down", DownSpec(2048, 512, 512, 512, 256, 8, 1, 1), 8, True),
    "glm45air.down.S1": ("down", DownSpec(4096, 1408, 1408, 1408, 128, 8, 1, 1), 8, False),
    "padded.down.S1": ("down", DownSpec(2048, 1024, 960, 512, 16, 4, 1, 1), 4, False),
}


@needs_cute
@pytest.mark.parametrize("name", sorted(_SPECS))
def test_stream_ptx_audit(name: str) -> None:
    kind, spec, top_k, tap = _SPECS[name]
    assert ll_stream.audit_stream(kind, spec, top_k=top_k, tap=tap) == []


def test_audit_lists() -> None:
    """The streaming build's required instructions: the exact decode and the vector loads, besides the rule's."""
    for need in ("mul.rn.f16x2", "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "ld.global.nc.v2.u32", "ld.global.nc.v4.u32",
                 "fma.rn.f32", "add.rn.f32", "shfl.sync.bfly.b32"):  # fmt: skip
        assert need in ll_stream.PTX_REQUIRE
    assert ll_stream.PTX_FORBID == ll_gate_up.PTX_FORBID
    with pytest.raises(ValueError, match=r"kind must be 'gate_up' or 'down', got 'up'"):
        ll_stream.audit_stream("up", GateUpSpec(2048, 512, 1, 4, False))


def _record(monkeypatch):
    calls = []

    def record(kind, spec, tap, device, ns, tensors, ints, constexprs):
        calls.append((kind, spec, tap, tensors, ints, constexprs, ns))

    monkeypatch.setattr(ll_launch, "_run", record)
    return calls


def test_streaming_launch_arguments(monkeypatch) -> None:
    """``streaming=True`` launches the same tensors as the first kernels with the streaming host functions; the
    gate/up key carries top_k (a constexpr of the streaming build), the down key is the spec."""
    from tests.kernels.test_cute_ll_launch import _route, _small_block

    b = _small_block()
    xn, ids, tw = _route(3, 2, 4)
    calls = _record(monkeypatch)
    ll_launch.launch_ll_experts(xn, ids, tw, b.w, 2, taps={})
    first = list(calls)
    calls.clear()
    ll_launch.launch_ll_experts(xn, ids, tw, b.w, 2, taps={}, streaming=True)
    assert [c[0] for c in calls] == ["gate_up_stream", "gate_up_stream", "down_stream"]
    plan = ll_launch.ll_plan(b.w, 2)
    assert [c[1] for c in calls] == [(plan.gate_up_spec(), 2), (plan.shared_gate_up_spec(), 1), plan.down_spec()]
    for a, s in zip(first, calls, strict=True):
        assert [t.numel() for t in a[3]] == [t.numel() for t in s[3]]
        assert [t.dtype for t in a[3]] == [t.dtype for t in s[3]]
        assert a[4] == s[4]
    assert calls[0][5] == [*first[0][5], 2] and calls[1][5] == [*first[1][5], 1] and calls[2][5] == first[2][5]
    assert calls[0][3][0].data_ptr() == xn.data_ptr() and calls[2][3][2].data_ptr() == ids.data_ptr()


@needs_cute
def test_streaming_recorded_arguments_compile_for_sm90(monkeypatch) -> None:
    """The launcher's streaming arguments (tap build) compiled as ``_run`` does (CPU tensors; no launch)."""
    import cuda.bindings.driver as cuda

    from tests.kernels.test_cute_ll_launch import _route, _small_block

    b = _small_block()
    xn, ids, tw = _route(2, 2, 4)
    calls = _record(monkeypatch)
    ll_launch.launch_ll_experts(xn, ids, tw, b.w, 2, taps={}, streaming=True)
    monkeypatch.undo()
    for _, _, _, tensors, ints, constexprs, ns in calls:
        args = [ll_launch._cute(t) for t in tensors]
        assert ll_launch.compile_host(ns, args, ints, constexprs, cuda.CUstream(0), "sm_90a") is not None


def test_streaming_refuses_a_misaligned_input(monkeypatch) -> None:
    from tests.kernels.test_cute_ll_launch import _route, _small_block

    b = _small_block()
    xn, ids, _ = _route(2, 2, 4)
    _record(monkeypatch)
    v = ll_launch.expert_views(b.w)
    plan = ll_launch.ll_plan(b.w, 2)
    x = torch.empty(xn.numel() + 1, dtype=xn.dtype)[1:].view(xn.shape)  # starts 2 bytes past an aligned start
    x.copy_(xn)
    with pytest.raises(ValueError, match=r"^x: the streaming kernels need a 16-byte aligned start"):
        ll_launch.launch_ll_gate_up(x, ids, v["w1"], v["w1_sf"], v["w1_gs"], plan.gate_up_spec(), 4, 2,
                                    streaming=True)  # fmt: skip
    ll_launch.launch_ll_gate_up(x, ids, v["w1"], v["w1_sf"], v["w1_gs"], plan.gate_up_spec(), 4, 2)  # first kernels
