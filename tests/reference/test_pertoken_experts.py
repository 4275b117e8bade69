"""Per-token NVFP4 x NVFP4 experts (flint_moe/reference/pertoken_experts.py), steps P6-P12.

Checks: hand-derived layers whose every fp32 error is far below bf16's half ulp; a re-statement of P6-P12 in
numpy and exact rationals (the quantizer of test_pertoken's numpy oracle, accumulations summed as
``fractions.Fraction`` and rounded once to binary32, the combine's fma rounded once from the exact rational)
compared bit for bit with the golden model for both activations; -1 slots, other ranks' experts and
``token_capacity``; declared summation orders replayed; bad input. SwiGLU's ex2 / rcp approximations come
from ``reference.mufu`` (checked against the H200 tables in test_mufu.py), the only shared piece.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from flint_moe.reference import mufu
from flint_moe.reference.pertoken_experts import (
    PerTokenNVFP4Experts,
    quantize_pertoken_experts,
    routed_nvfp4_moe_reference,
)
from tests.reference.test_pertoken import E2M1, E4M3, oracle, oracle_rows

F32 = np.float32


def _one_expert_layer(x_val: float, w1_val: float, w2_val: float, t: int = 1):
    h, i = 16, 16
    w = quantize_pertoken_experts(torch.full((1, i, h), w1_val).bfloat16(), torch.full((1, h, i), w2_val).bfloat16())
    x = torch.full((t, h), x_val, dtype=torch.bfloat16)
    return w, x


def test_all_ones_layer_is_4096():
    """x = 1 (H = 16), FC1 = FC2 = 1 (I = 16), p = 1. Real value: h = 16, relu2 256, y = 16 * 256 = 4096.
    Quantized: each operand row has amax 1 or 256 and every element at it, so S = 448 and the code is 6
    (q = 6 within an ulp): the decoded operands are 2688 each and d, alpha = RN(1/2688) or RN(2/21); acc1 =
    acc2 = 16 * 2688^2 (exact in fp32). The scale products differ from the real 1/2688 factors by a few fp32
    ulps only (< 2^-20 relative), far below bf16's half ulp at 4096 (2^-9 relative): out = 4096. With
    probabilities 0.5 the output is 2048; two slots of the same expert with 0.25 and 0.5 give 3072."""
    w, x = _one_expert_layer(1.0, 1.0, 1.0, t=3)
    routing = torch.tensor([[0, -1], [0, -1], [0, 0]])
    prob = torch.tensor([[1.0, 0.0], [0.5, 0.0], [0.25, 0.5]])
    st = routed_nvfp4_moe_reference(x, routing, prob, w, num_experts=1, local_expert_offset=0, activation="relu2")
    assert st.out.float()[:, 0].tolist() == [4096.0, 2048.0, 3072.0]
    assert bool((st.out == st.out[:, :1]).all())
    assert st.x_scale.view(torch.uint8).tolist() == [[0x7E]] * 3 and st.a_scale.view(torch.uint8)[0, 0].tolist() == [
        0x7E
    ]
    assert st.fc1_acc[0, 0, 0].item() == 16 * 2688.0**2 and st.fc2_acc[0, 0, 0].item() == 16 * 2688.0**2


def test_negative_preactivation_gives_positive_zero():
    """FC1 = -1: h = -16 -> relu2 +0 everywhere; the FC2 input row is all zero (g2 = d2 = 1, S = 0x00,
    codes 0), y = 0 and out = +0 (fma(w, +0, +0) = +0)."""
    w, x = _one_expert_layer(1.0, -1.0, 1.0)
    st = routed_nvfp4_moe_reference(
        x, torch.tensor([[0]]), torch.tensor([[1.0]]), w, num_experts=1, local_expert_offset=0, activation="relu2"
    )
    assert st.act.abs().max().item() == 0.0 and st.a_token_scale.tolist() == [[1.0]]
    assert st.a_scale.view(torch.uint8).abs().max().item() == 0
    assert st.out.view(torch.int16).tolist() == [[0] * 16]


# ------------------------------------------------------------------------------------------------------
# re-statement: numpy float32 + exact rationals
# ------------------------------------------------------------------------------------------------------


def _rn32(v: Fraction) -> F32:
    """One binary32 round-to-nearest-even of an exact rational (no overflow in these tests)."""
    f = F32(float(v))
    cands = [np.nextafter(f, F32(-np.inf)), f, np.nextafter(f, F32(np.inf))]
    dist = [abs(Fraction(float(c)) - v) for c in cands]
    best = min(dist)
    picks = [c for c, d in zip(cands, dist, strict=True) if d == best]
    if len(picks) == 2:
        picks = [c for c in picks if int(np.array(c).view(np.int32)) % 2 == 0]
    return F32(picks[0])


def _bf16_bits(f: F32) -> int:
    b = int(np.array(f, dtype=F32).view(np.uint32))
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _decode(codes: np.ndarray, sbytes: np.ndarray) -> np.ndarray:
    mags = E2M1[codes & 7] * np.where(codes >= 8, -1.0, 1.0)
    return mags * np.repeat(E4M3[sbytes], 16, axis=-1)  # float64, exact


def _quantize_stack(w: np.ndarray):
    """P6 via the oracle: one g per expert (P1 of the matrix amax), alpha = RN(1/g)."""
    out = []
    for m in w:
        amax = F32(np.abs(m).max())
        with np.errstate(divide="ignore", over="ignore"):
            g = F32(1) if amax == 0 else min(F32(F32(2688) / amax), F32(np.finfo(F32).max))
        codes, sbytes = oracle_rows(m, np.full(m.shape[0], g, dtype=F32))
        out.append((_decode(codes, sbytes), F32(F32(1) / F32(g))))
    return out


def _quantize_row(a: np.ndarray):
    codes, sbytes, d, _ = _oracle_full(a[None, :])
    return _decode(codes, sbytes)[0], F32(d[0])


def _oracle_full(x):
    return oracle(x)


def _dot(a: np.ndarray, b: np.ndarray) -> F32:
    return _rn32(sum((Fraction(float(u)) * Fraction(float(v)) for u, v in zip(a, b, strict=True)), Fraction(0)))


def restated(x, routing, prob, fc1, fc2, offset, activation):
    """P1-P12 for bf16-valued float32 arrays: x [T, H], fc1 [E, N1, H], fc2 [E, H, I]; returns the bf16 bits
    of out [T, H] and P8's h of each computed (token, slot)."""
    t, hdim = x.shape
    idim = fc2.shape[2]
    w1, w2 = _quantize_stack(fc1), _quantize_stack(fc2)
    codes, sbytes, d, _ = _oracle_full(x)
    xq = _decode(codes, sbytes)
    out = np.zeros((t, hdim), dtype=np.int64)
    hs = {}
    for r in range(t):
        acc = [F32(0)] * hdim
        for j in range(routing.shape[1]):
            e = int(routing[r, j]) - offset
            if not 0 <= e < len(w1):
                continue
            wq1, a1 = w1[e]
            h = np.array([F32(F32(_dot(wq1[n], xq[r]) * a1) * d[r]) for n in range(wq1.shape[0])], dtype=F32)
            hs[r, j] = h
            if activation == "relu2":
                rr = np.where(h > 0, h, F32(0)).astype(F32)
                act = (rr * rr).astype(F32)
            else:
                g, u = torch.from_numpy(h[:idim].copy()), torch.from_numpy(h[idim:].copy())
                rcp = mufu.rcp_approx_ftz(mufu.ex2_approx_ftz(g * torch.tensor(-1.4426950216293335)) + 1.0)
                act = (u * (g * rcp)).numpy()
            aq, d2 = _quantize_row(act)
            wq2, a2 = w2[e]
            wj = F32(F32(prob[r, j]) * d2)
            for c in range(hdim):
                y = F32(_dot(wq2[c], aq) * a2)
                acc[c] = _rn32(Fraction(float(wj)) * Fraction(float(y)) + Fraction(float(acc[c])))
        out[r] = [_bf16_bits(v) for v in acc]
    return out, hs


@pytest.mark.parametrize("activation", ["relu2", "swiglu"])
def test_against_restatement(activation):
    gen = torch.Generator().manual_seed(1717)
    e, hdim, idim, t = 3, 32, 32, 5
    n1 = 2 * idim if activation == "swiglu" else idim
    fc1 = (torch.randn(e, n1, hdim, generator=gen) * 0.05).bfloat16()
    fc2 = (torch.randn(e, hdim, idim, generator=gen) * 0.05).bfloat16()
    fc1[1, 3, 7] = 2.5  # an outlier in one expert's matrix
    x = (torch.randn(t, hdim, generator=gen) * 3).bfloat16()
    x[2, 5] = 900.0  # a token with one huge outlier
    x[4] = 0.0  # an all-zero token
    routing = torch.tensor([[1, 3], [-1, 2], [3, 1], [0, 4], [2, -1]])  # offset 1: experts 1..3 are local
    prob = torch.rand(t, 2, generator=gen)
    w = quantize_pertoken_experts(fc1, fc2)
    st = routed_nvfp4_moe_reference(x, routing, prob, w, num_experts=5, local_expert_offset=1, activation=activation)
    want, hs = restated(
        x.float().numpy(), routing.numpy(), prob.numpy(), fc1.float().numpy(), fc2.float().numpy(), 1, activation
    )
    got = st.out.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    np.testing.assert_array_equal(got, want)
    for (r, j), h in hs.items():  # P8: alpha first, then the token scale (the other order differs in places)
        np.testing.assert_array_equal(st.h[r, j].numpy().view(np.int32), h.view(np.int32))
    assert st.local.tolist() == [[True, True], [False, True], [True, True], [False, False], [True, False]]
    assert st.out[3].abs().max().item() == 0.0  # no local expert: +0


# ------------------------------------------------------------------------------------------------------
# routing entries, token_capacity
# ------------------------------------------------------------------------------------------------------


def _layer(activation="relu2", t=6):
    gen = torch.Generator().manual_seed(7)
    n1 = 64 if activation == "swiglu" else 32
    w = quantize_pertoken_experts(
        (torch.randn(2, n1, 32, generator=gen) * 0.1).bfloat16(),
        (torch.randn(2, 32, 32, generator=gen) * 0.1).bfloat16(),
    )
    x = torch.randn(t, 32, generator=gen).bfloat16()
    return w, x, torch.rand(t, 3, generator=gen)


def test_minus_one_and_remote_slots_add_nothing():
    """A slot of -1 or of an expert outside [offset, offset + E) gives the same out as dropping the slot."""
    w, x, p = _layer()
    full = torch.tensor([[0, -1, 1]] * 6)
    dropped = torch.tensor([[0, 1]] * 6)
    remote = torch.tensor([[0, 5, 1]] * 6)
    kw = dict(num_experts=6, local_expert_offset=0, activation="relu2")
    a = routed_nvfp4_moe_reference(x, full, p, w, **kw).out
    b = routed_nvfp4_moe_reference(x, dropped, p[:, [0, 2]], w, **kw).out
    c = routed_nvfp4_moe_reference(x, remote, p, w, **kw).out
    assert torch.equal(a.view(torch.int16), b.view(torch.int16)) and torch.equal(
        a.view(torch.int16), c.view(torch.int16)
    )
    # the same experts at offset 4 of 6: ids 4, 5 are local, 0 and 1 are not
    d = routed_nvfp4_moe_reference(
        x, full + 4 * (full >= 0), p, w, num_experts=6, local_expert_offset=4, activation="relu2"
    ).out
    assert torch.equal(a.view(torch.int16), d.view(torch.int16))


def test_token_capacity_prefix_and_untouched_rows():
    w, x, p = _layer("swiglu")
    routing = torch.tensor([[0, 1, -1]] * 6)
    kw = dict(num_experts=2, local_expert_offset=0, activation="swiglu")
    full = routed_nvfp4_moe_reference(x, routing, p, w, **kw).out
    out = torch.full((6, 32), 7.0, dtype=torch.bfloat16)
    part = routed_nvfp4_moe_reference(x, routing, p, w, out=out, token_capacity=4, **kw)
    assert torch.equal(part.out[:4].view(torch.int16), full[:4].view(torch.int16))
    assert bool((part.out[4:] == 7.0).all()) and bool((out == 7.0).all())  # out itself is not modified
    assert part.x_codes.shape == (4, 16) and part.fc1_acc.shape == (4, 3, 64)
    none = routed_nvfp4_moe_reference(x, routing, p, w, token_capacity=0, **kw)
    assert none.out.abs().max().item() == 0.0


# ------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------


def test_bad_input_names_the_argument():
    w, x, p = _layer()
    r = torch.tensor([[0, 1, -1]] * 6)
    kw = dict(num_experts=2, local_expert_offset=0, activation="relu2")
    with pytest.raises(ValueError, match=r"routing_map: entry -2 at index \(1, 2\)"):
        routing_map = r.clone()
        routing_map[1, 2] = -2
        routed_nvfp4_moe_reference(x, routing_map, p, w, **kw)
    with pytest.raises(ValueError, match="routing_map: entry 2"):
        routed_nvfp4_moe_reference(x, r.clamp(min=0) + 1, p, w, **kw)
    with pytest.raises(ValueError, match="activation: 'swiglu' needs gated"):
        routed_nvfp4_moe_reference(x, r, p, w, num_experts=2, local_expert_offset=0, activation="swiglu")
    with pytest.raises(ValueError, match="activation: must be one of"):
        routed_nvfp4_moe_reference(x, r, p, w, num_experts=2, local_expert_offset=0, activation="gelu")
    with pytest.raises(ValueError, match="local_expert_offset"):
        routed_nvfp4_moe_reference(x, r, p, w, num_experts=2, local_expert_offset=1, activation="relu2")
    with pytest.raises(ValueError, match="token_capacity"):
        routed_nvfp4_moe_reference(x, r, p, w, token_capacity=7, **kw)
    with pytest.raises(ValueError, match="hidden_states: hidden size 16"):
        routed_nvfp4_moe_reference(x[:, :16], r, p, w, **kw)
    with pytest.raises(TypeError, match="probabilities: dtype"):
        routed_nvfp4_moe_reference(x, r, p.double(), w, **kw)
    with pytest.raises(ValueError, match="out: dimension 0"):
        routed_nvfp4_moe_reference(x, r, p, w, out=torch.zeros(5, 32, dtype=torch.bfloat16), **kw)
    with pytest.raises(ValueError, match="fc1_weight: dimension 1 must be I = 32"):
        quantize_pertoken_experts(torch.zeros(1, 48, 32).bfloat16(), torch.zeros(1, 32, 32).bfloat16())
    with pytest.raises(ValueError, match="fc2_weight: intermediate size I"):
        quantize_pertoken_experts(torch.zeros(1, 24, 32).bfloat16(), torch.zeros(1, 32, 24).bfloat16())
    with pytest.raises(ValueError, match="fc1_alpha: must be finite and > 0"):
        PerTokenNVFP4Experts(w.fc1, w.fc1_scale, torch.zeros(2), w.fc2, w.fc2_scale, w.fc2_alpha, gated=False)


def test_non_finite_fc2_input_is_refused():
    """FC1 = 1e30 (bf16), x = 1: h = 16e30 and relu2 overflows fp32 -> the FC2 input is inf."""
    w, x = _one_expert_layer(1.0, 1e30, 1.0)
    with pytest.raises(ValueError, match="act: FC2 input of token 0, slot 0 has the non-finite value inf"):
        routed_nvfp4_moe_reference(
            x, torch.tensor([[0]]), torch.tensor([[1.0]]), w, num_experts=1, local_expert_offset=0, activation="relu2"
        )


def _sequential(n: int) -> dict:
    return {
        "format": "flint-order/1",
        "length": n,
        "parts": [[0, n]],
        "part_length": n,
        "axes": [["k", n]],
        "operands": {"w_scale_log2": 0, "w_dtype": "fp32"},
        "program": [{"op": "fma_chain", "axis": "k", "init": "zero"}],
    }


def test_declared_orders_are_replayed():
    """With a sequential fma order declared for FC1 and FC2, the accumulators are that order's fp32 values:
    acc = fma(w_k, x_k, acc) from +0 over k, each step rounded once from the exact rational here."""
    gen = torch.Generator().manual_seed(3)
    spread = torch.exp2(torch.randint(-9, 9, (1, 16), generator=gen).float()).repeat_interleave(16, 1)
    w = quantize_pertoken_experts(
        (torch.randn(2, 32, 256, generator=gen) * spread).bfloat16(),
        (torch.randn(2, 256, 32, generator=gen) * 0.1).bfloat16(),
    )
    x = (torch.randn(2, 256, generator=gen) * spread).bfloat16()
    p = torch.rand(2, 3, generator=gen)
    routing = torch.tensor([[0, 1, -1], [1, -1, -1]])
    st = routed_nvfp4_moe_reference(
        x, routing, p, w, num_experts=2, local_expert_offset=0, activation="relu2",
        orders={"fc1": _sequential(256), "fc2": _sequential(32)},
    )  # fmt: skip
    plain = routed_nvfp4_moe_reference(x, routing, p, w, num_experts=2, local_expert_offset=0, activation="relu2")
    assert bool((plain.fc1_acc != st.fc1_acc).any())  # the order's roundings show somewhere
    xq = _decode(_unpack_rows(st.x_codes), st.x_scale.view(torch.uint8).numpy())
    for r, j in ((0, 0), (0, 1), (1, 0)):
        e = int(routing[r, j])
        wq1 = _decode(_unpack_rows(w.fc1[e]), w.fc1_scale[e].view(torch.uint8).numpy())
        aq = _decode(_unpack_rows(st.a_codes[r, j][None]), st.a_scale[r, j][None].view(torch.uint8).numpy())[0]
        wq2 = _decode(_unpack_rows(w.fc2[e]), w.fc2_scale[e].view(torch.uint8).numpy())
        for n in (0, 7, 31):
            assert st.fc1_acc[r, j, n].item() == float(_fma_chain(wq1[n], xq[r]))
            assert st.fc2_acc[r, j, n].item() == float(_fma_chain(wq2[n], aq))
    with pytest.raises(ValueError, match="orders: keys must be"):
        routed_nvfp4_moe_reference(x, routing, p, w, num_experts=2, local_expert_offset=0, activation="relu2",
                                   orders={"down": _sequential(256)})  # fmt: skip


def _unpack_rows(packed: torch.Tensor) -> np.ndarray:
    b = packed.numpy()
    return np.stack((b & 0xF, b >> 4), -1).reshape(*b.shape[:-1], -1)


def _fma_chain(w: np.ndarray, x: np.ndarray) -> F32:
    acc = F32(0)
    for a, b in zip(w, x, strict=True):
        acc = _rn32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(acc)))
    return acc
