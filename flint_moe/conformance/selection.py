"""Case selection by shape and route for the CLI (``python -m flint_moe.conformance --shape ... --route ...``).

- ``add_selection_args(parser)``: the ``--shape`` and ``--route`` options.
- ``shape_route_selection(shape, route, profile, filters)``: the cases they select.
"""

from __future__ import annotations

import argparse

__all__ = [
    "CPU_SHAPE_MAX_BYTES",
    "add_selection_args",
    "cpu_refusal",
    "cpu_size_problem",
    "parse_tokens",
    "shape_problem",
    "shape_route_selection",
    "with_tokens",
]

#: Largest layer ``--shape`` runs without CUDA unless ``--force``: bytes of its weights in bf16 (3 E H I x 2). A
#: real layer under the Triton interpreter takes minutes to hours per case, and its BF16 inputs alone can exceed
#: a CPU machine's memory (DeepSeek-V3: 22.5 GB); every scaled-down ``cpu-<name>`` copy is far below it.
CPU_SHAPE_MAX_BYTES = 2**30


def add_selection_args(ap: argparse.ArgumentParser) -> None:
    """Add ``--shape NAME|E,H,I,k[,SI]``, ``--route SPEC`` and ``--tokens M[,M...]`` (all default None) to
    ``ap``."""
    ap.add_argument(
        "--shape",
        default=None,
        metavar="NAME|E,H,I,k[,SI]",
        help="run any layer shape instead of the matrix: a flint_moe/shapes.py name (deepseek-v3, ...; cpu-<name> "
        "for its scaled-down copy) or sizes E,H,I,k[,SI] (SI: shared expert size, for the record); gaussian "
        "data on nvfp4_decode (M 1, L), nvfp4_grouped (L + 1, 64), nvfp4_dispatch (L, L + 1), L the shape's "
        "decode limit ops.decode_max_tokens(E, k), and bf16_decode (1, 8) where H and I are multiples of 64 "
        "(shape_cases; --filter narrows it). Without CUDA a layer above "
        "1 GiB of bf16 weights (every real model shape) is refused unless --force: under the Triton interpreter "
        "it takes minutes to hours per case; use its scaled-down copy there (cpu-deepseek-v3)",
    )
    ap.add_argument(
        "--route",
        default=None,
        metavar="SPEC",
        help="force the routing of every selected case by its router weights and tokens (the golden model routes "
        "them as usual; inputs/routing.py): experts=5,7 (these experts lead every token), last[=N] (the last N "
        "experts, N = top_k by default), count=128@5 (exactly the first 128 tokens go to expert 5); the case "
        "ids get /r-<route> (experts-5-7, last-3, count-128-5) and rebuild with it; cases whose data profile "
        "sets the routing itself (tied_logits, skewed_routing, tiny_sigmoids, subnormal_tokens) are left out",
    )
    ap.add_argument(
        "--tokens",
        default=None,
        metavar="M[,M...]",
        help="run every selected case at these token counts instead of its own (ids get M<m>): nvfp4_decode only "
        "up to 32 tokens, the BF16 decode and decode block paths (bf16_decode, bf16_module, ll_block, ll_module) "
        "up to 8, the others up to 65536; e.g. "
        "--shape cpu-E6-H96-I64-k3 --tokens 128 --route count=128@5 --filter nvfp4_grouped",
    )


def shape_problem(shape) -> str | None:
    """Why no path of ``--shape`` can run ``shape`` (a ``cases.ShapeSpec``), or None when the NVFP4 paths can.

    Every ``--shape`` selection runs the NVFP4 paths (:func:`shape_cases`; BF16 decode only where H and the
    stored I are multiples of 64, which the NVFP4 limits below imply), so a shape they cannot hold selects no
    runnable case. The limits are the ops' and layouts' own: H a multiple of 32 (the decode kernels' 16-byte
    code vectors), I a multiple of 16 (NVFP4 block) and the stored I a multiple of 64 (the gate/up interleave:
    I itself, or a ``pad_to`` that is a multiple of 64), top_k <= ``kernels.router.MAX_TOP_K`` (16), E <=
    ``MAX_EXPERTS`` (32768)."""
    from flint_moe.kernels.router import MAX_EXPERTS, MAX_TOP_K

    bad = []
    if shape.H % 32:
        bad.append(f"H = {shape.H} must be a multiple of 32")
    if shape.I % 16:
        bad.append(f"I = {shape.I} must be a multiple of 16")
    elif shape.pad_to is None and shape.I % 64:
        bad.append(f"I = {shape.I} must be a multiple of 64, or padded (a sizes name with -P64, e.g. "
                   f"E{shape.E}-H{shape.H}-I{shape.I}-P64-k{shape.k})")  # fmt: skip
    if shape.pad_to is not None and shape.pad_to % 64:
        bad.append(f"pad_to = {shape.pad_to} must be a multiple of 64")
    if shape.k > MAX_TOP_K:
        bad.append(f"top_k = {shape.k} must be at most {MAX_TOP_K}")
    if shape.E > MAX_EXPERTS:
        bad.append(f"E = {shape.E} must be at most {MAX_EXPERTS}")
    if not bad:
        return None
    return "the NVFP4 layouts and kernels cannot hold it: " + "; ".join(bad)


def cpu_size_problem(shape: str, cases: list) -> str | None:
    """Why ``--shape shape`` should not run without CUDA (None when every case's layer is within
    :data:`CPU_SHAPE_MAX_BYTES`): the largest layer's sizes and bf16 weight bytes, and what to run instead."""
    if not cases:
        return None
    big = max(cases, key=lambda c: c.E * c.H * c.I)
    size = 6 * big.E * big.H * big.I
    if size <= CPU_SHAPE_MAX_BYTES:
        return None
    instead = f"Run its scaled-down copy, --shape cpu-{shape}," if _is_model_name(shape) else "Run a smaller shape,"
    return (
        f"--shape {shape}: a real-size layer (E={big.E}, H={big.H}, I={big.I}: {size / 1e9:.1f} GB of bf16 weights) "
        "would run under the Triton interpreter without CUDA: minutes to hours per case, and it may exhaust this "
        f"machine's memory (limit {CPU_SHAPE_MAX_BYTES / 2**30:g} GiB without --force). {instead} or pass --force "
        "to run it anyway."
    )


def cpu_refusal(profile: str, shape: str | None, cases: list) -> str | None:
    """Why the selected run should not start without CUDA (the CLI refuses it unless ``--force``), or None: the
    gpu profile (real layer shapes), or a ``--shape`` above :data:`CPU_SHAPE_MAX_BYTES` (:func:`cpu_size_problem`)."""
    from flint_moe.conformance.inputs.cases import GPU_PROFILES

    if profile in GPU_PROFILES:
        return (
            f"the {profile} profile runs real layer shapes; without CUDA they would run under the Triton "
            "interpreter (minutes per case, and bit-exactness is not claimed there). Use --profile cpu, "
            "or --force to run them anyway."
        )
    return None if shape is None else cpu_size_problem(shape, cases)


def _is_model_name(shape: str) -> bool:
    from flint_moe.shapes import MODEL_SHAPES

    return shape in MODEL_SHAPES


def parse_tokens(text: str) -> list[int]:
    """``"M[,M...]"`` -> the token counts, each in [1, ``ops.GROUPED_MAX_TOKENS``], duplicates once. Raises
    ValueError naming the text."""
    from flint_moe.ops import GROUPED_MAX_TOKENS

    try:
        ms = [int(t) for t in text.split(",")]
    except ValueError:
        ms = []
    if not ms or any(not 1 <= m <= GROUPED_MAX_TOKENS for m in ms):
        raise ValueError(f"--tokens {text}: expected token counts M[,M...], each in [1, {GROUPED_MAX_TOKENS}]")
    return list(dict.fromkeys(ms))


def with_tokens(cases: list, tokens: list[int]) -> list:
    """Each case of ``cases`` at each of ``tokens`` (its M replaced; a path only up to the largest M it serves,
    ``run.paths.PATHS[path].max_tokens``: the decode paths' ops' limits, ``ops.DECODE_MAX_TOKENS`` (32) for
    ``nvfp4_decode``, ``DECODE_BF16_MAX_TOKENS`` / ``LL_MOE_MAX_TOKENS`` (8) for the BF16 decode and the decode
    block's paths), in order, duplicates once."""
    from dataclasses import replace

    from flint_moe.conformance.run.paths import PATHS

    out, seen = [], set()
    for c in cases:
        for m in tokens:
            if m > PATHS[c.path].max_tokens:
                continue
            rc = replace(c, M=m)
            if rc.id not in seen:
                seen.add(rc.id)
                out.append(rc)
    return out


def shape_route_selection(
    shape: str | None, route: str | None, profile: str, filters: list[str], tokens: str | None = None
) -> list:
    """The cases of ``--shape`` / ``--route``: ``shape_cases`` of the shape ``shape`` names (any
    ``shape_spec`` text) or the ``profile`` matrix, filtered like the matrix, each with the route
    ``route`` (``routing.parse_route`` text) when given, at the token counts ``tokens`` (:func:`parse_tokens`
    text; filters then see the new ids) when given; cases whose data profile sets the routing itself are
    left out, and duplicates once. Raises ValueError for a bad shape or route, a shape no path can hold
    (:func:`shape_problem`), or a route no selected case can hold (naming the first such case and why)."""
    from dataclasses import replace

    from flint_moe.conformance.inputs.cases import matrix
    from flint_moe.conformance.inputs.routing import ROUTE_EXCLUSIVE_PROFILES, parse_route

    if shape is not None:
        spec = shape_spec(shape)
        problem = shape_problem(spec)
        if problem is not None:
            raise ValueError(f"--shape {shape}: {problem}")
        base = shape_cases(spec)
    else:
        base = matrix(profile)
    if tokens is not None:
        base = with_tokens(base, parse_tokens(tokens))
    cases = [c for c in base if all(f in c.id for f in filters)]
    if route is None:
        return cases
    r = parse_route(route)
    out, seen, errors = [], set(), []
    for c in cases:
        if c.profile in ROUTE_EXCLUSIVE_PROFILES:
            continue
        try:
            rc = replace(c, route=r)
        except ValueError as e:
            errors.append(f"{c.id}: {e}")
            continue
        if rc.id not in seen:
            seen.add(rc.id)
            out.append(rc)
    if not out and errors:
        raise ValueError(f"--route {route}: no selected case can hold it ({errors[0]})")
    return out


def shape_spec(text: str):
    """The ``cases.ShapeSpec`` the CLI's ``--shape`` names: a ``cases.SHAPES`` name, a sizes name
    (``E6-H96-I64-k3``), or what ``flint_moe.shapes.parse_shape`` reads (``E,H,I,k[,SI]``; the shared expert's
    size SI is accepted and does not enter the cases: the shared output is a layer input). Raises ValueError
    naming the text."""
    from flint_moe.conformance.inputs.cases import ShapeSpec, _shape
    from flint_moe.shapes import parse_shape

    try:
        return _shape(text)
    except ValueError:
        return ShapeSpec.of(parse_shape(text))


def shape_case_m(shape) -> dict[str, tuple[int, int]]:
    """Token counts ``shape_cases`` runs per path on ``shape`` (a ``cases.ShapeSpec``), on both sides of its
    decode limit L = ``ops.decode_max_tokens(E, k)`` (``cases.threshold_m``: where ``ops.flint_moe`` switches):
    ``nvfp4_decode`` (1, L), ``nvfp4_grouped`` (L + 1, 64), ``nvfp4_dispatch`` (L, L + 1); ``bf16_decode``
    (1, 8), its op's limit ``DECODE_BF16_MAX_TOKENS``."""
    from flint_moe.conformance.inputs.cases import threshold_m
    from flint_moe.ops import DECODE_BF16_MAX_TOKENS

    L, first_grouped = threshold_m(shape)
    return {"nvfp4_decode": (1, L), "bf16_decode": (1, DECODE_BF16_MAX_TOKENS), "nvfp4_grouped": (first_grouped, 64),
            "nvfp4_dispatch": (L, first_grouped)}  # fmt: skip


def shape_cases(shape) -> list:
    """The cases ``--shape`` runs on any ``cases.ShapeSpec``: gaussian data at :func:`shape_case_m` on
    ``nvfp4_decode``, ``nvfp4_grouped``, ``nvfp4_dispatch`` and, where the BF16 BlockMajorK layout holds the
    shape (H and the stored I multiples of 64), ``bf16_decode`` (duplicate ids once: L = 1 gives decode M 1
    once). Under the Triton interpreter a real-size shape takes minutes per case."""
    from flint_moe.conformance.inputs.cases import Case

    cases = []
    for path, ms in shape_case_m(shape).items():
        if path.startswith("bf16_"):
            ip = shape.I if shape.pad_to is None else -(-shape.I // shape.pad_to) * shape.pad_to
            if shape.H % 64 or ip % 64:
                continue
        cases += [Case.make(path, shape, m, "gaussian") for m in dict.fromkeys(ms)]
    return cases
