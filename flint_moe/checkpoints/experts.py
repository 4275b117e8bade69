"""Per-expert ModelOpt NVFP4 tensors -> stacked checkpoint-layout experts (shared by the loaders and modules).

Names (relative to one MoE layer's ``experts`` prefix; ModelOpt / HF naming, shared/notes/models-and-formats.md):
``{e}.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2,input_scale}`` with

| kind | dtype | shape (gate/up) | shape (down) |
|---|---|---|---|
| ``weight`` | uint8 (int8 accepted: a GGUF I8 view of the same bytes) | [I, H/2] | [H, I/2] |
| ``weight_scale`` | float8_e4m3fn or uint8 / int8 bytes (row-major, not swizzled) | [I, H/16] | [H, I/16] |
| ``weight_scale_2`` | fp32, one element (0-d or [1]) | | |
| ``input_scale`` | anything: accepted and ignored (W4A16 has no activation scale) | | |

``e`` is a canonical decimal index: ASCII digits 0-9, no sign, no leading zero ("0" itself excepted), no
whitespace or underscores, at most 9 digits (``parse_expert_name``). Each name stands for one slot
(expert, projection, kind), so ``00.down_proj.weight`` is refused rather than taken as expert 0.

``ExpertStack`` copies each tensor into preallocated stacked buffers ``w13`` [E, 2I, H/2] (rows [gate; up]),
``w13_scale`` [E, 2I, H/16], ``w13_scale_2`` fp32 [E, 2] (gate, up), ``w2`` [E, H, I/2], ``w2_scale``
[E, H, I/16], ``w2_scale_2`` [E] and rejects (ValueError naming the tensor) unknown names, non-canonical
indices, expert indices out of range, a slot written twice, wrong shapes, E4M3 NaN scale bytes (0x7F / 0xFF: the
Flint rule rejects NaN scales) and non-finite or negative global scales; wrong dtypes raise TypeError. It is
complete when every slot of ``REQUIRED_KINDS`` of every expert was written exactly once. ``ModelOptExperts`` is
the finished stack. Readers size the stack with ``expert_count`` (every name checked, the index range bounded
and complete) and ``check_stack_fits`` before anything is allocated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from flint_moe.checkpoints.errors import CheckpointError
from flint_moe.reference._checks import check_tensor
from flint_moe.reference.weights import NVFP4Experts, check_scale_bytes

__all__ = [
    "EXPERT_NAME",
    "INDEX",
    "PROJECTIONS",
    "REQUIRED_KINDS",
    "ExpertStack",
    "ModelOptExperts",
    "check_stack_fits",
    "expert_count",
    "parse_expert_name",
]

#: A canonical decimal index (expert or layer): "0", or 1-9 followed by at most 8 ASCII digits.
INDEX = r"(?:0|[1-9][0-9]{0,8})"
#: ``{e}.{proj}.{kind}`` with a canonical ``e`` (the module's ``load_weights`` names).
EXPERT_NAME = re.compile(rf"({INDEX})\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale|weight_scale_2|input_scale)")
_ANY_INDEX = re.compile(r"([^.]*)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale|weight_scale_2|input_scale)")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
#: Kinds every expert needs (``input_scale`` is optional).
REQUIRED_KINDS = ("weight", "weight_scale", "weight_scale_2")
FP8 = torch.float8_e4m3fn
#: Bytes of one expert's required tensors per H * I: three E2M1 matrices (1/2 byte a value) + their E4M3 scales
#: (1/16 byte a value); the same for GGUF NVFP4 (36 bytes per 64 values).
BYTES_PER_HI = 3 * 9 / 16


def parse_expert_name(name: object, full: str | None = None, num_experts: int | None = None) -> tuple[int, str, str]:
    """``(e, proj, kind)`` of an expert tensor name ``{e}.{proj}.{kind}`` (module docstring).

    ``full`` is the name the errors show (default ``name``); with ``num_experts`` the index must be below it.
    Raises CheckpointError (a ValueError) naming the tensor: an unknown name, an index that is not canonical
    decimal, an index out of range.
    """
    full = str(name) if full is None else full
    m = _ANY_INDEX.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise CheckpointError(
            None,
            full,
            "unknown expert tensor name; expected '{e}.{gate,up,down}_proj."
            "{weight,weight_scale,weight_scale_2,input_scale}'",
        )
    text = m[1]
    if re.fullmatch(INDEX, text) is None:
        shown = repr(text if len(text) <= 24 else text[:24] + "...")
        if re.fullmatch(r"[1-9][0-9]*", text) is None:
            what = f"expert index {shown} is not a canonical decimal integer (ASCII digits 0-9 without sign, leading"
            raise CheckpointError(None, full, what + " zero, whitespace or underscore)")
        bound = f"[0, {num_experts})" if num_experts is not None else "(at most 9 digits)"
        raise CheckpointError(None, full, f"expert index {shown} out of range {bound}")
    e = int(text)
    if num_experts is not None and e >= num_experts:
        raise CheckpointError(None, full, f"expert index {e} out of range [0, {num_experts})")
    return e, m[2], m[3]


def expert_count(names: Iterable[str], prefix: str = "", num_experts: int | None = None, count_source: str = "") -> int:
    """E of one MoE layer from its expert tensor names (relative to ``prefix``), checked before any allocation.

    Every name is parsed (``parse_expert_name``). With ``num_experts`` (the checkpoint config's count, described
    by ``count_source`` in errors) every index must lie in [0, num_experts); without it the indices present must
    be 0..E-1 with none left out. Then every expert needs every required tensor (``REQUIRED_KINDS`` of
    ``PROJECTIONS``). Returns E >= 1.

    Raises:
        CheckpointError (a ValueError) naming a tensor: a bad name or index, an index out of range, an expert
        with no tensors, a required tensor missing (the message counts them and names up to 8).
    """
    slots: set[tuple[int, str, str]] = set()
    for rel in names:
        slots.add(parse_expert_name(rel, prefix + rel, num_experts))
    ids = sorted({e for e, _, _ in slots})
    if not ids:
        raise CheckpointError(None, f"{prefix}<e>.*", "no expert tensors")
    E = num_experts if num_experts is not None else len(ids)
    if len(ids) != E or ids[-1] != E - 1:
        gap = next(e for e in range(max(E, ids[-1] + 1)) if e >= len(ids) or ids[e] != e)
        why = (f"{count_source}: experts 0..{E - 1}" if num_experts is not None
               else f"expert {ids[-1]} has: the indices present must be 0..E-1")  # fmt: skip
        raise CheckpointError(None, f"{prefix}{gap}.*", f"expert {gap} has no tensors ({why})")
    miss = [f"{prefix}{e}.{p}.{k}" for e in range(E) for p in PROJECTIONS for k in REQUIRED_KINDS
            if (e, p, k) not in slots]  # fmt: skip
    if miss:
        raise CheckpointError(
            None,
            miss[0],
            f"missing ({len(miss)} of {E * len(PROJECTIONS) * len(REQUIRED_KINDS)} required expert "
            f"tensors missing, e.g. {', '.join(miss[:8])})",
        )
    return E


def check_stack_fits(num_experts: int, hidden_size: int, intermediate_size: int, available: int, where: str) -> None:
    """ValueError unless ``num_experts`` experts of H x I fit the ``available`` bytes their tensors come from
    (``where``: e.g. the checkpoint files): a stack larger than the data it is filled from is never allocated."""
    need = int(num_experts * hidden_size * intermediate_size * BYTES_PER_HI)
    if need > available:
        raise ValueError(
            f"{num_experts} experts of H = {hidden_size}, I = {intermediate_size} hold {need} bytes of weights and "
            f"scales, more than the {available} bytes of {where}"
        )


@dataclass
class ModelOptExperts:
    """E routed NVFP4 experts in the ModelOpt checkpoint layout, stacked (all on one device).

    Fields: ``w13`` uint8 [E, 2I, H/2] (rows [gate; up], low nibble = even element), ``w13_scale``
    float8_e4m3fn [E, 2I, H/16], ``w13_scale_2`` fp32 [E, 2] (column 0 gate, 1 up; the Flint rule needs them
    equal), ``w2`` uint8 [E, H, I/2], ``w2_scale`` float8_e4m3fn [E, H, I/16], ``w2_scale_2`` fp32 [E].
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_scale_2: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_scale_2: torch.Tensor

    @property
    def num_experts(self) -> int:
        return int(self.w13.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.w13.shape[2]) * 2

    @property
    def intermediate_size(self) -> int:
        return int(self.w13.shape[1]) // 2

    def to_flint_weights(self, *, pad_intermediate_to: int | None = None, inplace: bool = False):
        """``layouts.FlintMoEWeights.from_modelopt`` of these experts (ValueError if gate/up global scales
        differ, naming the experts). ``inplace=True`` consumes ``w13`` (it becomes ``w1``)."""
        from flint_moe.layouts import FlintMoEWeights

        return FlintMoEWeights.from_modelopt(
            self.w13, self.w13_scale, self.w13_scale_2, self.w2, self.w2_scale, self.w2_scale_2,
            pad_intermediate_to=pad_intermediate_to, inplace=inplace,
        )  # fmt: skip

    def to_logical(self) -> NVFP4Experts:
        """The golden model's ``reference.weights.NVFP4Experts`` (views; ValueError if gate/up scales differ)."""
        from flint_moe.layouts import merge_gate_up_global_scales

        gs = merge_gate_up_global_scales(self.w13_scale_2, self.num_experts)
        return NVFP4Experts(self.w13, self.w13_scale, gs, self.w2, self.w2_scale, self.w2_scale_2.clone())

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The per-expert ``{e}.{proj}.{kind}`` pairs (views into the stack), for ``load_weights``."""
        inter = self.intermediate_size
        for e in range(self.num_experts):
            for j, proj in enumerate(("gate_proj", "up_proj")):
                rows = slice(j * inter, (j + 1) * inter)
                yield f"{e}.{proj}.weight", self.w13[e, rows]
                yield f"{e}.{proj}.weight_scale", self.w13_scale[e, rows]
                yield f"{e}.{proj}.weight_scale_2", self.w13_scale_2[e, j]
            yield f"{e}.down_proj.weight", self.w2[e]
            yield f"{e}.down_proj.weight_scale", self.w2_scale[e]
            yield f"{e}.down_proj.weight_scale_2", self.w2_scale_2[e]

    def equal(self, other: ModelOptExperts) -> bool:
        """Bitwise equality of every tensor."""
        for name in ("w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2"):
            a, b = getattr(self, name), getattr(other, name)
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(_bits(a), _bits(b)):
                return False
        return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t.view(torch.uint8)


def _as_bytes(name: str, t: object, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    check_tensor(name, t, dtype=dtypes)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


class ExpertStack:
    """Accumulates ``{e}.{proj}.{kind}`` tensors into stacked ModelOpt-layout buffers (module docstring).

    Args:
        num_experts, hidden_size, intermediate_size: E, H, I (H, I positive multiples of 16).
        device: where the stacked buffers live (inputs are copied there).
        prefix: prepended to names in error messages (e.g. the checkpoint's ``...mlp.experts.``).
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        device: torch.device | str | None = None,
        prefix: str = "",
    ) -> None:
        for what, v, mult in (("num_experts", num_experts, 1), ("hidden_size", hidden_size, 16),
                              ("intermediate_size", intermediate_size, 16)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % mult:
                raise ValueError(f"{what}: must be a positive int multiple of {mult}, got {v!r}")
        E, H, I = num_experts, hidden_size, intermediate_size  # noqa: E741
        self.E, self.H, self.I, self.prefix = E, H, I, prefix
        dev = torch.device(device) if device is not None else torch.empty(0).device
        self.device = dev
        self.w13 = torch.empty(E, 2 * I, H // 2, dtype=torch.uint8, device=dev)
        self.w13_scale = torch.empty(E, 2 * I, H // 16, dtype=torch.uint8, device=dev)
        self.w13_scale_2 = torch.empty(E, 2, dtype=torch.float32, device=dev)
        self.w2 = torch.empty(E, H, I // 2, dtype=torch.uint8, device=dev)
        self.w2_scale = torch.empty(E, H, I // 16, dtype=torch.uint8, device=dev)
        self.w2_scale_2 = torch.empty(E, dtype=torch.float32, device=dev)
        #: (expert, projection, kind) -> the name it was written under
        self.loaded: dict[tuple[int, str, str], str] = {}
        self._required = len(PROJECTIONS) * len(REQUIRED_KINDS) * E
        self._have = 0

    @property
    def complete(self) -> bool:
        """Every required tensor (weight, weight_scale, weight_scale_2 of the 3 projections of every expert)."""
        return self._have == self._required

    def missing(self, limit: int = 8) -> list[str]:
        """Up to ``limit`` required names not loaded yet."""
        out = []
        for e in range(self.E):
            for proj in PROJECTIONS:
                for kind in REQUIRED_KINDS:
                    if (e, proj, kind) not in self.loaded:
                        out.append(f"{e}.{proj}.{kind}")
                        if len(out) >= limit:
                            return out
        return out

    def add(self, name: str, tensor: object) -> None:
        """Copy one checkpoint tensor into the stack (validation: module docstring)."""
        full = self.prefix + str(name)
        slot = parse_expert_name(name, full, self.E)
        e, proj, kind = slot
        if slot in self.loaded:
            raise CheckpointError(None, full, f"loaded twice (expert {e} {proj}.{kind} was loaded as "
                                  f"{self.prefix}{self.loaded[slot]})")  # fmt: skip
        H, I = self.H, self.I  # noqa: E741
        down = proj == "down_proj"
        n, k = (H, I) if down else (I, H)
        if kind == "input_scale":
            check_tensor(full, tensor)  # a tensor, otherwise ignored
            self.loaded[slot] = name
            return
        if kind == "weight":
            src = _as_bytes(full, tensor, (torch.uint8, torch.int8))
            check_tensor(full, src, shape=(n, k // 2))
        elif kind == "weight_scale":
            src = _as_bytes(full, tensor, (FP8, torch.uint8, torch.int8))
            check_tensor(full, src, shape=(n, k // 16))
            check_scale_bytes(full, src)
        else:  # weight_scale_2
            check_tensor(full, tensor, dtype=torch.float32)
            if tensor.numel() != 1:
                raise ValueError(f"{full}: expected one fp32 global scale, got shape {tuple(tensor.shape)}")
            v = float(tensor.reshape(()))
            if not (v >= 0 and v < float("inf")) or math.copysign(1.0, v) < 0:  # -0.0 too, as the layouts
                raise ValueError(f"{full}: global scale must be finite and >= +0.0, got {v}")
            src = tensor.reshape(())
        if down:
            dst = {"weight": self.w2, "weight_scale": self.w2_scale, "weight_scale_2": self.w2_scale_2}[kind][e]
        elif kind == "weight_scale_2":
            dst = self.w13_scale_2[e, int(proj == "up_proj")]
        else:
            rows = slice(I, 2 * I) if proj == "up_proj" else slice(0, I)
            dst = (self.w13 if kind == "weight" else self.w13_scale)[e, rows]
        dst.copy_(src)
        self.loaded[slot] = name
        self._have += 1

    def add_all(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, t in pairs:
            self.add(name, t)

    def finish(self) -> ModelOptExperts:
        """The stacked experts (CheckpointError naming missing tensors unless ``complete``). The buffers are
        handed over (not copied)."""
        if not self.complete:
            miss = [self.prefix + n for n in self.missing()]
            raise CheckpointError(None, miss[0], f"missing ({self._required - self._have} of {self._required} "
                                  f"required expert tensors missing, e.g. {', '.join(miss)})")  # fmt: skip
        return ModelOptExperts(
            self.w13, self.w13_scale.view(FP8), self.w13_scale_2, self.w2, self.w2_scale.view(FP8), self.w2_scale_2
        )
