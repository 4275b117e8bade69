"""Host side of the decode block's CuTe DSL expert kernels (``ll_partial.py``'s two host functions: the partial
kernel, then ``ll_gate_up.py``'s finish or ``ll_down.py``'s combine): the K-split choice, the flat views of
:class:`~flint_moe.layouts.ll_weights.LLMoEWeights` the kernels read, the compile cache and the launches on the
current CUDA stream.

- :func:`ll_plan`: the block's shapes and K-splits (``LLPlan``), from the weights alone.
- :func:`expert_views`: int32 code words, uint8 scale bytes and fp32 global scales as ``view``s of the
  weights' own storage (no copy).
- :func:`launch_ll_gate_up`: rule steps 5-7 for ``pairs`` rows (routed pairs or the shared expert's tokens).
- :func:`launch_ll_down`: rule steps 5, 8-10 (routed and shared down partials, then the combine).
- :func:`launch_ll_experts`: both, in the order the block runs them (routed gate/up, shared gate/up, down).

Each specialisation (kind ``"gate_up"`` / ``"down"``, ``GateUpSpec`` / ``DownSpec``, tap build or not,
architecture) is compiled once per process on first use with ``cute.compile`` (arguments: ``from_dlpack`` views of
the call's CUDA tensors with dynamic layouts, so later calls with another token count reuse it), for the device's
architecture (``sm_90a`` on an H200). A call converts its tensors with ``from_dlpack`` and runs the compiled
function on ``torch.cuda.current_stream()``: no host synchronisation; outputs and fp32 workspaces are allocated by
torch on the current stream (capturable in a CUDA graph once compiled: the first call of a specialisation must run
outside a capture). Every launch asks for programmatic dependent launch and every kernel waits
(``griddepcontrol.wait``) before its first read.

Limits (each a ValueError naming the constraint): the reduction lengths H (gate/up), Ip and SI (down) must be
multiples of 16 (whole NVFP4 blocks; the weights' own checks already ask more); the code words of one weight
tensor must be addressable by int32 (E * N * K / 8 < 2^31); the kernels' inputs and code words must start on a
16-byte boundary (their 64- and 128-bit loads).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from flint_moe.kernels.cute.ll_down import DownSpec
from flint_moe.kernels.cute.ll_gate_up import WARPS, GateUpSpec, cute_available

__all__ = [
    "LLPlan",
    "SPLIT_TARGET_CTAS",
    "MAX_SPLITS",
    "choose_splits",
    "split_candidates",
    "compile_host",
    "compiled_specs",
    "host_ns",
    "expert_views",
    "launch_ll_down",
    "launch_ll_experts",
    "launch_ll_gate_up",
    "ll_experts_status",
    "ll_plan",
    "plan_shapes",
]

#: CTAs one pair's partial grid should reach before more K-splits stop being added (4 per SM of an H200's 132).
SPLIT_TARGET_CTAS = 4 * 132
#: Elements of K per lane step of a split: 32 lanes x one 16-element block.
_LANE_SPAN = 16 * 32
#: Most K-splits considered.
MAX_SPLITS = 16
_INT32_LIMIT = 1 << 31


def split_candidates(k: int) -> list[int]:
    """The K-splits considered for a reduction of ``k`` elements (a multiple of 16): for ``k`` a multiple of
    512, the S <= 16 dividing k / 512 (every lane of every split gets the same number of blocks); otherwise
    every S <= 16 whose last split is not empty (BPS = ceil(k / 16 / S) blocks per split)."""
    nblk = k // 16
    if k % _LANE_SPAN == 0:
        return [s for s in range(1, min(MAX_SPLITS, k // _LANE_SPAN) + 1) if k % (_LANE_SPAN * s) == 0]
    return [s for s in range(1, min(MAX_SPLITS, nblk) + 1) if (s - 1) * -(-nblk // s) < nblk]


def choose_splits(k: int, rows: int) -> int:
    """K-splits S of a partial kernel over ``rows`` rows (one warp per row, ``WARPS`` rows per CTA) reducing
    ``k`` elements: the smallest of :func:`split_candidates` whose grid of one pair, ``rows / WARPS * S``
    CTAs, reaches :data:`SPLIT_TARGET_CTAS`; the largest candidate if none does. Depends on the shapes only
    (not on the token count), so the declared summation order of a layer is one. ValueError unless ``k`` is
    a positive multiple of 16 and ``rows`` of ``WARPS``."""
    if not isinstance(k, int) or k <= 0 or k % 16:
        raise ValueError(f"choose_splits: reduction length {k} must be a positive multiple of 16")
    if not isinstance(rows, int) or rows <= 0 or rows % WARPS:
        raise ValueError(f"choose_splits: rows {rows} must be a positive multiple of {WARPS}")
    cands = split_candidates(k)
    for s in cands:
        if rows // WARPS * s >= SPLIT_TARGET_CTAS:
            return s
    return cands[-1]


@dataclass(frozen=True)
class LLPlan:
    """The block's shapes and K-splits: hidden H, routed intermediate I (valid) / Ip (stored), shared SI,
    experts E, top_k; splits of the routed gate/up (``s_gate_up``, K = H), shared gate/up (``s_shared_gate_up``,
    K = H), routed down (``s_down``, K = Ip) and shared down (``s_shared_down``, K = SI)."""

    hidden: int
    inter: int
    padded_inter: int
    shared_inter: int
    experts: int
    top_k: int
    s_gate_up: int
    s_shared_gate_up: int
    s_down: int
    s_shared_down: int

    def gate_up_spec(self) -> GateUpSpec:
        return GateUpSpec(self.hidden, self.padded_inter, self.experts, self.s_gate_up, True, self.top_k)

    def shared_gate_up_spec(self) -> GateUpSpec:
        return GateUpSpec(self.hidden, self.shared_inter, 1, self.s_shared_gate_up, False, 1)

    def down_spec(self) -> DownSpec:
        return DownSpec(
            self.hidden, self.padded_inter, self.inter, self.shared_inter, self.experts, self.top_k,
            self.s_down, self.s_shared_down,
        )  # fmt: skip


def plan_shapes(hidden: int, inter: int, padded_inter: int, shared_inter: int, experts: int, top_k: int) -> LLPlan:
    """:class:`LLPlan` of the given shapes (the splits by :func:`choose_splits`). ValueError for a shape the
    kernels do not take (module docstring: multiples of 16, int32 addressing)."""
    for name, v in (("hidden size H", hidden), ("padded intermediate Ip", padded_inter), ("shared SI", shared_inter)):
        if v <= 0 or v % 16:
            raise ValueError(f"flint_moe_ll: {name} = {v} must be a positive multiple of 16 (NVFP4 blocks)")
    if not 0 < inter <= padded_inter:
        raise ValueError(f"flint_moe_ll: intermediate I = {inter} must be in (0, Ip = {padded_inter}]")
    for name, words in (
        ("w.experts.w1", experts * 2 * padded_inter * hidden // 8),
        ("w.experts.w2", experts * hidden * padded_inter // 8),
    ):
        if words >= _INT32_LIMIT:
            raise ValueError(f"{name}: {words} int32 code words exceed the kernels' 32-bit offsets (< 2^31)")
    return LLPlan(
        hidden, inter, padded_inter, shared_inter, experts, top_k,
        choose_splits(hidden, 2 * padded_inter), choose_splits(hidden, 2 * shared_inter),
        choose_splits(padded_inter, hidden), choose_splits(shared_inter, hidden),
    )  # fmt: skip


def ll_plan(w, top_k: int) -> LLPlan:
    """:class:`LLPlan` of ``w`` (LLMoEWeights) with ``top_k`` selected experts per token."""
    ex = w.experts
    return plan_shapes(
        w.hidden_size, ex.valid_intermediate, ex.intermediate_size, w.shared_intermediate_size, w.num_experts, top_k
    )


def expert_views(w) -> dict[str, torch.Tensor]:
    """Flat views of ``w`` (LLMoEWeights) the kernels read, over the weights' own storage (no copy):
    ``w1`` int32 [E * 2Ip * H / 8], ``w1_sf`` uint8 [E * Mp * Kp] (swizzled), ``w1_gs`` fp32 [E];
    ``w2`` int32 [E * H * Ip / 8], ``w2_sf`` uint8, ``w2_gs`` fp32 [E]; ``sw13`` int32 [2SI * H / 8],
    ``sw13_sf`` uint8 [2SI * H / 16], ``sw13_gs`` fp32 [1]; ``sw2`` int32 [H * SI / 8], ``sw2_sf`` uint8
    [H * SI / 16], ``sw2_gs`` fp32 [1]."""
    ex = w.experts

    def words(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.uint8).reshape(-1).view(torch.int32)

    def scale_bytes(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.uint8).reshape(-1)

    return {
        "w1": words(ex.w1), "w1_sf": scale_bytes(ex.w1_sf_swizzled), "w1_gs": ex.w1_alpha.view(-1),
        "w2": words(ex.w2), "w2_sf": scale_bytes(ex.w2_sf_swizzled), "w2_gs": ex.w2_alpha.view(-1),
        "sw13": words(w.shared_w13), "sw13_sf": scale_bytes(w.shared_w13_sf), "sw13_gs": w.shared_w13_gs.view(1),
        "sw2": words(w.shared_w2), "sw2_sf": scale_bytes(w.shared_w2_sf), "sw2_gs": w.shared_w2_gs.view(1),
    }  # fmt: skip


def ll_experts_status(device: torch.device | str | None) -> tuple[bool, str]:
    """(available, reason): whether the CuTe expert kernels can run on ``device`` (a CUDA device of compute
    capability 9.0 or later, nvidia-cutlass-dsl importable). Never raises."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda":
        return False, (
            f"the CuTe DSL expert kernels need a CUDA device (sm_90 or later), got tensors on {dev}; CuTe DSL has no "
            "CPU interpreter"
        )
    if not torch.cuda.is_available():
        return False, "the CuTe DSL expert kernels need a CUDA device; CUDA is not available"
    ok, why = cute_available()
    if not ok:
        return False, f"the CuTe DSL expert kernels need {why}"
    cap = torch.cuda.get_device_capability(dev)
    if cap[0] < 9:
        return False, f"the CuTe DSL expert kernels need sm_90 or later; this device is sm_{cap[0]}{cap[1]}"
    return True, "available"


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


_CACHE: dict[tuple, object] = {}
_LOCK = threading.Lock()


def compiled_specs() -> list[tuple]:
    """Keys (kind, spec, tap, arch) of the specialisations compiled so far in this process."""
    return list(_CACHE)


def _cute(t: torch.Tensor):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t).mark_layout_dynamic()


def _stream():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def compile_host(ns, args: list, ints: list, constexprs: list, stream, arch: str):
    """``cute.compile`` of ``ns.host`` (:func:`host_ns`) with the host function's
    parameters in signature order: the tensors ``args`` (``from_dlpack`` views), the runtime integers ``ints``,
    the compile-time ``constexprs``, then the CUDA ``stream``; for ``arch`` (e.g. ``"sm_90a"``)."""
    return ns.cute.compile(ns.host, *args, *ints, *constexprs, stream, options=f"--gpu-arch {arch}")


def _run(kind: str, spec, tap: bool, device: torch.device, ns, tensors: list, ints: list, constexprs: list) -> None:
    """Compile (once per key) and run ``ns.host``: the compiled function takes the runtime arguments only
    (``tensors`` + ``ints`` + stream; the constexprs are baked in)."""
    key = (kind, spec, bool(tap), _arch(device))
    args = [_cute(t) for t in tensors]
    stream = _stream()
    fn = _CACHE.get(key)
    if fn is None:
        with _LOCK:
            fn = _CACHE.get(key)
            if fn is None:
                fn = compile_host(ns, args, ints, constexprs, stream, key[3])
                _CACHE[key] = fn
    fn(*args, *ints, stream)


def _check_aligned(**tensors: torch.Tensor) -> None:
    """ValueError unless every tensor starts on a 16-byte boundary (the partial kernel's vector loads)."""
    for name, t in tensors.items():
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: the expert kernels need a 16-byte aligned start, got {t.data_ptr():#x}")


def host_ns(kind: str):
    """``ll_partial``'s host function of ``kind`` (``"gate_up"`` / ``"down"``) as ``ns.host``, with ``ns.cute``:
    the shape :func:`compile_host` and ``_run`` take."""
    import types

    from flint_moe.kernels.cute import ll_partial

    ns = ll_partial._dsl()
    return types.SimpleNamespace(cute=ns.cute, host=getattr(ns, kind))


def _dummy(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(1, dtype=dtype, device=device)


def launch_ll_gate_up(
    x: torch.Tensor,
    ids: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    gs: torch.Tensor,
    spec: GateUpSpec,
    pairs: int,
    top_k: int,
    *,
    tap: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Rule steps 5-7 (``ll_partial``'s partial kernel then ``ll_gate_up``'s ``finish``) for ``pairs`` rows.

    Args: ``x`` bf16 [tokens, H] contiguous (routed: token ``q // top_k`` of pair q; shared: token q);
    ``ids`` int32 [pairs] (routed: the pairs' experts, ``ids`` [M, k] flattened; shared: read by no one);
    ``codes`` int32 [E * 2Ip * H / 8], ``scales`` uint8 [E * Mp * Kp], ``gs`` fp32 [E] (:func:`expert_views`);
    ``spec`` the specialisation (its ``top_k``: 1 for the shared expert); ``top_k`` the pairs per token (equal
    to ``spec.top_k``); ``tap``: also return the accumulators.
    Returns ``act`` bf16 [pairs, Ip] (columns >= I of a padded routed layout hold values of the padding rows:
    never read), and with ``tap`` ``gate_acc`` / ``up_acc`` fp32 [pairs, Ip] (before the global scale), else
    None, None. New tensors on ``x``'s device, allocated on the current stream; no synchronisation.
    Raises ValueError when ``top_k`` differs from ``spec.top_k`` or when ``x`` or ``codes`` does not start on a
    16-byte boundary.
    """
    if top_k != spec.top_k:
        raise ValueError(f"top_k: {top_k} differs from the spec's top_k {spec.top_k}")
    _check_aligned(x=x, codes=codes)
    dev = x.device
    ip, s = spec.inter, spec.splits
    ws = torch.empty(pairs * s * 2 * ip, dtype=torch.float32, device=dev)
    act = torch.empty((pairs, ip), dtype=torch.bfloat16, device=dev)
    if tap:
        g_tap = torch.empty((pairs, ip), dtype=torch.float32, device=dev)
        u_tap = torch.empty((pairs, ip), dtype=torch.float32, device=dev)
    else:
        g_tap = u_tap = _dummy(dev, torch.float32)
    tensors = [x.reshape(-1), ids.reshape(-1), codes, scales, gs, ws, act.view(torch.int16).reshape(-1),
               g_tap.reshape(-1), u_tap.reshape(-1)]  # fmt: skip
    constexprs = [spec.hidden, ip, s, spec.routed, bool(tap), top_k]
    _run("gate_up", spec, tap, dev, host_ns("gate_up"), tensors, [pairs, top_k], constexprs)
    return act, (g_tap if tap else None), (u_tap if tap else None)


def launch_ll_down(
    act: torch.Tensor,
    shared_act: torch.Tensor,
    ids: torch.Tensor,
    tw: torch.Tensor,
    views: dict[str, torch.Tensor],
    spec: DownSpec,
    tokens: int,
    *,
    tap: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rule steps 5, 8-10: the routed and shared down partials (``ll_partial``), then the combine (``ll_down``).

    Args: ``act`` bf16 [M * k, Ip] (the pairs' activations, columns >= I never read), ``shared_act`` bf16
    [M, SI], ``ids`` int32 [M, k], ``tw`` fp32 [M, k] (bf16 values), ``views`` :func:`expert_views`, ``spec``,
    ``tokens`` M. Returns ``out`` bf16 [M, H] and, with ``tap``, ``{"down_acc": fp32 [M, k, H], "y": bf16
    [M, k, H], "shared_down_acc": fp32 [M, H], "shared_y": bf16 [M, H]}`` (else ``{}``). Raises ValueError
    when ``act``, ``shared_act`` or the down code words do not start on a 16-byte boundary.
    """
    _check_aligned(act=act, shared_act=shared_act, w2=views["w2"], sw2=views["sw2"])
    dev = act.device
    h, k, s, ss = spec.hidden, spec.top_k, spec.splits, spec.shared_splits
    m = tokens
    ws_r = torch.empty(m * k * s * h, dtype=torch.float32, device=dev)
    ws_s = torch.empty(m * ss * h, dtype=torch.float32, device=dev)
    out = torch.empty((m, h), dtype=torch.bfloat16, device=dev)
    if tap:
        t = {
            "down_acc": torch.empty((m, k, h), dtype=torch.float32, device=dev),
            "y": torch.empty((m, k, h), dtype=torch.bfloat16, device=dev),
            "shared_down_acc": torch.empty((m, h), dtype=torch.float32, device=dev),
            "shared_y": torch.empty((m, h), dtype=torch.bfloat16, device=dev),
        }
        taps = [t["down_acc"], t["y"].view(torch.int16), t["shared_down_acc"], t["shared_y"].view(torch.int16)]
    else:
        t = {}
        f32, i16 = _dummy(dev, torch.float32), _dummy(dev, torch.int16)
        taps = [f32, i16, f32, i16]
    tensors = [
        act.reshape(-1), shared_act.reshape(-1), ids.reshape(-1), tw.reshape(-1),
        views["w2"], views["w2_sf"], views["w2_gs"], views["sw2"], views["sw2_sf"], views["sw2_gs"],
        ws_r, ws_s, out.view(torch.int16).reshape(-1), *(v.reshape(-1) for v in taps),
    ]  # fmt: skip
    constexprs = [h, spec.inter, spec.valid_inter, spec.shared_inter, k, s, ss, bool(tap)]
    _run("down", spec, tap, dev, host_ns("down"), tensors, [m], constexprs)
    return out, t


def launch_ll_experts(
    xn: torch.Tensor,
    ids: torch.Tensor,
    tw: torch.Tensor,
    w,
    top_k: int,
    *,
    taps: dict | None = None,
    plan: LLPlan | None = None,
) -> torch.Tensor:
    """Rule steps 5-10 of the block on ``xn`` bf16 [M, H] with the routing ``ids`` int32 [M, k] and ``tw``
    fp32 [M, k] (``launch_ll_router``'s outputs) and the weights ``w`` (LLMoEWeights): routed gate/up, shared
    gate/up, then down + combine. Returns ``out`` bf16 [M, H]. With ``taps`` (a dict) it receives
    ``gate_acc`` / ``up_acc`` fp32 [M, k, I], ``act`` bf16 [M, k, I], ``shared_gate_acc`` /
    ``shared_up_acc`` fp32 [M, SI], ``shared_act`` bf16 [M, SI], ``shared_down_acc`` fp32 [M, H],
    ``shared_y`` bf16 [M, H], ``down_acc`` fp32 [M, k, H], ``y`` bf16 [M, k, H], ``out`` bf16 [M, H].
    Each selected expert's weights are read once per call for all its tokens (``ll_partial``). Raises
    ValueError as :func:`launch_ll_gate_up` / :func:`launch_ll_down` (unaligned inputs)."""
    plan = plan or ll_plan(w, top_k)
    views = expert_views(w)
    m = xn.shape[0]
    k, ip, i = top_k, plan.padded_inter, plan.inter
    tap = taps is not None
    act, g, u = launch_ll_gate_up(
        xn, ids, views["w1"], views["w1_sf"], views["w1_gs"], plan.gate_up_spec(), m * k, k, tap=tap
    )
    sact, sg, su = launch_ll_gate_up(
        xn, ids, views["sw13"], views["sw13_sf"], views["sw13_gs"], plan.shared_gate_up_spec(), m, 1, tap=tap
    )
    out, dt = launch_ll_down(act, sact, ids, tw, views, plan.down_spec(), m, tap=tap)
    if taps is not None:
        taps["gate_acc"] = g.view(m, k, ip)[..., :i]
        taps["up_acc"] = u.view(m, k, ip)[..., :i]
        taps["act"] = act.view(m, k, ip)[..., :i]
        taps["shared_gate_acc"], taps["shared_up_acc"], taps["shared_act"] = sg, su, sact
        taps.update(dt)
        taps["out"] = out
    return out
