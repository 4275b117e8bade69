"""``flint_moe.checkpoints.experts``: the one expert-name rule (canonical decimal indices), the layer's expert
count checked from the names before anything is allocated, completion by (expert, projection, kind)."""

from __future__ import annotations

import re

import pytest
import torch

from flint_moe.checkpoints import CheckpointError
from flint_moe.checkpoints.experts import ExpertStack, check_stack_fits, expert_count, parse_expert_name
from tests.checkpoints._writers import NOT_CANONICAL, random_experts


def test_parse_expert_name_accepts_canonical_indices() -> None:
    assert parse_expert_name("0.gate_proj.weight") == (0, "gate_proj", "weight")
    assert parse_expert_name("10.down_proj.input_scale") == (10, "down_proj", "input_scale")
    assert parse_expert_name("999999999.up_proj.weight_scale_2") == (999999999, "up_proj", "weight_scale_2")
    assert parse_expert_name("7.up_proj.weight_scale", num_experts=8) == (7, "up_proj", "weight_scale")


@pytest.mark.parametrize("index", ["00", "01", "007", "+1", "-1", " 1", "1 ", "1_0", "\u0663", "0x1", "1e2", ""])
def test_parse_expert_name_rejects_other_spellings(index: str) -> None:
    name = f"{index}.down_proj.weight"
    with pytest.raises(CheckpointError, match=rf"^L\.{re.escape(name)}: expert index {re.escape(repr(index))} "):
        parse_expert_name(name, "L." + name)
    with pytest.raises(CheckpointError) as exc:
        parse_expert_name(name)
    assert str(exc.value) == f"{name}: expert index {index!r} {NOT_CANONICAL}"
    assert exc.value.tensor == name and exc.value.path is None


def test_parse_expert_name_bounds() -> None:
    with pytest.raises(CheckpointError) as exc:
        parse_expert_name("99999999999.gate_proj.weight")
    assert str(exc.value) == "99999999999.gate_proj.weight: expert index '99999999999' out of range (at most 9 digits)"
    with pytest.raises(CheckpointError) as exc:
        parse_expert_name("99999999999.gate_proj.weight", num_experts=4)
    assert str(exc.value) == "99999999999.gate_proj.weight: expert index '99999999999' out of range [0, 4)"
    with pytest.raises(CheckpointError) as exc:
        parse_expert_name("4.gate_proj.weight", num_experts=4)
    assert str(exc.value) == "4.gate_proj.weight: expert index 4 out of range [0, 4)"
    for bad in ("0.gate_proj.bias", "0.w1.weight", "gate_proj.weight", "0.gate_proj.weight.x"):
        with pytest.raises(CheckpointError, match=rf"^{re.escape(bad)}: unknown expert tensor name; expected"):
            parse_expert_name(bad)


def _names(E: int) -> list[str]:
    return list(random_experts(E, 32, 32)[0])


def test_expert_count() -> None:
    assert expert_count(_names(3), "p.") == 3
    assert expert_count(_names(3), "p.", 3, "config") == 3
    with pytest.raises(CheckpointError) as exc:
        expert_count(_names(3), "p.", 4, "config.json num_experts = 4")
    assert str(exc.value) == "p.3.*: expert 3 has no tensors (config.json num_experts = 4: experts 0..3)"
    with pytest.raises(CheckpointError) as exc:
        expert_count(_names(3), "p.", 2, "cfg")
    assert str(exc.value).startswith("p.2.") and str(exc.value).endswith(": expert index 2 out of range [0, 2)")
    # a gap, and an index far beyond the experts present: refused from the names alone (nothing is allocated)
    gap = [n for n in _names(3) if not n.startswith("1.")]
    with pytest.raises(CheckpointError) as exc:
        expert_count(gap, "p.")
    assert str(exc.value) == "p.1.*: expert 1 has no tensors (expert 2 has: the indices present must be 0..E-1)"
    far = [*_names(3), "999999999.gate_proj.weight"]
    with pytest.raises(CheckpointError) as exc:
        expert_count(far, "p.")
    assert str(exc.value) == "p.3.*: expert 3 has no tensors (expert 999999999 has: the indices present must be 0..E-1)"
    with pytest.raises(CheckpointError, match=r"^p\.00\.gate_proj\.weight: expert index '00' is not a canonical"):
        expert_count([*_names(3), "00.gate_proj.weight"], "p.")
    # every required tensor of every expert, before allocation (input_scale alone does not make an expert)
    part = [n for n in _names(3) if n != "1.down_proj.weight_scale_2"]
    with pytest.raises(CheckpointError) as exc:
        expert_count(part, "p.")
    assert str(exc.value) == (
        "p.1.down_proj.weight_scale_2: missing (1 of 27 required expert tensors missing, e.g. "
        "p.1.down_proj.weight_scale_2)"
    )
    with pytest.raises(CheckpointError, match=r"^p\.3\.gate_proj\.weight: missing \(9 of 36 required expert"):
        expert_count([*_names(3), "3.gate_proj.input_scale"], "p.")
    with pytest.raises(CheckpointError, match=r"^p\.<e>\.\*: no expert tensors$"):
        expert_count([], "p.")


def test_check_stack_fits() -> None:
    check_stack_fits(2, 32, 32, 3456, "f")  # 2 experts x 3 matrices x 32 x 32 x (1/2 + 1/16) bytes = 3456
    with pytest.raises(ValueError) as exc:
        check_stack_fits(2, 32, 32, 3455, "the file")
    assert str(exc.value) == (
        "2 experts of H = 32, I = 32 hold 3456 bytes of weights and scales, more than the 3455 bytes of the file"
    )


def test_stack_completes_by_slot() -> None:
    named, _ = random_experts(3, 32, 32)
    stack = ExpertStack(3, 32, 32, prefix="p.")
    for n, t in named.items():
        if n != "2.down_proj.weight":
            stack.add(n, t)
    assert not stack.complete and stack.missing() == ["2.down_proj.weight"]
    # the same slot under another spelling is refused, not counted
    with pytest.raises(
        CheckpointError, match=rf"^p\.02\.down_proj\.weight: expert index '02' {re.escape(NOT_CANONICAL)}$"
    ):
        stack.add("02.down_proj.weight", named["2.down_proj.weight"])
    assert not stack.complete
    with pytest.raises(CheckpointError) as exc:
        stack.add("1.up_proj.weight", named["1.up_proj.weight"])
    assert (
        str(exc.value) == "p.1.up_proj.weight: loaded twice (expert 1 up_proj.weight was loaded as p.1.up_proj.weight)"
    )
    with pytest.raises(CheckpointError) as exc:
        stack.finish()
    assert str(exc.value) == (
        "p.2.down_proj.weight: missing (1 of 27 required expert tensors missing, e.g. p.2.down_proj.weight)"
    )
    stack.add("2.down_proj.weight", named["2.down_proj.weight"])
    ex = stack.finish()
    assert torch.equal(ex.w2[2], named["2.down_proj.weight"])
