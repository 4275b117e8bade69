"""flint_moe.kernels._launch, _shims, _rule and audit/ under the interpreter: each helper equals the golden
emulation bit for bit, bf16_rn rounds to nearest even (ties, carries, subnormals, overflow, NaN), launch
options, input checks, the PTX audit matcher and registry."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from flint_moe.kernels import _launch as L, _rule as R, _shims
from flint_moe.kernels.audit import probes, ptx as audit_ptx_mod, registry
from flint_moe.reference import formats, mufu

BACKEND = "interpreter"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN matches any NaN (the rule never compares NaN payloads)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    return torch.equal(_bits(a.float())[~na], _bits(b.float())[~nb])


def _run_probe(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel()
    f32 = torch.full((6, n), float("nan"))
    b16 = torch.zeros(n, dtype=torch.bfloat16)
    block = 8192  # few programs: the interpreter's cost is per program and per op
    grid = (triton_cdiv(n, block),)
    probes._helpers_probe_kernel[grid](x, f32, b16, n, BLOCK=block, **L.launch_options())
    return f32, b16


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _f32_from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def _special_f32() -> torch.Tensor:
    bits = [
        0x00000000,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0xFFC00001,
        0x7F800001,  # 0, inf, NaN
        0x00000001,
        0x807FFFFF,
        0x00400000,
        0x00800000,
        0x80800000,  # subnormals, min normal
        0x3F800000,
        0xBF800000,
        0x3F7FFFFF,
        0x7F7FFFFF,
        0xFF7FFFFF,  # 1, -1, 1-ulp, max
        0x3F808000,
        0x3F818000,
        0x3F808001,
        0x3F80FFFF,
        0x3FFF8000,  # bf16 ties (even/odd), carries
        0x7F7F8000,
        0x7F7F7FFF,
        0xFF7F8000,
        0x00008000,
        0x00018000,
        0x80008000,  # overflow, subnormal ties
    ]
    return _f32_from_bits(bits)


def _random_f32(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
        .to(torch.int32)
        .view(torch.float32)
    )


def test_interpreter_mode_is_on() -> None:
    assert L.INTERPRET is True


def test_helpers_equal_golden_bitwise() -> None:
    """One launch (the emulation tables load once per process): specials, random fp32 bit patterns, a ramp
    over ex2's range, and all 65,536 bf16 values (expf's whole domain)."""
    all_bf16 = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = torch.cat([_special_f32(), _random_f32(3000, 1), torch.linspace(-130.0, 130.0, 521), all_bf16])
    f32, b16 = _run_probe(x)
    assert _same(f32[0], mufu.rcp_approx_ftz(x))
    assert _same(f32[1], mufu.ex2_approx_ftz(x))
    assert _same(f32[2], mufu.rsqrt_approx_ftz(x))
    assert _same(f32[3], mufu.expf_libdevice(formats.round_bf16(x)))  # expf takes bf16 values
    assert _same(f32[4], x / (x + 1.0))  # torch fp32 CPU division is IEEE correctly rounded
    assert _same(f32[5], x)
    assert _same(b16.float(), formats.round_bf16(x))
    assert _same(b16[-(1 << 16) :].float(), all_bf16)  # bf16 values round to themselves


def test_expf_shim_rejects_non_bf16_values() -> None:
    @triton.jit
    def _k(x_ptr, y_ptr):
        tl.store(y_ptr, R.expf_libdevice(tl.load(x_ptr)))

    with pytest.raises(Exception, match="bf16"):
        _k[(1,)](torch.tensor([1.0 + 2.0**-20]), torch.empty(1))


@triton.jit
def _bf16_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    m = o < n
    tl.store(y_ptr + o, R.bf16_rn(tl.load(x_ptr + o, mask=m, other=0.0)), mask=m)


def _bf16_only(x: torch.Tensor) -> torch.Tensor:
    """bf16_rn alone (the probe kernel would load every emulation table)."""
    y = torch.zeros(x.numel(), dtype=torch.bfloat16)
    _bf16_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()), **L.launch_options())
    return y


def test_bf16_rn_round_to_nearest_even() -> None:
    x = torch.cat([_special_f32(), _random_f32(20000, 2)])
    # every tie pattern: low 16 bits exactly 0x8000, with even and odd kept parts
    hi = torch.randint(0, 1 << 16, (2000,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    x = torch.cat([x, ((hi << 16) | 0x8000).to(torch.int32).view(torch.float32)])
    b16 = _bf16_only(x)
    assert _same(b16.float(), formats.round_bf16(x))
    # independent check: torch's CPU fp32 -> bf16 cast is round-to-nearest-even
    assert _same(b16.float(), x.to(torch.bfloat16).float())


def test_bf16_rn_hand_values() -> None:
    cases = {
        0x3F808000: 0x3F80,  # tie, kept part even -> down
        0x3F818000: 0x3F82,  # tie, kept part odd -> up
        0x3F808001: 0x3F81,  # above tie -> up
        0x3F80FFFF: 0x3F81,
        0x3FFF8000: 0x4000,  # tie, odd, carry into the exponent
        0x7F7F8000: 0x7F80,  # tie at the top, odd -> +inf
        0x7F7F7FFF: 0x7F7F,
        0x00008000: 0x0000,  # subnormal tie, even -> 0
        0x00018000: 0x0002,  # subnormal tie, odd -> up
        0x80008000: 0x8000,  # -0 kept
    }
    x = _f32_from_bits(list(cases))
    b16 = _bf16_only(x)
    got = [int(v) & 0xFFFF for v in b16.view(torch.int16).tolist()]
    assert got == list(cases.values())


def test_interpreter_plain_cast_truncates() -> None:
    """Why the shim exists: the interpreter's own ``.to(tl.bfloat16)`` truncates."""

    @triton.jit
    def _plain(x_ptr, y_ptr, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        tl.store(y_ptr + o, tl.load(x_ptr + o).to(tl.bfloat16))

    x = _f32_from_bits([0x3F80FFFF, 0x3F808001, 0x3F818000, 0x3F800000])
    y = torch.empty(4, dtype=torch.bfloat16)
    _plain[(1,)](x, y, BLOCK=4)
    assert [int(v) & 0xFFFF for v in y.view(torch.int16).tolist()] == [0x3F80, 0x3F80, 0x3F81, 0x3F80]


def _all_bf16() -> torch.Tensor:
    """Every bf16 bit pattern, 0x0000 .. 0xFFFF."""
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_interpreter_widens_bf16_exactly() -> None:
    """Every bf16 value, subnormals and signed zeros included, widens to fp32 by the 16-bit shift the GPU
    performs, both through ``.to(tl.float32)`` and through the implicit promotion of bf16 * fp32 (Triton's own
    interpreter cast turns bf16 2^-130 into 0 and 3 * 2^-133 into 2^-127)."""

    @triton.jit
    def _widen(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        x = tl.load(x_ptr + o, mask=m, other=0.0)
        tl.store(y_ptr + o, x.to(tl.float32), mask=m)
        tl.store(z_ptr + o, x * tl.full((BLOCK,), 1.0, tl.float32), mask=m)

    x = _all_bf16()
    n = x.numel()
    y = torch.empty(n, dtype=torch.float32)
    z = torch.empty(n, dtype=torch.float32)
    _widen[(triton_cdiv(n, 16384),)](x, y, z, n, BLOCK=16384)
    want = (x.view(torch.int16).to(torch.int32) & 0xFFFF) << 16  # the bf16 pattern in the high half
    assert torch.equal(y.view(torch.int32), want.to(torch.int32))
    finite = ~torch.isnan(x.float())
    assert torch.equal(z.view(torch.int32)[finite], want.to(torch.int32)[finite])
    # hand values: 0x0008 = 2^-130, 0x0003 = 3 * 2^-133, 0x8001 = -2^-133
    assert y[0x0008].item() == 2.0**-130 and y[0x0003].item() == 3 * 2.0**-133 and y[0x8001].item() == -(2.0**-133)
    assert y[0x8000].view(torch.int32).item() == -(2**31)  # -0.0 stays -0.0


def test_shim_constexpr_reprs_name_the_function() -> None:
    """The shims' constexpr reprs carry no memory address, so Triton's cache key is the same in every process."""
    shims = {k: v for k, v in vars(_shims).items() if k.startswith("_SHIM_")}
    assert sorted(shims) == sorted(
        f"_SHIM_{n}" for n in ("rcp_approx_ftz", "ex2_approx_ftz", "rsqrt_approx_ftz", "expf_libdevice", "div_rn",
                               "bf16_rn", "fma_rn")
    )
    for name, v in shims.items():
        text = repr(v.value)
        assert text == f"<shim flint_moe.kernels._shims._shim_{name[6:]}>", text
        assert "0x" not in str(v)


def test_launch_options() -> None:
    assert L.launch_options() == {"enable_fp_fusion": True}  # no PDL under the interpreter
    assert L.launch_options(pdl=False) == {"enable_fp_fusion": True}


def test_check_op_tensor() -> None:
    t = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert L.check_op_tensor("x", t, dtype=torch.bfloat16, shape=(2, None), device="cpu") is t
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor"):
        L.check_op_tensor("x", [1, 2])
    with pytest.raises(TypeError, match=r"^x: dtype must be torch.float32"):
        L.check_op_tensor("x", t, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^x: expected 3 dimensions"):
        L.check_op_tensor("x", t, shape=(2, 3, 1))
    with pytest.raises(ValueError, match=r"^x: dimension 1 must be 4"):
        L.check_op_tensor("x", t, shape=(2, 4))
    with pytest.raises(ValueError, match=r"^x: must be on cuda"):
        L.check_op_tensor("x", t, device="cuda")
    with pytest.raises(ValueError, match=r"^x: must be contiguous"):
        L.check_op_tensor("x", t.t())
    assert L.check_op_tensor("x", t.t(), contiguous=False) is not None


def test_audit_ptx_matcher() -> None:
    ptx = "\n".join(
        [
            ".reg .f64 %fd<2>;  // a declaration, not arithmetic",
            "\tcvt.rn.bf16x2.f32 %r1, %f1, %f2;",
            "\tdiv.rn.f32 %f3, %f1, %f2;",
            "// div.full.f32 in a comment",
        ]
    )
    assert audit_ptx_mod.audit_ptx(ptx, [registry.BF16_CVT, "div.rn.f32"]) == []
    assert audit_ptx_mod.audit_ptx(ptx, ["rcp.approx.ftz.f32"]) == ["required instruction missing: rcp.approx.ftz.f32"]
    for bad in (
        "\tdiv.full.f32 %f1, %f2, %f3;",
        "\tadd.rn.f64 %fd1, %fd2, %fd3;",
        "@%p1 cvt.f64.f32 %fd1, %f1;",
        "\tfma.rn.f64 %fd1, %fd2, %fd3, %fd1;",
        "\tmul.f64 %fd1, %fd2, %fd3;",
    ):
        assert len(audit_ptx_mod.audit_ptx(ptx + "\n" + bad, [])) == 1, bad


def test_register_audit_conflict() -> None:
    name = "test_common.scratch"
    try:
        sig = {"x_ptr": "*fp32", "f32_ptr": "*fp32", "bf16_ptr": "*bf16", "n": "i64"}
        registry.register_audit(name, probes._helpers_probe_kernel, sig, {"BLOCK": 64}, ["div.rn.f32"])
        registry.register_audit(name, probes._helpers_probe_kernel, sig, {"BLOCK": 64}, ["div.rn.f32"])  # idempotent
        with pytest.raises(ValueError, match="already registered"):
            registry.register_audit(name, probes._helpers_probe_kernel, sig, {"BLOCK": 128}, ["div.rn.f32"])
    finally:
        registry.AUDIT_REGISTRY.pop(name, None)


def test_compile_refuses_interpreter_objects() -> None:
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        audit_ptx_mod.compile_ptx_sm90(probes._helpers_probe_kernel, {}, {})
