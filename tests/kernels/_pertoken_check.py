"""The per-token NVFP4 MoE's taps against the golden model (``reference.pertoken_experts``), shared by the
interpreter tests and the H200 tests.

Two modes:

- ``orders`` None (interpreter): the golden model takes the kernels' tapped fp32 accumulators (teacher forcing)
  after each one is checked against its certified bound (``FP32_TRUNCATE``: any order, tensor-core alignment;
  the interpreter's numpy fp32 dot per K step cannot reproduce the wgmma's rounding), and every other stage
  (P1-P6, P8-P10, P11's scale, P12) must equal the golden model's bit for bit;
- ``orders`` given (GPU): the golden model replays the declared orders (``kernels.orders.pertoken_orders``), and
  every stage, accumulators included, must equal it bit for bit.
"""

from __future__ import annotations

import torch

from flint_moe.reference.exact import FP32_TRUNCATE
from flint_moe.reference.layouts import decode_routed_nvfp4
from flint_moe.reference.pertoken_experts import routed_nvfp4_moe_reference

#: The stages compared (``PerTokenMoEStages`` field names = the op's tap names).
STAGES = ("x_codes", "x_scale", "x_token_scale", "local", "fc1_acc", "h", "act", "a_codes", "a_scale",
          "a_token_scale", "fc2_acc", "y", "w", "out")  # fmt: skip


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit pattern as an integer tensor (float8 / bf16 / fp32 / bool / ints)."""
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    """'' when bitwise equal (same shape and dtype), else a description of the first difference."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape / dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    d = bits(a) != bits(b)
    if not bool(d.any()):
        return ""
    idx = tuple(int(i) for i in d.nonzero()[0])
    return f"{int(d.sum())} of {d.numel()} differ; first at {idx}: {a[idx].item()!r} vs {b[idx].item()!r}"


def _forcing_policy(taps: dict, ids: torch.Tensor, offset: int, checked: dict):
    """``accumulate`` policy returning the kernel's tapped accumulator of the expert's (row, slot) pairs (the
    golden model's own enumeration: ``nonzero(ids == offset + e)``), after checking it within the bound."""

    def policy(stage: str, acc, operands: dict) -> torch.Tensor:
        e = operands["expert"]
        rows, slots = torch.nonzero(ids.long() == offset + e, as_tuple=True)
        v = taps[f"{stage}_acc"][rows.to(taps[f"{stage}_acc"].device), slots.to(taps[f"{stage}_acc"].device)]
        v = v.to(acc.exact.device)
        err = (v.double() - acc.exact).abs()
        bound = acc.with_model(FP32_TRUNCATE).bound
        bad = ~(err <= bound)
        assert not bool(bad.any()), (
            f"{stage}_acc of expert {e}: {int(bad.sum())} values outside the certified bound; first "
            f"{tuple(int(i) for i in bad.nonzero()[0])}"
        )
        checked[stage] = checked.get(stage, 0) + v.numel()
        return v

    return policy


def check_pertoken_taps(weights, x, ids, p, taps, out, *, num_experts, offset, activation, token_capacity=None,
                        out_before=None, orders=None) -> dict:  # fmt: skip
    """Compare every tap and ``out`` with the golden model (module docstring); returns counts
    ``{"fc1": accumulators checked, "fc2": ..., "pairs": local pairs}``. ``out_before``: the ``out`` buffer's
    contents before the call (rows past ``token_capacity`` must be unchanged)."""
    logical = decode_routed_nvfp4(weights)
    cap = x.shape[0] if token_capacity is None else token_capacity
    checked: dict = {}
    kw = {}
    if orders is None:
        kw["accumulate"] = _forcing_policy(taps, ids[:cap], offset, checked)
    else:
        kw["orders"] = orders
    ref = routed_nvfp4_moe_reference(
        x, ids, p, logical, num_experts=num_experts, local_expert_offset=offset, activation=activation,
        out=out_before, token_capacity=token_capacity, **kw,
    )  # fmt: skip
    for name in STAGES:
        got = out if name == "out" else taps[name]
        want = getattr(ref, name).to(got.device)
        msg = first_diff(got, want)
        assert not msg, f"{name}: kernel vs golden model: {msg}"
    # the padded columns of both quantized operands: code-0 bytes and 0x00 scale bytes
    h, inter = weights.hidden_size, weights.intermediate_size
    assert not bool(taps["x_codes_padded"][:, h // 2 :].any()) and not bool(taps["x_scale_padded"][:, h // 16 :].any())
    local = taps["local"]
    assert not bool(taps["a_codes_padded"][local][:, inter // 2 :].any())
    assert not bool(taps["a_scale_padded"][local][:, inter // 16 :].any())
    return {"fc1": checked.get("fc1", 0), "fc2": checked.get("fc2", 0), "pairs": int(local.sum())}
