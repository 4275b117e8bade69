"""Host side of the decode block's CuTe expert kernels (flint_moe/kernels/cute/ll_launch.py) on the CPU: the
K-split choice, the shape limits, the flat weight views (same storage, the sizes the kernels index), every
launch's arguments (recorded in place of the launch) and, with the cute extra, those very arguments compiled
for sm_90a through the launcher's own compile call (so their order and types match the host functions).
Running the kernels needs the GPU (tests/ops/test_moe_ll_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.cute import ll_gate_up, ll_launch
from flint_moe.kernels.cute.ll_down import DownSpec
from flint_moe.kernels.cute.ll_gate_up import GateUpSpec
from flint_moe.kernels.cute.ll_launch import choose_splits, expert_views, ll_plan, plan_shapes, split_candidates
from tests.ops._ll_check import make_block

BACKEND = "any"

needs_cute = pytest.mark.skipif(
    not ll_gate_up.cute_available()[0], reason="the cute extra (nvidia-cutlass-dsl) is not installed"
)


def test_splits_of_the_block_shapes() -> None:
    # (K, rows) -> S: the first S whose one-pair grid rows / 4 * S reaches 528 CTAs, K % (512 S) == 0
    assert choose_splits(7168, 4096) == 1  # DeepSeek-V3 gate/up: 1024 CTAs already
    assert choose_splits(2048, 1024) == 4  # Ling-mini-2.0 gate/up: 256 -> 512 -> 1024 CTAs
    assert choose_splits(512, 2048) == 1  # Ling-mini-2.0 down: K = 512 allows S = 1 only
    assert choose_splits(1536, 512) == 3  # 128 CTAs, S in {1, 3}: none reaches 528, the largest
    assert choose_splits(5120, 128) == 10  # 32 CTAs x S in {1, 2, 5, 10}: none reaches 528, the largest
    plan = plan_shapes(7168, 2048, 2048, 2048, 256, 8)
    assert (plan.s_gate_up, plan.s_shared_gate_up, plan.s_down, plan.s_shared_down) == (1, 1, 1, 1)
    plan = plan_shapes(2048, 384, 512, 512, 8, 4)
    assert (plan.s_gate_up, plan.s_shared_gate_up, plan.s_down, plan.s_shared_down) == (4, 4, 1, 1)
    assert plan.gate_up_spec() == GateUpSpec(2048, 512, 8, 4, True, 4)
    assert plan.shared_gate_up_spec() == GateUpSpec(2048, 512, 1, 4, False, 1)
    assert plan.down_spec() == DownSpec(2048, 512, 384, 512, 8, 4, 1, 1)


def test_splits_with_tails() -> None:
    # K not a multiple of 512: every S <= 16 whose last split holds a block; GLM-4.5-Air's I = SI = 1408
    # 88 blocks: (S - 1) * ceil(88 / S) < 88 fails for S = 12 (8 x 11), 14 (7 x 13), 16 (6 x 15)
    assert split_candidates(1408) == [*range(1, 12), 13, 15]
    assert split_candidates(48) == [1, 2, 3]  # 3 blocks
    assert split_candidates(7168) == [1, 2, 7, 14]  # a multiple of 512: S dividing 14, no lane tail
    assert choose_splits(1408, 4096) == 1 and choose_splits(1408, 256) == 9  # 64 CTAs x 9 = 576 >= 528
    plan = plan_shapes(4096, 1408, 1408, 1408, 128, 8)
    assert (plan.s_gate_up, plan.s_shared_gate_up, plan.s_down, plan.s_shared_down) == (1, 1, 1, 1)


def test_shape_limits() -> None:
    with pytest.raises(ValueError, match=r"reduction length 1000 must be a positive multiple of 16"):
        choose_splits(1000, 128)
    with pytest.raises(ValueError, match=r"rows 130 must be a positive multiple of 4"):
        choose_splits(512, 130)
    with pytest.raises(ValueError, match=r"^flint_moe_ll: hidden size H = 2312 must be a positive multiple of 16"):
        plan_shapes(2312, 512, 512, 512, 8, 2)
    with pytest.raises(ValueError, match=r"^flint_moe_ll: padded intermediate Ip = 776 must be a positive multiple"):
        plan_shapes(2048, 776, 776, 512, 8, 2)
    with pytest.raises(ValueError, match=r"^flint_moe_ll: shared SI = 0 must be a positive multiple of 16"):
        plan_shapes(2048, 512, 512, 0, 8, 2)
    with pytest.raises(ValueError, match=r"^w.experts.w1: 2348810240 int32 code words exceed"):
        plan_shapes(7168, 4096, 4096, 2048, 320, 8)


def _small_block():
    return make_block(4, 1024, 384, 512, 2, pad_to=512, seed=3, device="cpu")


def test_views_share_the_weights_storage() -> None:
    b = _small_block()
    w, ex = b.w, b.w.experts
    v = expert_views(w)
    for name, src in (("w1", ex.w1), ("w1_sf", ex.w1_sf_swizzled), ("w1_gs", ex.w1_alpha), ("w2", ex.w2),
                      ("w2_sf", ex.w2_sf_swizzled), ("w2_gs", ex.w2_alpha), ("sw13", w.shared_w13),
                      ("sw13_sf", w.shared_w13_sf), ("sw13_gs", w.shared_w13_gs), ("sw2", w.shared_w2),
                      ("sw2_sf", w.shared_w2_sf), ("sw2_gs", w.shared_w2_gs)):  # fmt: skip
        t = v[name]
        assert t.data_ptr() == src.data_ptr() and t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
        assert t.dim() == 1 and t.numel() * t.element_size() == src.numel() * src.element_size(), name
    assert (v["w1"].dtype, v["w1_sf"].dtype, v["w1_gs"].dtype) == (torch.int32, torch.uint8, torch.float32)
    # the sizes the kernels index: E * 2Ip * H / 8 words, E * Mp * Kp scale bytes
    assert v["w1"].numel() == 4 * 1024 * 1024 // 8 and v["w1_sf"].numel() == 4 * 1024 * 64
    assert v["w2"].numel() == 4 * 1024 * 512 // 8 and v["w2_sf"].numel() == 4 * 1024 * 32
    assert v["sw13"].numel() == 1024 * 1024 // 8 and v["sw2_sf"].numel() == 1024 * 512 // 16
    ex.w1[1, 2, 3] = 0x5A  # a write through the weights is seen through the view
    assert int(v["w1"].view(torch.uint8)[(1 * 1024 + 2) * 512 + 3]) == 0x5A


def _record(monkeypatch) -> list:
    calls: list = []

    def fake_run(kind, spec, tap, device, ns, tensors, ints, constexprs):
        calls.append((kind, spec, tap, tensors, ints, constexprs))

    monkeypatch.setattr(ll_launch, "_run", fake_run)
    monkeypatch.setattr(ll_launch, "host_ns", lambda kind: None)  # no DSL needed to record
    return calls


def _route(m: int, k: int, e: int):
    g = torch.Generator().manual_seed(m)
    xn = torch.randn(m, 1024, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).int()
    tw = torch.full((m, k), 0.5)
    return xn, ids, tw


def test_launch_arguments(monkeypatch) -> None:
    b = _small_block()
    w, m, k = b.w, 3, 2
    xn, ids, tw = _route(m, k, 4)
    calls = _record(monkeypatch)
    taps: dict = {}
    out = ll_launch.launch_ll_experts(xn, ids, tw, w, k, taps=taps)
    assert [c[0] for c in calls] == ["gate_up", "gate_up", "down"]
    plan = ll_plan(w, k)
    v = expert_views(w)
    (_, gspec, gtap, gt, gi, gc), (_, sspec, _, st, si, sc), (_, dspec, dtap, dt, di, dc) = calls
    assert (gspec, sspec, dspec) == (plan.gate_up_spec(), plan.shared_gate_up_spec(), plan.down_spec())
    assert gtap is True and dtap is True
    # gate/up: x, ids, codes, scales, gs, ws, act (bf16 bits), gate tap, up tap; pairs, top_k; H, Ip, S, ROUTED,
    # TAP, TOPK. H = 1024: S in {1, 2}, 256 CTAs per split of one pair (2 * Ip / 4): S = 2, the largest
    assert gi == [m * k, k] and gc == [1024, 512, 2, True, True, k]
    assert si == [m, 1] and sc == [1024, 512, 2, False, True, 1]
    assert gt[0].data_ptr() == xn.data_ptr() and st[0].data_ptr() == xn.data_ptr()
    assert gt[1].data_ptr() == ids.data_ptr()
    for got, name in zip(gt[2:5], ("w1", "w1_sf", "w1_gs"), strict=True):
        assert got.data_ptr() == v[name].data_ptr() and got.numel() == v[name].numel()
    for got, name in zip(st[2:5], ("sw13", "sw13_sf", "sw13_gs"), strict=True):
        assert got.data_ptr() == v[name].data_ptr() and got.numel() == v[name].numel()
    assert [t.numel() for t in gt[5:]] == [m * k * 2 * 2 * 512, m * k * 512, m * k * 512, m * k * 512]
    assert [t.dtype for t in gt[5:]] == [torch.float32, torch.int16, torch.float32, torch.float32]
    assert [t.numel() for t in st[5:]] == [m * 2 * 2 * 512, m * 512, m * 512, m * 512]
    # down: act, shared act, ids, tw, w2, w2_sf, w2_gs, sw2, sw2_sf, sw2_gs, ws_r, ws_s, out, 4 taps; M;
    # H, Ip, I, SI, k, S, SS, TAP
    assert di == [m] and dc == [1024, 512, 384, 512, k, 1, 1, True]
    assert dt[0].data_ptr() == gt[6].data_ptr() and dt[1].data_ptr() == st[6].data_ptr()
    assert dt[2].data_ptr() == ids.data_ptr() and dt[3].data_ptr() == tw.data_ptr()
    for got, name in zip(dt[4:10], ("w2", "w2_sf", "w2_gs", "sw2", "sw2_sf", "sw2_gs"), strict=True):
        assert got.data_ptr() == v[name].data_ptr()
    assert [t.numel() for t in dt[10:]] == [m * k * 1024, m * 1024, m * 1024, m * k * 1024, m * k * 1024,
                                            m * 1024, m * 1024]  # fmt: skip
    # the taps are the tensors the kernels write, shaped and cut to the valid intermediate size
    assert out.data_ptr() == dt[12].data_ptr() and taps["out"] is out
    shapes = {"gate_acc": (m, k, 384), "up_acc": (m, k, 384), "act": (m, k, 384), "shared_gate_acc": (m, 512),
              "shared_up_acc": (m, 512), "shared_act": (m, 512), "down_acc": (m, k, 1024), "y": (m, k, 1024),
              "shared_down_acc": (m, 1024), "shared_y": (m, 1024), "out": (m, 1024)}  # fmt: skip
    assert {n: tuple(t.shape) for n, t in taps.items()} == shapes
    assert taps["gate_acc"].data_ptr() == gt[7].data_ptr() and taps["act"].data_ptr() == gt[6].data_ptr()
    assert taps["act"].dtype == torch.bfloat16 and taps["y"].dtype == torch.bfloat16
    assert taps["down_acc"].data_ptr() == dt[13].data_ptr() and taps["shared_y"].data_ptr() == dt[16].data_ptr()


def test_untapped_launch_passes_placeholders(monkeypatch) -> None:
    b = _small_block()
    xn, ids, tw = _route(1, 2, 4)
    calls = _record(monkeypatch)
    ll_launch.launch_ll_experts(xn, ids, tw, b.w, 2)
    (_, _, gtap, gt, _, gc), _, (_, _, dtap, dt, _, dc) = calls
    assert gtap is False and dtap is False and gc[-2] is False and dc[-1] is False
    assert [t.numel() for t in gt[7:]] == [1, 1] and [t.numel() for t in dt[13:]] == [1, 1, 1, 1]


@needs_cute
@pytest.mark.parametrize("tap", [True, False])
def test_recorded_arguments_compile_for_sm90(monkeypatch, tap: bool) -> None:
    """The launcher's own arguments (the untapped build with its one-element placeholders too), converted and
    compiled as ``_run`` does (CPU tensors; no launch)."""
    b = _small_block()
    xn, ids, tw = _route(2, 2, 4)
    calls = _record(monkeypatch)
    ll_launch.launch_ll_experts(xn, ids, tw, b.w, 2, taps={} if tap else None)
    monkeypatch.undo()
    import cuda.bindings.driver as cuda

    for kind, _, _, tensors, ints, constexprs in calls:
        args = [ll_launch._cute(t) for t in tensors]
        fn = ll_launch.compile_host(ll_launch.host_ns(kind), args, ints, constexprs, cuda.CUstream(0), "sm_90a")
        assert fn is not None


def test_launchers_refuse_misaligned_inputs(monkeypatch) -> None:
    """The partial kernel's 64- and 128-bit loads need 16-byte aligned starts: an input 2 bytes past one is a
    ValueError naming it, before any launch; the aligned call launches."""
    b = _small_block()
    xn, ids, tw = _route(2, 2, 4)
    calls = _record(monkeypatch)
    v = expert_views(b.w)
    plan = ll_plan(b.w, 2)
    x = torch.empty(xn.numel() + 1, dtype=xn.dtype)[1:].view(xn.shape)  # starts 2 bytes past an aligned start
    x.copy_(xn)
    with pytest.raises(ValueError, match=r"^x: the expert kernels need a 16-byte aligned start, got 0x"):
        ll_launch.launch_ll_gate_up(x, ids, v["w1"], v["w1_sf"], v["w1_gs"], plan.gate_up_spec(), 4, 2)
    codes = torch.empty(v["w1"].numel() + 1, dtype=torch.int32)[1:]  # 4 bytes past
    codes.copy_(v["w1"])
    with pytest.raises(ValueError, match=r"^codes: the expert kernels need a 16-byte aligned start"):
        ll_launch.launch_ll_gate_up(xn, ids, codes, v["w1_sf"], v["w1_gs"], plan.gate_up_spec(), 4, 2)
    act = torch.empty(4 * 512 + 1, dtype=torch.bfloat16)[1:].view(4, 512)
    sact = torch.empty(2, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^act: the expert kernels need a 16-byte aligned start"):
        ll_launch.launch_ll_down(act, sact, ids, tw, v, plan.down_spec(), 2)
    with pytest.raises(ValueError, match=r"^shared_act: the expert kernels need a 16-byte aligned start"):
        ll_launch.launch_ll_down(torch.empty(4, 512, dtype=torch.bfloat16), act[:2], ids, tw, v, plan.down_spec(), 2)
    assert calls == []
    ll_launch.launch_ll_gate_up(xn, ids, v["w1"], v["w1_sf"], v["w1_gs"], plan.gate_up_spec(), 4, 2)
    assert [c[0] for c in calls] == ["gate_up"]


def test_gate_up_launcher_refuses_a_top_k_other_than_the_spec() -> None:
    b = _small_block()
    xn, ids, _ = _route(2, 2, 4)
    v = expert_views(b.w)
    with pytest.raises(ValueError, match=r"^top_k: 1 differs from the spec's top_k 2"):
        ll_launch.launch_ll_gate_up(xn, ids, v["w1"], v["w1_sf"], v["w1_gs"], ll_plan(b.w, 2).gate_up_spec(), 4, 1)
