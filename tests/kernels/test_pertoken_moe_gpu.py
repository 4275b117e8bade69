"""Per-token NVFP4 x NVFP4 routed experts on the H200 (marked gpu): compiled kernels at real widths.

DeepSeek-V3-like layers (H = 7168, I = 2048, k = 8) with a small E, and a padded gpt-oss-like width (H = I =
2880 -> 3072): every tap (both quantized operands, ``fc1_acc``, ``h``, ``act``, the FC2 input, ``fc2_acc``,
``y``, ``w``) and the output equal the golden model bit for bit with the golden model replaying the declared
orders (``kernels.orders.pertoken_orders``, tensor-core model ``reference.mma``); a larger batch with -1 slots,
other ranks' experts and ``token_capacity`` teacher-forced (accumulators within the certified bound, the rest
bit for bit); tapped build == production build; repeated runs and CUDA-graph replays bitwise identical; the
launch options (``TAIL``, ``SCALE_WORD``) bitwise equal in every combination at the DeepSeek-V3 width.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels import orders as K
from flint_moe.ops import prepare_routed_nvfp4_weights, routed_nvfp4_moe

from ._nvfp4_check import capture_graph
from ._pertoken_check import bits, check_pertoken_taps

pytestmark = pytest.mark.gpu
BACKEND = "gpu"
DEV = "cuda"

_LAYERS: dict = {}


def _weights(E, H, I, gated, seed=0):  # noqa: E741
    key = (E, H, I, gated, seed)
    if key not in _LAYERS:
        _LAYERS.clear()
        g = torch.Generator(device=DEV).manual_seed(seed)
        fc1 = (torch.randn(E, (2 if gated else 1) * I, H, generator=g, device=DEV) * 0.02).to(torch.bfloat16)
        fc2 = (torch.randn(E, H, I, generator=g, device=DEV) * 0.02).to(torch.bfloat16)
        _LAYERS[key] = prepare_routed_nvfp4_weights(fc1, fc2)
    return _LAYERS[key]


def _tokens(T, H, k, n, seed, lo=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(T, H, generator=g, device=DEV)
    x = (x * 2.0 ** torch.randint(-6, 7, (T, 1), generator=g, device=DEV)).to(torch.bfloat16)
    # k distinct experts per token (a top-k), then some slots emptied when lo = -1
    ids = torch.argsort(torch.rand(T, n, generator=g, device=DEV), dim=1)[:, :k].to(torch.int32)
    if lo < 0:
        drop = torch.rand(T, k, generator=g, device=DEV) < 0.2
        ids = torch.where(drop, torch.full_like(ids, -1), ids)
    p = torch.rand(T, k, generator=g, device=DEV)
    return x, ids, p


def _stress_rows(x):
    """Row 0 all zero, row 1 one outlier over tiny values, row 2 at the E4M3 clamp, row 3 E2M1 ties."""
    h = x.shape[1]
    x[0] = 0
    x[1] = (torch.randn(h, device=DEV) * 1e-3).to(torch.bfloat16)
    x[1, 11] = 3.0e4
    x[2, 7] = 2688.0
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], device=DEV).repeat(h // 8) * 2.0**-3
    x[3] = ties.to(torch.bfloat16)
    return x


@pytest.mark.parametrize(
    "E,H,I,k,T,act",
    [(8, 7168, 2048, 8, 32, "swiglu"), (8, 7168, 2048, 8, 32, "relu2"), (6, 2880, 2880, 4, 40, "relu2"),
     (6, 2880, 2880, 4, 40, "swiglu")],
)  # fmt: skip
def test_bitwise_with_declared_orders(E, H, I, k, T, act):  # noqa: E741
    w = _weights(E, H, I, act == "swiglu")
    x, ids, p = _tokens(T, H, k, E, seed=T + H)
    x = _stress_rows(x)
    taps: dict = {}
    out = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation=act, taps=taps)
    counts = check_pertoken_taps(w, x, ids, p, taps, out, num_experts=E, offset=0, activation=act,
                                 orders=K.pertoken_orders(H, I))  # fmt: skip
    assert counts["pairs"] == T * k
    prod = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation=act)
    assert torch.equal(bits(prod), bits(out)), "production build differs from the tapped build"


def test_dispatcher_buffer_capacity_and_other_ranks_teacher_forced():
    E, H, I, k, T, off, n = 8, 7168, 2048, 8, 600, 8, 32  # noqa: E741
    w = _weights(E, H, I, True)
    x, ids, p = _tokens(T, H, k, n, seed=5, lo=-1)
    out = torch.full((T, H), 7.0, dtype=torch.bfloat16, device=DEV)
    before = out.clone()
    taps: dict = {}
    routed_nvfp4_moe(x, ids, p.to(torch.bfloat16), w, num_experts=n, local_expert_offset=off, activation="swiglu",
                     out=out, token_capacity=513, taps=taps)  # fmt: skip
    counts = check_pertoken_taps(w, x, ids, p.to(torch.bfloat16), taps, out, num_experts=n, offset=off,
                                 activation="swiglu", token_capacity=513, out_before=before)  # fmt: skip
    assert counts["pairs"] > 0 and bool((out[513:] == 7.0).all())


def test_repeated_runs_and_graph_replays_identical():
    E, H, I, k, T = 8, 7168, 2048, 8, 2048  # noqa: E741
    w = _weights(E, H, I, True)
    x, ids, p = _tokens(T, H, k, E, seed=9)

    def run():
        return routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation="swiglu")

    first = run()
    for _ in range(2):
        assert torch.equal(bits(run()), bits(first))
    graph, static = capture_graph(run)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(static), bits(first))


def _opt_cfg(bm, tail, sw1, sw2):
    return {"BM": bm, "TAIL": tail, "fc1": {"SCALE_WORD": sw1}, "fc2": {"SCALE_WORD": sw2}}


def test_launch_options_bitwise_equal_at_deepseek_width():
    """Config ``TAIL`` (expert-wide row blocks) and ``SCALE_WORD`` at H 7168 / I 2048, BM 128: every combination's
    output equals the options-off build bit for bit (experts of more than 128 pairs run the tail accumulator;
    -1 slots, other ranks' experts, ``token_capacity``); all on and the op's default (BM 256: options on) give
    the options-off build's taps; BM 16 + TAIL 16 with every option on equals the golden model replaying the
    declared orders."""
    E, H, I, k, T, off, n, cap = 8, 7168, 2048, 8, 440, 8, 16, 400  # noqa: E741
    w = _weights(E, H, I, True)
    x, ids, p = _tokens(T, H, k, n, seed=31, lo=-1)
    loc = ids[:cap] - off
    counts = torch.bincount(loc[(loc >= 0) & (loc < E)].long(), minlength=E)
    assert int(counts.max()) > 128 and int(counts.min()) > 0 and bool((ids[:cap] == -1).any())

    def run(config, taps=None):
        out = torch.full((T, H), 7.0, dtype=torch.bfloat16, device=DEV)
        return routed_nvfp4_moe(x, ids, p, w, num_experts=n, local_expert_offset=off, activation="swiglu", out=out,
                                token_capacity=cap, taps=taps, config=config)  # fmt: skip

    ref_taps: dict = {}
    ref = run(_opt_cfg(128, 0, False, False), ref_taps)
    assert bool((ref[cap:] == 7.0).all())
    for tail in (0, 32):
        for sw1 in (False, True):
            for sw2 in (False, True):
                got = run(_opt_cfg(128, tail, sw1, sw2))
                assert torch.equal(bits(got), bits(ref)), (tail, sw1, sw2)
    for config in (_opt_cfg(128, 32, True, True), None):  # None: the default, BM 256 with TAIL 32 + SCALE_WORD
        taps: dict = {}
        got = run(config, taps)
        assert torch.equal(bits(got), bits(ref)), config
        assert sorted(taps) == sorted(ref_taps)
        for name in ref_taps:
            assert torch.equal(bits(taps[name]), bits(ref_taps[name])), (config, name)
    E, T = 8, 40  # noqa: E741
    x, ids, p = _tokens(T, H, k, E, seed=32)
    taps = {}
    out = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation="swiglu", taps=taps,
                           config=_opt_cfg(16, 16, True, True))  # fmt: skip
    counts = check_pertoken_taps(w, x, ids, p, taps, out, num_experts=E, offset=0, activation="swiglu",
                                 orders=K.pertoken_orders(H, I))  # fmt: skip
    assert counts["pairs"] == T * k
