"""The conformance case matrix: path x shape x token count x data profile x seed, each case reproducible from
its id (docs/ARCHITECTURE.md section 2).

- ``Case``: frozen dataclass; ``Case.id`` is ``<path>/<shape>/M<m>/<profile>/s<seed>[/r-<route>][/c-<config>]``
  (e.g. ``nvfp4_decode/deepseek-v3/M1/gaussian/s0``) and ``Case.from_id(id)`` rebuilds it (sizes from ``SHAPES``,
  or from a shape name that spells them, ``flint_moe.shapes.sizes_name``); ``route``: forced routing
  (``flint_moe.conformance.inputs.routing``).
- ``SHAPES``: the real layers of ``flint_moe.shapes.MODEL_SHAPES`` (``REAL_SHAPES``), their scaled-down copies
  ``cpu-<model>`` (``DERIVED_CPU_SHAPES``, ``MoEShape.scaled_down``) and hand-picked CPU shapes keeping the
  production divisibility (``CPU_SHAPES``: E not a power of two; H a multiple of 32 (NVFP4) or 64 (BF16
  BlockMajorK), not a power of two; I a multiple of 64 only, or padded).
- ``matrix("cpu" | "gpu" | "gpu-full")``: the case list of a profile (the CLI's ``--shape`` cases of any shape:
  ``flint_moe.conformance.selection.shape_cases``).
- ``make_inputs(case, device) -> profiles.CaseInputs``: deterministic inputs (data profiles in
  ``flint_moe.conformance.inputs.profiles``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from flint_moe.conformance.inputs.block import BLOCK_PATHS, BLOCK_PROFILES, block_shape, gpu_block_specs
from flint_moe.conformance.inputs.configs import PATH_CONFIGS
from flint_moe.conformance.inputs.routing import ROUTE_EXCLUSIVE_PROFILES, check_route
from flint_moe.shapes import MODEL_SHAPES, MoEShape, sizes_name

if TYPE_CHECKING:
    from flint_moe.conformance.inputs.profiles import CaseInputs

__all__ = [
    "PATH_NAMES",
    "PATH_PROFILES",
    "ORACLE_PROFILES",
    "oracle_available",
    "SHAPES",
    "REAL_SHAPES",
    "DERIVED_CPU_SHAPES",
    "Case",
    "ShapeSpec",
    "make_inputs",
    "matrix",
]

#: Kernel paths of the matrix (``flint_moe.conformance.run.paths.PATHS`` keys). A path's name starts with the
#: stored weight format it reads (``nvfp4_`` -> ``FlintMoEWeights``, ``bf16_`` -> the TRT-LLM BF16 layout).
#: ``nvfp4_decode``: the decode kernels (through ``flint_moe.ops.flint_moe`` where it runs them) up to
#: ``ops.DECODE_MAX_TOKENS``. ``nvfp4_grouped``: ``flint_moe.ops.flint_moe_grouped`` on both sides of the threshold.
#: ``bf16_module``: ``modules.FlintBf16DecodeMoE`` over the case's TRT-LLM-layout BF16 layer (read in
#: place), forward with the shared output.
#: ``nvfp4_dispatch``: ``flint_moe.ops.flint_moe`` itself at any M (the shipped dispatch: the decode kernels up to
#: ``ops.decode_max_tokens(E, k)``, the grouped path above), judged with the summation models of the path it
#: dispatches to (``run.paths.dispatch_path``, the same function).
#: ``ll_block``: the low-latency decode block ``flint_moe.ops.flint_moe_ll`` (rule step 11, then steps 1-10 with
#: an NVFP4 shared expert; inputs ``inputs.block``); ``ll_module``: the same through
#: ``modules.FlintLLDecodeBlock``. Their kernels need a GPU (CuTe DSL): gpu profile only.
PATH_NAMES = ("nvfp4_decode", "bf16_decode", "nvfp4_grouped", "nvfp4_module", "bf16_module", "nvfp4_dispatch",
              *BLOCK_PATHS)  # fmt: skip
#: ``nvfp4_pertoken_swiglu`` / ``nvfp4_pertoken_relu2``: ``flint_moe.ops.routed_nvfp4_moe`` (per-token NVFP4 x NVFP4
#: experts, routing given; inputs, shapes and cases in ``inputs/pertoken.py``).
PATH_NAMES += ("nvfp4_pertoken_swiglu", "nvfp4_pertoken_relu2")

#: Data profiles each path supports (generators in ``profiles.py``).
#: BF16 has no block or global scales: there ``global_scales`` spreads per-expert weight magnitudes over
#: 2^-20..2^4 and ``zero_blocks`` zeroes 64-element (BlockMajorK) blocks.
PATH_PROFILES: dict[str, tuple[str, ...]] = {
    "nvfp4_decode": (
        "gaussian", "heavy_tailed", "tied_logits", "skewed_routing", "global_scales", "e4m3_scales",
        "zero_blocks", "poisoned_padding", "asymmetric", "tiny_sigmoids", "modelopt", "subnormal_tokens",
    ),
    "bf16_decode": (
        "gaussian", "heavy_tailed", "tied_logits", "skewed_routing", "global_scales", "zero_blocks",
        "asymmetric", "tiny_sigmoids", "subnormal_tokens",
    ),
}  # fmt: skip
#: Profiles whose inputs come from the field's own tools, present only
#: where the tool is importable (the ``oracle`` extra; not on the H200, so only in the ``cpu`` profile):
#: ``modelopt_quantizer`` = bf16 experts quantized by nvidia-modelopt's ``NVFP4QTensor`` (gate and up of an
#: expert under one global scale, as fused exports have), then our ``FlintMoEWeights.from_modelopt``;
#: ``flashinfer_layout`` = the stored weights the kernels read made by FlashInfer's own layout functions
#: (``interleave_cute_dsl_moe_weights`` + ``_swizzle_cutile_fp4_scales`` for NVFP4,
#: ``prepare_trtllm_bf16_weights`` for BF16) instead of ours. Value: the module the profile imports.
ORACLE_PROFILES: dict[str, str] = {"modelopt_quantizer": "modelopt", "flashinfer_layout": "flashinfer"}
PATH_PROFILES["nvfp4_decode"] += tuple(ORACLE_PROFILES)
PATH_PROFILES["bf16_decode"] += ("flashinfer_layout",)
PATH_PROFILES["nvfp4_grouped"] = PATH_PROFILES["nvfp4_decode"]  # same weights (FlintMoEWeights), same rule


def oracle_available(profile: str) -> bool:
    """True unless ``profile`` is one of :data:`ORACLE_PROFILES` whose tool is not installed."""
    import importlib.util

    mod = ORACLE_PROFILES.get(profile)
    return mod is None or importlib.util.find_spec(mod) is not None
#: ``nvfp4_module``: ``modules.FlintNvfp4Experts`` loaded from the case's checkpoint-layout tensors
#: (its loader repacks them), forward with the shared output on both sides of the decode / grouped threshold.
PATH_PROFILES["nvfp4_module"] = ("gaussian", "skewed_routing", "modelopt")
PATH_PROFILES["bf16_module"] = ("gaussian", "skewed_routing")
PATH_PROFILES["nvfp4_dispatch"] = ("gaussian",)  # the data profiles run on the paths it dispatches to
PATH_PROFILES["ll_block"] = BLOCK_PROFILES
PATH_PROFILES["ll_module"] = ("gaussian", "skewed_routing")
PATH_PROFILES["nvfp4_pertoken_swiglu"] = PATH_PROFILES["nvfp4_pertoken_relu2"] = (
    "gaussian", "outlier_rows", "zero_rows", "e4m3_clamp", "e2m1_ties", "dispatcher")  # fmt: skip

@dataclass(frozen=True)
class ShapeSpec:
    """One layer shape: E experts, hidden H, logical intermediate I, top_k; ``pad_to``: the stored
    intermediate size is roundup(I, pad_to) (per half of w13; ``flint_moe.layouts.padding``), None = as is."""

    name: str
    E: int
    H: int
    I: int  # noqa: E741
    k: int
    pad_to: int | None = None

    @classmethod
    def of(cls, shape: MoEShape) -> ShapeSpec:
        """The spec of a ``flint_moe.shapes.MoEShape`` (same name, sizes and padding; the shared expert's size
        does not enter a case: the shared output is an input of the layer)."""
        return cls(shape.name, shape.num_experts, shape.hidden, shape.intermediate, shape.top_k, shape.pad_to)


def _cpu(E: int, H: int, I: int, k: int, pad_to: int | None = None) -> ShapeSpec:  # noqa: E741
    return ShapeSpec(sizes_name(E, H, I, k, pad_to, prefix="cpu"), E, H, I, k, pad_to)


#: Scaled-down CPU shapes (interpreter-sized): NVFP4 needs H % 32 == 0, BF16 H % 64 == 0, both I % 64 == 0
#: after padding.
CPU_SHAPES = {
    "nvfp4_decode": (_cpu(6, 96, 64, 3), _cpu(10, 160, 192, 3), _cpu(6, 96, 48, 3, pad_to=64)),
    "bf16_decode": (_cpu(6, 192, 192, 3), _cpu(10, 320, 64, 3), _cpu(6, 192, 96, 3, pad_to=128)),
}
CPU_SHAPES["nvfp4_grouped"] = CPU_SHAPES["nvfp4_decode"]

#: Real layers: every ``flint_moe.shapes.MODEL_SHAPES`` entry (shared/notes/models-and-formats.md; incl. the
#: padded gpt-oss variant, I = 2880 padded to 128, as FlashInfer's TRT-LLM BF16 launcher needs).
REAL_SHAPES = tuple(ShapeSpec.of(s) for s in MODEL_SHAPES.values())

#: The scaled-down copy of every real layer (``cpu-<model>``, ``MoEShape.scaled_down``: same top_k, padding and
#: divisibility at interpreter size). The cpu profile runs the first of each distinct size (``_derived_cpu_cases``).
DERIVED_CPU_SHAPES = tuple(ShapeSpec.of(s.scaled_down()) for s in MODEL_SHAPES.values())

SHAPES: dict[str, ShapeSpec] = {
    s.name: s
    for s in (*REAL_SHAPES, *CPU_SHAPES["nvfp4_decode"], *CPU_SHAPES["bf16_decode"], *DERIVED_CPU_SHAPES)
}

#: A shape name that spells its sizes (``flint_moe.shapes.sizes_name``): rebuilt without a ``SHAPES`` entry.
_SIZES_NAME_RE = re.compile(r"^(?:[A-Za-z0-9_.]+-)*E(\d+)-H(\d+)-I(\d+)(?:-P(\d+))?-k(\d+)$")

_ID_RE = re.compile(
    r"^(?P<path>[a-z0-9_]+)/(?P<shape>[A-Za-z0-9_.\-]+)/M(?P<M>\d+)/(?P<profile>[a-z0-9_]+)/s(?P<seed>\d+)"
    r"(?:/r-(?P<route>[a-z0-9\-]+))?(?:/c-(?P<config>[a-z0-9\-]+))?$"
)


@dataclass(frozen=True)
class Case:
    """One conformance case. ``shape`` names a ``SHAPES`` entry; E, H, I, k, pad_to are copied from it.

    Fields: path (``PATH_NAMES``), shape, E, H, I (logical intermediate), k, M (tokens), profile (data
    profile, ``PATH_PROFILES[path]``), seed (int >= 0), pad_to (stored intermediate alignment or None),
    config (``PATH_CONFIGS[path]``), route (None, or a canonical route of
    ``flint_moe.conformance.inputs.routing``: forced routing on top of the profile's tokens; ValueError for a
    route the sizes cannot hold or a profile that sets the routing itself).
    """

    path: str
    shape: str
    E: int
    H: int
    I: int  # noqa: E741
    k: int
    M: int
    profile: str
    seed: int = 0
    pad_to: int | None = None
    config: str = "default"
    route: str | None = None

    def __post_init__(self) -> None:
        if self.path in PATH_CONFIGS and self.config not in PATH_CONFIGS[self.path]:
            raise ValueError(
                f"Case: config {self.config!r} not defined for path {self.path!r} "
                f"(known: {', '.join(PATH_CONFIGS[self.path])})"
            )
        if self.path not in PATH_NAMES:
            raise ValueError(f"Case: unknown path {self.path!r} (known: {', '.join(PATH_NAMES)})")
        if self.profile not in PATH_PROFILES[self.path]:
            raise ValueError(
                f"Case: profile {self.profile!r} not defined for path {self.path!r} "
                f"(known: {', '.join(PATH_PROFILES[self.path])})"
            )
        if self.M < 1 or self.seed < 0 or not 1 <= self.k <= self.E:
            raise ValueError(f"Case: need M >= 1, seed >= 0, 1 <= k <= E; got M={self.M} seed={self.seed} "
                             f"k={self.k} E={self.E}")  # fmt: skip
        if self.route is not None:
            if self.profile in ROUTE_EXCLUSIVE_PROFILES:
                raise ValueError(f"Case: profile {self.profile!r} sets the routing itself; it takes no route "
                                 f"(got route {self.route!r})")  # fmt: skip
            check_route(self.route, self.E, self.k, self.M)
        if self.path in BLOCK_PATHS:
            block_shape(self.shape)  # ValueError: no shared expert, or a sigmoid-gated one (Qwen3-Next)

    @classmethod
    def make(
        cls, path: str, shape: str | ShapeSpec, M: int, profile: str, seed: int = 0, config: str = "default",
        route: str | None = None,
    ) -> Case:
        """Case of a registered shape (sizes from ``SHAPES``, or spelled by its name: ``_shape``)."""
        s = shape if isinstance(shape, ShapeSpec) else _shape(shape)
        return cls(path, s.name, s.E, s.H, s.I, s.k, M, profile, seed, s.pad_to, config, route)

    @property
    def id(self) -> str:
        """``<path>/<shape>/M<m>/<profile>/s<seed>``, plus ``/r-<route>`` for forced routing and
        ``/c-<config>`` for a non-default launch configuration (``PATH_CONFIGS``)."""
        base = f"{self.path}/{self.shape}/M{self.M}/{self.profile}/s{self.seed}"
        if self.route is not None:
            base += f"/r-{self.route}"
        return base if self.config == "default" else f"{base}/c-{self.config}"

    @property
    def Ip(self) -> int:  # noqa: N802
        """Stored (padded) intermediate size."""
        return self.I if self.pad_to is None else -(-self.I // self.pad_to) * self.pad_to

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        """Rebuild a case from its id. ValueError on a malformed id or an unknown path/shape/profile."""
        m = _ID_RE.match(case_id)
        if m is None:
            raise ValueError(f"case id {case_id!r}: expected <path>/<shape>/M<m>/<profile>/s<seed>")
        return cls.make(m["path"], m["shape"], int(m["M"]), m["profile"], int(m["seed"]), m["config"] or "default",
                        m["route"])  # fmt: skip


def _shape(name: str) -> ShapeSpec:
    """``SHAPES[name]``, else the shape a sizes name spells (``E6-H96-I64-k3``, ``cpu-E6-H96-I48-P64-k3``).
    ValueError for any other name."""
    if name in SHAPES:
        return SHAPES[name]
    m = _SIZES_NAME_RE.match(name)
    if m is None:
        raise ValueError(f"unknown shape {name!r} (known: {', '.join(SHAPES)}; or a name spelling its sizes, "
                         "E<E>-H<H>-I<I>[-P<pad>]-k<k>)")  # fmt: skip
    e, h, i, pad, k = (None if g is None else int(g) for g in m.groups())
    return ShapeSpec(name, e, h, i, k, pad)


#: Run profiles: ``cpu`` (interpreter-sized), ``gpu`` (real layers; the pull-request gate, under 5 minutes on
#: one H200) and ``gpu-full`` (the gpu profile plus :data:`GPU_FULL_ONLY`).
PROFILES = ("cpu", "gpu", "gpu-full")
#: Profiles that run real layer shapes on a GPU (the judges' invariances and the mutation self-test by default).
GPU_PROFILES = ("gpu", "gpu-full")


def matrix(profile: str) -> list[Case]:
    """The case list of a run profile (:data:`PROFILES`): ``"cpu"`` (interpreter-sized, ~60 cases), ``"gpu"``
    (real layers, >= 300 cases incl. DeepSeek-V3) or ``"gpu-full"`` (``"gpu"`` and :data:`GPU_FULL_ONLY`).
    Cases sharing weights are adjacent (``make_inputs`` caches them). ValueError for another profile."""
    if profile == "cpu":
        return _cpu_matrix()
    if profile in GPU_PROFILES:
        full = _gpu_matrix()
        if profile == "gpu-full":
            return full
        return [c for c in full if c.id not in GPU_FULL_ONLY]
    raise ValueError(f"matrix: profile must be one of {', '.join(PROFILES)}, got {profile!r}")


def _cpu_matrix() -> list[Case]:
    a, b, c = CPU_SHAPES["nvfp4_decode"]
    d, e, f = CPU_SHAPES["bf16_decode"]
    nv = [
        (a, 1, "gaussian"), (a, 3, "heavy_tailed"), (a, 3, "tied_logits"), (a, 4, "skewed_routing"),
        (a, 2, "tiny_sigmoids"), (a, 2, "global_scales"), (a, 2, "e4m3_scales"), (a, 2, "zero_blocks"),
        (a, 2, "poisoned_padding"), (a, 2, "asymmetric"), (a, 2, "modelopt"), (a, 3, "subnormal_tokens"),
        (a, 8, "gaussian"), (b, 2, "gaussian"), (c, 2, "gaussian"), (c, 1, "poisoned_padding"),
    ]  # fmt: skip
    bf = [
        (d, 1, "gaussian"),
        (d, 3, "tied_logits"),
        (d, 2, "asymmetric"),
        (e, 8, "gaussian"),
        (f, 2, "gaussian"),
    ]
    # grouped path above the shapes' decode limits (2; row blocks shared by several tokens, experts with no token,
    # a padded intermediate, skewed routing: expert 0 takes every token)
    gr = [(a, 12, "gaussian"), (c, 9, "skewed_routing")]
    # every non-default decode launch configuration once (the grouped ones on the gpu profile: interpreter time)
    cfg = [Case.make(path, sh, 2, "gaussian", 0, c) for path, sh in (("nvfp4_decode", a), ("bf16_decode", d))
           for c in PATH_CONFIGS[path] if c != "default"]  # fmt: skip
    # inputs made by nvidia-modelopt / FlashInfer where installed (ORACLE_PROFILES; unpadded shapes: FlashInfer's
    # layout functions do not pad)
    oracle = [("nvfp4_decode", a, 2, "modelopt_quantizer"), ("nvfp4_decode", a, 3, "flashinfer_layout"),
              ("nvfp4_grouped", a, 10, "flashinfer_layout"), ("bf16_decode", d, 2, "flashinfer_layout")]  # fmt: skip
    return (
        cfg
        + [Case.make(path, s, m, p) for path, s, m, p in oracle if oracle_available(p)]
        + [Case.make("nvfp4_decode", s, m, p) for s, m, p in nv]
        + [Case.make("bf16_decode", s, m, p) for s, m, p in bf]
        + [Case.make("nvfp4_grouped", s, m, p) for s, m, p in gr]
        + [Case.make("nvfp4_module", a, 2, "gaussian"), Case.make("nvfp4_module", c, 9, "modelopt")]
        + [Case.make("bf16_module", f, 3, "skewed_routing")]
        # the shipped dispatch on both sides of the shape's threshold: decode at 2 (decode_max_tokens), grouped at 3
        + [Case.make("nvfp4_dispatch", a, m, "gaussian") for m in threshold_m(a)]
        + _derived_cpu_cases()
        + _pertoken_cases("cpu")
    )


#: Shapes of the per-token paths (the routed layout pads H and I to 256: ``pad_to`` 256): interpreter-sized (160,
#: 176 -> 256, partial K steps), DeepSeek-V3 widths with a small E (the golden model's exact sums and the order
#: replay stay cheap), gpt-oss-like widths padded to 3072.
PERTOKEN_SHAPES = {
    "cpu": ShapeSpec("pt-cpu-E5-H160-I176-P256-k3", 5, 160, 176, 3, 256),
    "deepseek": ShapeSpec("pt-E16-H7168-I2048-P256-k8", 16, 7168, 2048, 8, 256),
    "gpt-oss": ShapeSpec("pt-E8-H2880-I2880-P256-k4", 8, 2880, 2880, 4, 256),
}


#: Paths whose kernels have not yet passed an H200 run: their gpu cases (:func:`pending_gpu_cases`) stay out of
#: the gpu profile, the pull-request gate, and run beside it (``scripts/h200_pending.py``) until a committed H200
#: run passes them. Empty today: every path's kernels have passed one (reports/h200). A new path whose kernels
#: cannot yet run on the GPU is named here until they do.
GPU_PENDING_PATHS: tuple[str, ...] = ()


def _gpu_block_and_pertoken_cases() -> list[Case]:
    """The decode block's gpu cases (``inputs.block.gpu_block_specs``) and the per-token paths' 13."""
    return [Case.make(*spec) for spec in gpu_block_specs()] + _pertoken_cases("gpu")


def pending_gpu_cases() -> list[Case]:
    """The gpu cases of :data:`GPU_PENDING_PATHS` (none while it is empty)."""
    return [c for c in _gpu_block_and_pertoken_cases() if c.path in GPU_PENDING_PATHS]


def _pertoken_cases(profile: str) -> list[Case]:
    """cpu: 4 small cases (both activations, stress profiles, the dispatcher buffer); gpu: 13 at real widths,
    every data profile on both activations (cases sharing weights adjacent)."""
    sw, r2 = "nvfp4_pertoken_swiglu", "nvfp4_pertoken_relu2"
    if profile == "cpu":
        s = PERTOKEN_SHAPES["cpu"]
        spec = [(sw, s, 5, "gaussian"), (r2, s, 6, "outlier_rows"), (sw, s, 7, "dispatcher"), (r2, s, 4, "e2m1_ties")]
    else:
        d, g = PERTOKEN_SHAPES["deepseek"], PERTOKEN_SHAPES["gpt-oss"]
        # small M except one sampled-replay case: a DeepSeek-width case replaying 64 rows costs ~30 s of the
        # golden model on the H200 (reports/h200), and the gpu profile must stay under 5 minutes
        spec = [(sw, d, 512, "gaussian"), (sw, d, 48, "dispatcher"), (sw, d, 16, "outlier_rows"),
                (sw, d, 16, "e2m1_ties"), (sw, d, 12, "zero_rows"), (sw, d, 12, "e4m3_clamp"), (r2, d, 64, "gaussian"),
                (r2, d, 16, "zero_rows"), (r2, d, 16, "e4m3_clamp"), (r2, d, 48, "dispatcher"),
                (r2, d, 12, "e2m1_ties"), (sw, g, 16, "gaussian"), (r2, g, 16, "outlier_rows")]  # fmt: skip
    return [Case.make(p, s, m, prof) for p, s, m, prof in spec]


def _derived_cpu_cases() -> list[Case]:
    """One ``nvfp4_decode`` case (M = 1, gaussian) per distinct size of ``DERIVED_CPU_SHAPES`` (the first model
    of each size in ``MODEL_SHAPES`` order names it) that no hand-picked CPU shape already has: a new real shape
    brings its scaled-down case unless an earlier one runs the same kernels on the same sizes."""
    seen = {(s.E, s.H, s.I, s.k, s.pad_to) for s in (*CPU_SHAPES["nvfp4_decode"], *CPU_SHAPES["bf16_decode"])}
    cases = []
    for s in DERIVED_CPU_SHAPES:
        key = (s.E, s.H, s.I, s.k, s.pad_to)
        if key not in seen:
            seen.add(key)
            cases.append(Case.make("nvfp4_decode", s, 1, "gaussian"))
    return cases


#: Cases of the gpu-full profile only: the slowest grouped cases (45-62 s each of the golden model's order replay
#: on the H200, reports/h200), out of the gpu profile for its 5-minute budget, which meets their paths, shapes,
#: token-count ranges and data profiles in other cases (DeepSeek-V3's data profiles at M <= 64: ``_GPU_PROFILE_M``).
GPU_FULL_ONLY = frozenset({
    "nvfp4_grouped/deepseek-v3/M64/gaussian/s0",
    "nvfp4_grouped/deepseek-v3/M256/gaussian/s0",
    "nvfp4_grouped/deepseek-v3/M130/global_scales/s0",
    "nvfp4_grouped/deepseek-v3/M300/asymmetric/s0",
    "nvfp4_grouped/gpt-oss-120b-p128/M256/gaussian/s0",
    "nvfp4_grouped/kimi-k2/M64/gaussian/s0",
})  # fmt: skip


#: Real shapes small enough to quantize with the ModelOpt recipe (``modelopt`` profile) on the device.
_MODELOPT_MAX_PARAMS = 3 * 2**28
_GPU_M_CYCLE = (1, 2, 3, 5, 8, 4, 7, 6)


#: Real shapes that get the whole treatment on the gpu profile (decode M 1..8, both sides of the decode / grouped
#: threshold, every data profile): the largest layer (DeepSeek-V3: E=256, H=7168), the smallest common one
#: (Qwen3-30B-A3B) and the padded non-power-of-two one (gpt-oss-120b, I=2880 padded to 128). The other real
#: shapes get decode M 1 and 8, grouped M 9 and 64 and a rotating subset of data profiles, so that every profile
#: still meets several shapes while the profile stays within its 5-minute budget on the H200 (timings: reports/h200/).
GPU_CORE_SHAPES = ("deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b-p128")
_GPU_OTHER_DECODE_M = (1, 8)
_GPU_OTHER_PROFILES = 3


def _profiles_for(path: str, s: ShapeSpec) -> list[str]:
    profs = [p for p in PATH_PROFILES[path] if p != "gaussian" and p not in ORACLE_PROFILES]
    if s.E * s.H * s.I * 3 > _MODELOPT_MAX_PARAMS and "modelopt" in profs:
        profs.remove("modelopt")
    return profs


def _rotating(profs: list[str], i: int, n: int) -> list[str]:
    return [profs[(i * n + j) % len(profs)] for j in range(min(n, len(profs)))]


def _gpu_matrix() -> list[Case]:
    from flint_moe.conformance.inputs.profiles import weight_key

    cases = []
    for path in ("nvfp4_decode", "bf16_decode"):
        others = 0
        for s in REAL_SHAPES:
            profs = _profiles_for(path, s)
            if s.name in GPU_CORE_SHAPES:
                group = [Case.make(path, s, m, "gaussian") for m in range(1, 9)]  # every M <= 8
            else:
                group = [Case.make(path, s, m, "gaussian") for m in _GPU_OTHER_DECODE_M]
                profs = _rotating(profs, others, _GPU_OTHER_PROFILES)
                others += 1
            group += [Case.make(path, s, _GPU_M_CYCLE[j % 8], p) for j, p in enumerate(profs)]
            group.sort(key=lambda c: weight_key(c))  # stable: cases sharing weights adjacent
            cases += group
    settled = [c for c in _gpu_block_and_pertoken_cases() if c.path not in GPU_PENDING_PATHS]
    everything = (cases + _gpu_grouped_cases() + _gpu_config_cases() + _gpu_module_cases() + _gpu_dispatch_cases()
                  + _gpu_route_cases() + settled)  # fmt: skip
    # Run order: the core shapes first (all paths and configurations), then the others; within a shape and
    # path, cases sharing weights stay adjacent (one-entry weight cache). A run stopped by a time limit then
    # still covers the core shapes on every path.
    rank = {name: i for i, name in enumerate(GPU_CORE_SHAPES)}
    paths = {p: i for i, p in enumerate(PATH_NAMES)}
    first: dict = {}  # weight key -> position of its first case
    for i, c in enumerate(everything):
        first.setdefault(weight_key(c), i)
    order = {id(c): i for i, c in enumerate(everything)}
    return sorted(
        everything,
        key=lambda c: (rank.get(c.shape, len(rank)), c.shape, paths[c.path], first[weight_key(c)], order[id(c)]),
    )


#: Non-default launch configurations (``PATH_CONFIGS``) run on these shapes: decode at M = 1 and 8, grouped at
#: M = 64 (gaussian data; the default configuration carries the data profiles).
_GPU_CONFIG_SHAPES = ("deepseek-v3", "qwen3-30b-a3b")


def threshold_m(s: ShapeSpec) -> tuple[int, int]:
    """(L, L + 1): the last token count ``ops.flint_moe`` runs on the decode kernels at shape ``s`` (L =
    ``ops.decode_max_tokens(E, k)``) and the first it sends to the grouped path."""
    from flint_moe.ops import decode_max_tokens

    return decode_max_tokens(s.E, s.k), decode_max_tokens(s.E, s.k) + 1


def _gpu_module_cases() -> list[Case]:
    """``nvfp4_module`` on the core shapes: M = 1, ``threshold_m``, 64, skewed routing, a ModelOpt-quantized layer
    where small enough; ``bf16_module`` (decode only) at M = 1, 8 and with skewed routing."""
    cases = []
    for name in GPU_CORE_SHAPES:
        s = _shape(name)
        cases += [Case.make("nvfp4_module", s, m, "gaussian") for m in (1, *threshold_m(s), 64)]
        cases.append(Case.make("nvfp4_module", s, 4, "skewed_routing"))
        if "modelopt" in _profiles_for("nvfp4_module", s):
            cases.append(Case.make("nvfp4_module", s, 2, "modelopt"))
        cases += [Case.make("bf16_module", s, m, "gaussian") for m in (1, 8)]
        cases.append(Case.make("bf16_module", s, 4, "skewed_routing"))
    return cases


#: ``nvfp4_dispatch`` (``ops.flint_moe``) at ``threshold_m`` (DeepSeek-V3, gpt-oss-120b 24 / 25, Qwen3 16 / 17) on
#: the core shapes and Qwen3-235B-A22B (measured: reports/gpu/nvfp4-grouped/crossover-engines/README.md); other M
#: are the decode / grouped paths'. Plus the decode kernels at a threshold, fed by the router GEMM, with skewed
#: routing.
_GPU_DISPATCH_SHAPES = (*GPU_CORE_SHAPES, "qwen3-235b-a22b")


def _gpu_dispatch_cases() -> list[Case]:
    ms = {n: threshold_m(_shape(n)) for n in _GPU_DISPATCH_SHAPES}
    return [Case.make("nvfp4_dispatch", n, m, "gaussian") for n in ms for m in ms[n]] + [
        Case.make("nvfp4_decode", "qwen3-30b-a3b", ms["qwen3-30b-a3b"][0], "skewed_routing")]  # fmt: skip


#: Forced routing (``routing.py``) on the largest layer: an expert boundary in the grouped path (exactly 128 of
#: 256 tokens to expert 5) and every decode token on the last experts.
_GPU_ROUTE_CASES = (("nvfp4_grouped", 256, "count-128-5"), ("nvfp4_decode", 8, "last"))


def _gpu_route_cases() -> list[Case]:
    return [Case.make(p, "deepseek-v3", m, "gaussian", route=r) for p, m, r in _GPU_ROUTE_CASES]


def _gpu_config_cases() -> list[Case]:
    cases = []
    for path, ms in (("nvfp4_decode", (1, 8)), ("bf16_decode", (1, 8)), ("nvfp4_grouped", (64,))):
        for name in _GPU_CONFIG_SHAPES:
            for config in PATH_CONFIGS[path]:
                # classic at M = 64: the kernels of the triton configuration (BM 16, no tail)
                if config not in ("default", "classic"):
                    cases += [Case.make(path, name, m, "gaussian", 0, config) for m in ms]
    # an expert with 128 of 256 tokens (8 pairs per expert: the default runs expert-wide row blocks, BM 16 + tail
    # 16, four blocks of 32 pairs each with its tail): the schedule without the options on the same routing
    cases.append(Case.make("nvfp4_grouped", "deepseek-v3", 256, "gaussian", 0, "classic", route="count-128-5"))
    return cases


#: Token counts of the grouped path on the gpu profile: small M (4..16: the grouped op serves any M) and larger M
#: on the core shapes, large M (``_GPU_GROUPED_LARGE``) on two of them; the other shapes get M = 9 and 64.
_GPU_GROUPED_M = (4, 9, 16, 64, 256)
_GPU_GROUPED_OTHER_M = (9, 64)
_GPU_GROUPED_LARGE = {"deepseek-v3": (4096,), "qwen3-30b-a3b": (4096,)}
_GPU_GROUPED_M_CYCLE = (9, 33, 16, 130, 64, 24, 12, 300, 10, 48, 17)
#: Largest M of a data-profile grouped case per shape on the gpu profile (a larger cycle M also adds M = the cap;
#: the larger case is gpu-full only).
_GPU_PROFILE_M = {"deepseek-v3": 64}


def _gpu_grouped_cases() -> list[Case]:
    from flint_moe.conformance.inputs.profiles import weight_key

    cases = []
    others = 0
    for s in REAL_SHAPES:
        profs = _profiles_for("nvfp4_grouped", s)
        if s.name in GPU_CORE_SHAPES:
            ms = _GPU_GROUPED_M + _GPU_GROUPED_LARGE.get(s.name, ())
        else:
            ms = _GPU_GROUPED_OTHER_M
            profs = _rotating(profs, others, 1)
            others += 1
        group = [Case.make("nvfp4_grouped", s, m, "gaussian") for m in ms]
        cap = _GPU_PROFILE_M.get(s.name, 1 << 30)
        cyc = [(_GPU_GROUPED_M_CYCLE[j % len(_GPU_GROUPED_M_CYCLE)], p) for j, p in enumerate(profs)]
        group += [Case.make("nvfp4_grouped", s, m, p) for m0, p in cyc for m in sorted({m0, min(m0, cap)})]
        group.sort(key=lambda c: weight_key(c))
        cases += group
    return cases


def make_inputs(case: Case, device: torch.device | str = "cpu") -> CaseInputs:
    """Deterministic inputs of ``case`` on ``device`` (same id and device -> same bytes).

    Random draws come from ``torch.Generator``s on ``device`` seeded from the case id (weights from the
    weight-relevant part only, so cases differing in M / routing profile share weights and a one-entry cache
    reuses them). Raises ValueError for a case whose sizes the path's layout rejects.
    """
    if case.path in BLOCK_PATHS:
        from flint_moe.conformance.inputs.block import build_block_inputs

        return build_block_inputs(case, torch.device(device))
    if case.path.startswith("nvfp4_pertoken_"):  # routing given, no router: inputs/pertoken.py
        from flint_moe.conformance.inputs.pertoken import build_pertoken_inputs

        return build_pertoken_inputs(case, torch.device(device))
    from flint_moe.conformance.inputs.profiles import build_inputs

    return build_inputs(case, torch.device(device))
