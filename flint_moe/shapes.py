"""Real MoE layer shapes (from the models' configs; shared/notes/models-and-formats.md): the one place to add a
model shape.

Used by the conformance matrix (``flint_moe.conformance.inputs.cases``: every shape here is a gpu-profile shape,
and its scaled-down copy, :meth:`MoEShape.scaled_down`, a cpu-profile one), ``nox -s golden``
(``flint_moe.tools.golden``), benchmarks and demos instead of toy sizes.

Add a shape: one ``MoEShape`` line in :data:`MODEL_SHAPES` (routed experts E, hidden H, expert intermediate I,
top_k, the shared expert's intermediate size or None, and ``pad_to`` for a layer stored with its intermediate
padded). ``parse_shape("E,H,I,k[,SI]")`` builds an unnamed one for the command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MoEShape", "MODEL_SHAPES", "parse_shape", "sizes_name"]


@dataclass(frozen=True)
class MoEShape:
    """One MoE layer: ``num_experts`` routed experts (E), ``hidden`` size H, expert ``intermediate`` size I
    (logical), ``top_k``, ``shared_intermediate``: the shared expert's intermediate size (None: the model has
    no shared expert), ``pad_to``: the stored intermediate is roundup(I, pad_to) per half of w13
    (``flint_moe.layouts.padding``; None: stored as is).

    Raises ValueError for a size that is not a positive int or top_k outside [1, E]. The kernels' own
    constraints (NVFP4 H a multiple of 16 and of 32 for the stored codes, BF16 H and stored I multiples of 64,
    stored I a multiple of 64) are checked by the ops and layouts when a shape is used.
    """

    name: str
    num_experts: int
    hidden: int
    intermediate: int
    top_k: int
    shared_intermediate: int | None = None
    pad_to: int | None = None

    def __post_init__(self) -> None:
        for field in ("num_experts", "hidden", "intermediate", "top_k"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"MoEShape {self.name!r}: {field} must be a positive int, got {v!r}")
        for field in ("shared_intermediate", "pad_to"):
            v = getattr(self, field)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"MoEShape {self.name!r}: {field} must be None or a positive int, got {v!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoEShape {self.name!r}: top_k = {self.top_k} exceeds num_experts = {self.num_experts}")

    @property
    def stored_intermediate(self) -> int:
        """Stored (padded) intermediate size: roundup(I, pad_to), or I."""
        return self.intermediate if self.pad_to is None else -(-self.intermediate // self.pad_to) * self.pad_to

    def scaled_down(self) -> MoEShape:
        """The interpreter-sized copy the cpu conformance profile runs, named ``cpu-<name>``.

        Keeps what the kernels' code paths depend on and shrinks the rest:
        - ``top_k`` unchanged; E = the smallest non-power-of-two >= top_k + 2 (experts that no token picks),
          at most the real E;
        - H = 128 + (H mod 128), or 384 when H is a multiple of 128 (a multiple of 64 whenever H is, so both
          the NVFP4 and the BF16 BlockMajorK layouts hold it when they hold the real one; never a power of two);
        - I: with ``pad_to`` and I not a multiple of it, pad_to + (I mod pad_to) (padded the same way); else
          128 + (I mod 128) (a multiple of 64 whenever I is); ``pad_to`` kept;
        - shared expert: the scaled I when the model has one.
        """
        e = self.top_k + 2
        while e & (e - 1) == 0:
            e += 1
        e = min(e, self.num_experts)
        h = 128 + self.hidden % 128 if self.hidden % 128 else 384
        if self.pad_to is not None and self.intermediate % self.pad_to:
            i = self.pad_to + self.intermediate % self.pad_to
        else:
            i = 128 + self.intermediate % 128
        si = None if self.shared_intermediate is None else i
        return MoEShape(f"cpu-{self.name}", e, h, i, self.top_k, si, self.pad_to)


def sizes_name(e: int, h: int, i: int, k: int, pad_to: int | None = None, prefix: str = "") -> str:
    """Shape name that spells its sizes, ``[<prefix>-]E<e>-H<h>-I<i>[-P<pad_to>]-k<k>`` (e.g.
    ``cpu-E6-H96-I48-P64-k3``); ``flint_moe.conformance.inputs.cases`` rebuilds a shape from such a name."""
    core = f"E{e}-H{h}-I{i}" + (f"-P{pad_to}" if pad_to else "") + f"-k{k}"
    return f"{prefix}-{core}" if prefix else core


_SIZES = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*(\d+)\s*)?$")


def parse_shape(text: str) -> MoEShape:
    """A shape from the command line: a :data:`MODEL_SHAPES` name (or ``cpu-<name>``, its scaled-down copy), or
    ``"E,H,I,k[,SI]"`` (decimal sizes; SI the shared expert's intermediate size), then named by
    :func:`sizes_name`. Raises ValueError naming the text and what is expected."""
    if text in MODEL_SHAPES:
        return MODEL_SHAPES[text]
    if text.startswith("cpu-") and text[4:] in MODEL_SHAPES:
        return MODEL_SHAPES[text[4:]].scaled_down()
    m = _SIZES.match(text)
    if m is None:
        raise ValueError(
            f"shape {text!r}: expected a model name ({', '.join(MODEL_SHAPES)}; cpu-<name> for its scaled-down "
            "copy) or E,H,I,k[,SI] (e.g. 6,96,64,3)"
        )
    e, h, i, k = (int(m[j]) for j in range(1, 5))
    si = int(m[5]) if m[5] else None
    return MoEShape(sizes_name(e, h, i, k), e, h, i, k, si)


MODEL_SHAPES: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("deepseek-v3", 256, 7168, 2048, 8, 2048),
        MoEShape("kimi-k2", 384, 7168, 2048, 8, 2048),
        MoEShape("glm-4.5", 160, 5120, 1536, 8, 1536),
        MoEShape("glm-4.5-air", 128, 4096, 1408, 8, 1408),
        MoEShape("qwen3-30b-a3b", 128, 2048, 768, 8),
        MoEShape("qwen3-235b-a22b", 128, 4096, 1536, 8),
        MoEShape("qwen3-next-80b", 512, 2048, 512, 10, 512),
        MoEShape("gpt-oss-120b", 128, 2880, 2880, 4),
        MoEShape("llama-4-maverick", 128, 5120, 8192, 1, 8192),
        MoEShape("mixtral-8x7b", 8, 4096, 14336, 2),
        MoEShape("minimax-m2", 256, 3072, 1536, 8),
        MoEShape("ling-mini-2.0", 256, 2048, 512, 8, 512),
        # gpt-oss-120b stored with its intermediate padded to 128 (as FlashInfer's TRT-LLM BF16 launcher needs)
        MoEShape("gpt-oss-120b-p128", 128, 2880, 2880, 4, pad_to=128),
    )
}
