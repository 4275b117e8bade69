"""End-to-end golden model (flint_moe.reference.model) and the reference package's import hygiene."""

from __future__ import annotations

import ast
import math
import pathlib
from fractions import Fraction

import pytest
import torch

import flint_moe.reference as R
from flint_moe.reference.formats import E2M1_VALUES, e4m3_to_float
from tests.reference._oracle import (
    add32,
    bf16,
    f32_bits,
    install_stub_mufu,
    mul32,
    rn32,
    scalar,
    stub_ex2,
    stub_expf,
    stub_rcp,
)

REF_DIR = pathlib.Path(R.__file__).parent


def _nvfp4_experts(e, h, i, seed):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, generator=g)
    pick = torch.tensor([0x28, 0x30, 0x38, 0xB0, 0x34, 0x2C], dtype=torch.uint8)
    s13 = pick[torch.randint(0, 6, (e, 2 * i, h // 16), generator=g)]
    s2 = pick[torch.randint(0, 6, (e, h, i // 16), generator=g)]
    gs13 = torch.rand(e, generator=g) + 0.5
    gs2 = torch.rand(e, generator=g) + 0.5
    return R.NVFP4Experts(w13, s13, gs13, w2, s2, gs2)


def _dequant_py(codes: torch.Tensor, scale: torch.Tensor) -> list[list[float]]:
    """Plain-Python dequant of one matrix (separately written: nibble loop + E2M1 table)."""
    sv = e4m3_to_float(scale).tolist()
    out = []
    for r, row in enumerate(codes.tolist()):
        vals = []
        for b in row:
            vals += [E2M1_VALUES[b & 15], E2M1_VALUES[b >> 4]]
        out.append([v * sv[r][c // 16] for c, v in enumerate(vals)])
    return out


def _dot(a, b):
    return sum((Fraction(x) * Fraction(y) for x, y in zip(a, b, strict=False)), Fraction(0))


def _ref_moe_nvfp4(x, wr, ex, k):
    """Plain loop over tokens / slots, Fractions for the sums, per-op binary32 roundings."""
    m, h = x.shape
    xs = x.float().tolist()
    wrs = wr.float().tolist()
    out = []
    for t in range(m):
        logits = [bf16(rn32(_dot(xs[t], wrs[e]))) for e in range(wr.shape[0])]
        ids = sorted(range(len(logits)), key=lambda e: (-logits[e], e))[:k]  # no NaN / zero-sign cases here
        scores = []
        for e in ids:
            ex_ = scalar(stub_expf, -logits[e])
            scores.append(rn32(Fraction(1) / Fraction(add32(1.0, ex_))))
        total = scores[0]
        for s in scores[1:]:
            total = add32(total, s)
        denom = add32(total, R.RENORM_EPS)
        tw = [bf16(rn32(Fraction(s) / Fraction(denom))) for s in scores]
        acc = [0.0] * h
        ys = []
        for j, e in enumerate(ids):
            w13 = _dequant_py(ex.w13[e], ex.w13_scale[e])
            w2 = _dequant_py(ex.w2[e], ex.w2_scale[e])
            gs, gs2 = float(ex.w13_gs[e]), float(ex.w2_gs[e])
            i = len(w13) // 2
            act = []
            for n in range(i):
                g = mul32(rn32(_dot(w13[n], xs[t])), gs)
                u = mul32(rn32(_dot(w13[i + n], xs[t])), gs)
                p = scalar(stub_ex2, mul32(g, R.SWIGLU_C))
                r = scalar(stub_rcp, add32(p, 1.0))
                act.append(bf16(mul32(u, mul32(g, r))))
            y = [bf16(mul32(rn32(_dot(w2[c], act)), gs2)) for c in range(h)]
            ys.append(y)
            for c in range(h):
                q = Fraction(tw[j]) * Fraction(y[c]) + Fraction(acc[c])
                acc[c] = rn32(q) if q != 0 else (tw[j] * y[c]) + acc[c]
        out.append((ids, tw, ys, [bf16(a) for a in acc]))
    return out


def _nvfp4_layer(monkeypatch, m, e, h, i, seed, router_scale=1.0):
    """Stub mufu installed; NVFP4 experts, then (torch seeded with ``seed``) x bf16 [m, h] and a router bf16
    [e, h] of ``randn * router_scale``."""
    install_stub_mufu(monkeypatch)
    ex = _nvfp4_experts(e, h, i, seed=seed)
    torch.manual_seed(seed)
    x = torch.randn(m, h).bfloat16()
    return ex, x, (torch.randn(e, h) * router_scale).bfloat16()


def test_moe_nvfp4_against_plain_reference(monkeypatch):
    m, e, h, i, k = 3, 6, 32, 16, 2
    ex, x, wr = _nvfp4_layer(monkeypatch, m, e, h, i, seed=1, router_scale=0.3)
    res = R.moe_nvfp4(x, wr, ex, k)
    ref = _ref_moe_nvfp4(x, wr, ex, k)
    for t, (ids, tw, ys, routed) in enumerate(ref):
        assert res.ids[t].tolist() == ids
        assert res.weights[t].tolist() == tw
        for j in range(k):
            assert [f32_bits(v) for v in res.y[t, j].float().tolist()] == [f32_bits(v) for v in ys[j]]
        assert [f32_bits(v) for v in res.routed[t].float().tolist()] == [f32_bits(v) for v in routed]
    assert torch.equal(res.out.view(torch.int16), res.routed.view(torch.int16))  # no shared: out = routed


def test_moe_stage_consistency_and_shapes(monkeypatch):
    m, e, h, i, k = 4, 10, 48, 32, 3
    ex, x, wr = _nvfp4_layer(monkeypatch, m, e, h, i, seed=2)
    shared = torch.randn(m, h).bfloat16()
    r = R.moe_nvfp4(x, wr, ex, k, shared)
    assert r.logits.shape == (m, e) and r.ids.shape == (m, k) and r.ids.dtype == torch.int32
    assert r.g.shape == r.u.shape == r.act.shape == (m, k, i) and r.y.shape == (m, k, h)
    assert r.gate_acc.shape == (m, k, i) and r.down_acc.shape == (m, k, h) and r.router_acc.shape == (m, e)
    # every stage re-derived from the previous stage's outputs with the stage functions
    assert torch.equal(
        r.logits.view(torch.int16), R.logits_from_accumulator(r.router_acc.exact.float()).view(torch.int16)
    )
    sel = torch.gather(r.logits, 1, r.ids.long())
    assert torch.equal(r.scores, R.routing_scores(sel))
    assert torch.equal(r.weights, R.renormalize(r.scores))
    for t in range(m):
        for j in range(k):
            eid = int(r.ids[t, j])
            acc = R.gate_up_accumulate(x[t : t + 1], ex.w13[eid], ex.w13_scale[eid])
            assert torch.equal(r.gate_acc.exact[t, j], acc.exact[0, :i])
            assert torch.equal(r.up_acc.bound[t, j], acc.bound[0, i:])
            assert torch.equal(r.g[t, j], R.apply_global_scale(acc.exact[0, :i].float(), ex.w13_gs[eid]))
    assert torch.equal(r.act.view(torch.int16), R.swiglu(r.g, r.u).view(torch.int16))
    assert torch.equal(r.routed.view(torch.int16), R.combine(r.weights, r.y).view(torch.int16))
    assert torch.equal(r.out.view(torch.int16), R.add_shared(r.routed, shared).view(torch.int16))
    # default policy values conform to their own accumulations
    for a in (r.router_acc, r.gate_acc, r.up_acc, r.down_acc):
        assert bool(R.check_accumulator(a.exact.float(), a).all())
    rows = R.stage_table(r)
    names = [row[0] for row in rows]
    assert names[:5] == ["router_acc", "logits", "ids", "scores", "weights"] and "out" in names
    assert all(len(row) == 4 for row in rows)


def test_moe_bf16_e160_k6_and_policy(monkeypatch):
    install_stub_mufu(monkeypatch)
    m, e, h, i, k = 3, 160, 40, 24, 6
    torch.manual_seed(3)
    ex = R.BF16Experts(torch.randn(e, 2 * i, h).bfloat16(), torch.randn(e, h, i).bfloat16())
    x = torch.randn(m, h).bfloat16()
    wr = torch.randn(e, h).bfloat16()
    calls = []

    def bump(stage, acc, operands):  # a "kernel" whose router accumulator is one ulp up
        calls.append(stage)
        v = acc.exact.float()
        return torch.nextafter(v, torch.full_like(v, math.inf)) if stage == "router" else v

    base = R.moe_bf16(x, wr, ex, k)
    r = R.moe_bf16(x, wr, ex, k, accumulate=bump)
    assert calls[0] == "router" and set(calls) == {"router", "gate_up", "down"}
    up = torch.nextafter(base.router_acc.exact.float(), torch.full((m, e), math.inf))
    assert torch.equal(r.logits.view(torch.int16), R.logits_from_accumulator(up).view(torch.int16))
    assert torch.equal(base.g, base.gate_acc.exact.float())  # BF16 rule: g = g_acc
    assert torch.equal(base.y.view(torch.int16), R.to_bf16(base.down_acc.exact.float()).view(torch.int16))


def test_decode_block_end_to_end(monkeypatch):
    install_stub_mufu(monkeypatch)
    m, e, h, i, si, k = 2, 12, 32, 16, 32, 5
    ex = _nvfp4_experts(e, h, i, seed=4)
    g = torch.Generator().manual_seed(4)
    sw13 = R.NVFP4Linear(
        torch.randint(0, 256, (2 * si, h // 2), dtype=torch.uint8, generator=g),
        torch.full((2 * si, h // 16), 0x30, dtype=torch.uint8),
        torch.tensor(0.75),
    )
    sw2 = R.NVFP4Linear(
        torch.randint(0, 256, (h, si // 2), dtype=torch.uint8, generator=g),
        torch.full((h, si // 16), 0x38, dtype=torch.uint8),
        torch.tensor(1.5),
    )
    attn = torch.randn(m, h, generator=g).bfloat16()
    res = torch.randn(m, h, generator=g).bfloat16()
    w_ln = (torch.rand(h, generator=g) + 0.5).bfloat16()
    wr = torch.randn(e, h, generator=g).bfloat16()
    d = R.moe_decode_block(attn, res, w_ln, 1e-6, wr, ex, k, sw13, sw2)
    s = attn.float() + res.float()
    assert torch.equal(d.s, s) and torch.equal(d.residual.view(torch.int16), R.to_bf16(s).view(torch.int16))
    assert torch.equal(
        d.xn.view(torch.int16), R.rmsnorm_apply(s, d.sumsq_acc.exact.float(), w_ln, 1e-6).view(torch.int16)
    )
    sh = R.nvfp4_expert(
        d.xn, sw13.codes, sw13.block_scale, sw13.global_scale, sw2.codes, sw2.block_scale, sw2.global_scale
    )
    assert torch.equal(d.y_shared.view(torch.int16), sh.y.view(torch.int16))
    direct = R.moe_nvfp4(d.xn, wr, ex, k, sh.y)
    assert torch.equal(d.out.view(torch.int16), direct.out.view(torch.int16))
    assert d.sumsq_acc.shape == (m,)
    names = [row[0] for row in R.stage_table(d)]
    assert "sumsq_acc" in names and "moe.router_acc" in names and "shared_expert.down_acc" in names
    with pytest.raises(ValueError, match="shared_w2: expected shape"):
        R.moe_decode_block(attn, res, w_ln, 1e-6, wr, ex, k, sw13, sw13)


def test_moe_bad_inputs():
    ex = _nvfp4_experts(4, 32, 16, seed=5)
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    wr = torch.zeros(4, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="top_k: must satisfy 1 <= top_k <= E = 4"):
        R.moe_nvfp4(x, wr, ex, 5)
    with pytest.raises(ValueError, match="router_weight: dimension 0 must be 4"):
        R.moe_nvfp4(x, wr[:3], ex, 2)
    with pytest.raises(ValueError, match="x: hidden size 16 does not match the experts' H = 32"):
        R.moe_nvfp4(x[:, :16], wr, ex, 2)
    with pytest.raises(TypeError, match="experts: expected NVFP4Experts"):
        R.moe_nvfp4(x, wr, object(), 2)
    with pytest.raises(ValueError, match="shared: dimension 0 must be 2"):
        R.moe_nvfp4(x, wr, ex, 2, torch.zeros(3, 32, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"accumulate\(router\): dtype must be torch.float32"):
        R.moe_nvfp4(x, wr, ex, 2, accumulate=lambda s, a, o: a.exact)


def test_fp32_ops_keep_subnormals():
    # The golden model relies on torch fp32 ops not flushing denormals (no set_flush_denormal(True)).
    t = torch.tensor([2.0**-149, 2.0**-126], dtype=torch.float32)
    assert (t * 1.0).tolist() == [2.0**-149, 2.0**-126]
    assert (t * 0.5).tolist() == [0.0, 2.0**-127]


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def test_reference_imports_only_torch_numpy_stdlib():
    import sys

    allowed = {"torch", "numpy"} | set(sys.stdlib_module_names)
    files = sorted(REF_DIR.glob("*.py"))
    assert {"exact.py", "routing.py", "experts.py", "combine.py", "decode_block.py", "model.py"} <= {
        f.name for f in files
    }
    for f in files:
        for name in _imports(f):
            if (
                name.startswith(".")
                or name == "flint_moe.reference"
                or name.startswith("flint_moe.reference.")
            ):
                continue  # inside flint_moe.reference
            top = name.split(".")[0]
            assert top in allowed, f"{f.name} imports {name}"
            assert not name.startswith(
                ("triton", "flint_moe.kernels", "flint_moe.conformance", "flint_moe.layouts")
            )


@pytest.mark.slow
def test_deepseek_v3_size_layer_few_tokens(monkeypatch):
    # E=256, H=7168, I=2048, k=8 (6.3 GB of codes + scales): only the selected experts are dequantized.
    install_stub_mufu(monkeypatch)
    e, h, i, k, m = 256, 7168, 2048, 8, 2
    g = torch.Generator().manual_seed(0)
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, generator=g)
    s13 = torch.full((e, 2 * i, h // 16), 0x30, dtype=torch.uint8)
    s2 = torch.full((e, h, i // 16), 0x30, dtype=torch.uint8)
    ex = R.NVFP4Experts(w13, s13, torch.full((e,), 0.01), w2, s2, torch.full((e,), 0.01))
    x = torch.randn(m, h, generator=g).bfloat16()
    wr = torch.randn(e, h, generator=g).bfloat16()
    r = R.moe_nvfp4(x, wr, ex, k)
    assert r.out.shape == (m, h) and r.down_acc.shape == (m, k, h)
    assert bool(R.check_accumulator(r.down_acc.exact.float(), r.down_acc).all())
