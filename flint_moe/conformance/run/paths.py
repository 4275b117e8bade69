"""Kernel paths under conformance test: thin wrappers over the public ops that run them with taps
(docs/ARCHITECTURE.md, section 2).

``PATHS[name].run(inputs, counter, taps) -> out`` runs one case's inputs (``profiles.CaseInputs``) through the
op; ``taps`` (a dict or None) receives the kernels' stage tensors. ``max_tokens`` is the largest M the path
serves (``cases.matrix`` never asks for more). ``path_for(case)`` is the path of a case with its launch
configuration (``cases.PATH_CONFIGS``): the default op, or the same kernels launched with the overrides;
``kernel_configs(path, config)`` resolves a configuration name to the launcher dicts; ``declared_orders(case)``
gathers the summation orders the case's kernels declare (``flint_moe.kernels.orders``) for the order replay;
``dispatch_path(M, E, k)`` names the kernels ``ops.flint_moe`` runs for a case (decode or grouped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["KernelPath", "PATHS", "declared_orders", "dispatch_path", "kernel_configs", "path_for"]


@dataclass(frozen=True)
class KernelPath:
    """One kernel path: ``name`` (a ``cases.PATH_NAMES`` entry), ``max_tokens`` (largest M served),
    ``weights`` ("nvfp4" | "bf16": the stored layout it reads),
    ``fn(inputs, counter, taps) -> bf16 [M, H]``."""

    name: str
    max_tokens: int
    weights: str
    fn: Callable

    def run(self, inputs, counter: torch.Tensor, taps: dict | None = None) -> torch.Tensor:
        """Run the op on ``inputs`` (``CaseInputs``); ``counter`` from ``ops.make_route_counter(device)``.

        Returns bf16 [M, H]. Raises ValueError if M exceeds ``max_tokens``."""
        m = int(inputs.x.shape[0])
        if m > self.max_tokens:
            raise ValueError(f"path {self.name}: M = {m} exceeds its max_tokens = {self.max_tokens}")
        return self.fn(inputs, counter, taps)


def _nvfp4(inputs, counter, taps):
    from flint_moe.ops import flint_moe

    k = _top_k(inputs)
    return flint_moe(inputs.x, inputs.router_weight, inputs.stored, k, counter, inputs.shared, taps=taps)


def _nvfp4_decode(inputs, counter, taps):
    """The NVFP4 decode kernels at any M <= ``ops.DECODE_MAX_TOKENS``: through ``ops.flint_moe`` where it runs
    them (M <= ``ops.decode_max_tokens(E, k)``), launched directly above (the same kernels and launch
    configurations: :func:`_nvfp4_with` without overrides)."""
    from flint_moe.ops import decode_max_tokens

    if inputs.x.shape[0] <= decode_max_tokens(int(inputs.router_weight.shape[0]), _top_k(inputs)):
        return _nvfp4(inputs, counter, taps)
    return _nvfp4_with({})(inputs, counter, taps)


def _nvfp4_grouped(inputs, counter, taps):
    from flint_moe.ops import flint_moe_grouped

    k = _top_k(inputs)
    return flint_moe_grouped(inputs.x, inputs.router_weight, inputs.stored, k, counter, inputs.shared, taps=taps)


def _bf16(inputs, counter, taps):
    from flint_moe.ops import flint_moe_bf16_decode

    g1, g2, maps = inputs.stored
    k = _top_k(inputs)
    # mutation testing injects wrong (in-range) row maps on purpose: the op's value check would refuse them
    check = not inputs.notes.get("injected_row_maps", False)
    return flint_moe_bf16_decode(inputs.x, inputs.router_weight, g1, g2, maps, k, counter, inputs.shared, taps=taps,
                                 check_row_map_values=check)  # fmt: skip


def module_from_inputs(inputs, top_k: int, pad_to: int | None = None):
    """``modules.FlintNvfp4Experts`` loaded from ``inputs.logical`` (the golden model's checkpoint-layout
    NVFP4Experts) as a checkpoint loader would feed it: ``{e}.{gate,up,down}_proj.{weight, weight_scale,
    weight_scale_2}`` pairs (its loader repacks them into FlintMoEWeights)."""
    from flint_moe.modules import FlintNvfp4Experts

    lg = inputs.logical
    E, two_i, half_h = lg.w13.shape
    I, H = two_i // 2, half_h * 2  # noqa: E741
    mod = FlintNvfp4Experts(E, H, I, top_k, pad_intermediate_to=pad_to, device=inputs.x.device)
    named = []
    for e in range(E):
        for proj, rows in (("gate_proj", slice(0, I)), ("up_proj", slice(I, 2 * I))):
            named += [(f"{e}.{proj}.weight", lg.w13[e, rows]), (f"{e}.{proj}.weight_scale", lg.w13_scale[e, rows]),
                      (f"{e}.{proj}.weight_scale_2", lg.w13_gs[e])]  # fmt: skip
        named += [(f"{e}.down_proj.weight", lg.w2[e]), (f"{e}.down_proj.weight_scale", lg.w2_scale[e]),
                  (f"{e}.down_proj.weight_scale_2", lg.w2_gs[e])]  # fmt: skip
    mod.load_weights(named)
    return mod


def _nvfp4_module(inputs, counter, taps):
    k = _top_k(inputs)
    hit = _MODULE.get("entry")
    # one entry (real layers are large), keyed by the logical weights object itself (held, so never reused)
    if hit is None or hit[0] is not inputs.logical or hit[1] != k:
        _MODULE.clear()
        ip, i = inputs.stored.intermediate_size, inputs.stored.valid_intermediate
        _MODULE["entry"] = (inputs.logical, k, module_from_inputs(inputs, k, ip if ip != i else None))
    return _MODULE["entry"][2](inputs.x, inputs.router_weight, inputs.shared, taps=taps)


_MODULE: dict = {}


def _bf16_module(inputs, counter, taps):
    from flint_moe.modules import FlintBf16DecodeMoE

    k = _top_k(inputs)
    g1, g2, _maps = inputs.stored
    E, H, two_i = g1.shape[0], g1.shape[1] * 64, g1.shape[2]
    hit = _BF16_MODULE.get("entry")
    # the module builds its own row maps and keeps its own route counter; the layer's weights are read in place
    if hit is None or hit[0] is not g1 or hit[1] != k:
        _BF16_MODULE.clear()
        _BF16_MODULE["entry"] = (g1, k, FlintBf16DecodeMoE(E, H, two_i // 2, k, device=inputs.x.device))
    return _BF16_MODULE["entry"][2](inputs.x, inputs.router_weight, (g1, g2), inputs.shared, taps=taps)


_BF16_MODULE: dict = {}


def _ll_op():
    """The block op ``flint_moe.ops.moe_ll.flint_moe_ll``, looked up at each call (the module
    ``FlintLLDecodeBlock`` calls it the same way; the CPU tests put a stand-in kernel side there)."""
    from flint_moe.ops import moe_ll

    return moe_ll.flint_moe_ll


def _ll_block(inputs, counter, taps):
    """``flint_moe_ll(attn_out = inputs.x, residual = inputs.shared, ...)`` on the case's ``LLMoEWeights``; the
    returned ``residual_out`` goes into ``taps["returned_residual_out"]`` (judged against the tap)."""
    k = _top_k(inputs)
    out, residual_out = _ll_op()(inputs.x, inputs.shared, inputs.ln_weight, inputs.eps, inputs.ll, k, counter,
                                 taps=taps)  # fmt: skip
    if taps is not None:
        taps["returned_residual_out"] = residual_out
    return out


def ll_module_from_inputs(inputs, top_k: int):
    """``modules.FlintLLDecodeBlock`` built from the case's layers as a serving engine holds them: the router
    weight, two ``nn.Module`` NVFP4 linears (``weight`` uint8 [N, K/2], ``weight_scale`` the 128x4-swizzled
    bytes, ``weight_global_scale`` fp32 [1]) and the routed ``FlintMoEWeights``; ln weight and eps."""
    from torch import nn

    from flint_moe.modules import FlintLLDecodeBlock

    def linear(codes, sf, gs):
        m = nn.Module()
        m.weight = nn.Parameter(codes, requires_grad=False)
        m.weight_scale = nn.Parameter(sf, requires_grad=False)
        m.weight_global_scale = nn.Parameter(gs.reshape(1), requires_grad=False)
        return m

    ll = inputs.ll
    return FlintLLDecodeBlock.from_layers(
        ll.router_weight, linear(ll.shared_w13, ll.shared_w13_sf, ll.shared_w13_gs),
        linear(ll.shared_w2, ll.shared_w2_sf, ll.shared_w2_gs), ll.experts, inputs.ln_weight, inputs.eps, top_k,
    )  # fmt: skip


def _ll_module(inputs, counter, taps):
    k = _top_k(inputs)
    hit = _LL_MODULE.get("entry")
    # one entry, keyed by the case's weights view itself (held, so never reused); the module keeps its counter
    if hit is None or hit[0] is not inputs.ll or hit[1] != k:
        _LL_MODULE.clear()
        _LL_MODULE["entry"] = (inputs.ll, k, ll_module_from_inputs(inputs, k))
    out, residual_out = _LL_MODULE["entry"][2](inputs.x, inputs.shared, taps=taps)
    if taps is not None:
        taps["returned_residual_out"] = residual_out
    return out


_LL_MODULE: dict = {}


def _top_k(inputs) -> int:
    try:
        return int(inputs.notes["top_k"])
    except KeyError:
        raise ValueError("inputs.notes['top_k'] missing: build inputs with cases.make_inputs") from None


def _build() -> dict[str, KernelPath]:
    from flint_moe.ops import DECODE_BF16_MAX_TOKENS, DECODE_MAX_TOKENS, GROUPED_MAX_TOKENS
    from flint_moe.ops.moe_ll import LL_MOE_MAX_TOKENS

    return {
        "nvfp4_decode": KernelPath("nvfp4_decode", DECODE_MAX_TOKENS, "nvfp4", _nvfp4_decode),
        "bf16_decode": KernelPath("bf16_decode", DECODE_BF16_MAX_TOKENS, "bf16", _bf16),
        "nvfp4_grouped": KernelPath("nvfp4_grouped", GROUPED_MAX_TOKENS, "nvfp4", _nvfp4_grouped),
        "nvfp4_module": KernelPath("nvfp4_module", GROUPED_MAX_TOKENS, "nvfp4", _nvfp4_module),
        "bf16_module": KernelPath("bf16_module", DECODE_BF16_MAX_TOKENS, "bf16", _bf16_module),
        # the shipped dispatch: ops.flint_moe at any M (decode kernels up to decode_max_tokens(E, k), grouped above)
        "nvfp4_dispatch": KernelPath("nvfp4_dispatch", GROUPED_MAX_TOKENS, "nvfp4", _nvfp4),
        # the low-latency decode block (inputs.block): step 11 + steps 1-10 with the NVFP4 shared expert
        "ll_block": KernelPath("ll_block", LL_MOE_MAX_TOKENS, "nvfp4", _ll_block),
        "ll_module": KernelPath("ll_module", LL_MOE_MAX_TOKENS, "nvfp4", _ll_module),
        **_pertoken_paths(),
    }


def _pertoken_paths() -> dict[str, KernelPath]:
    """``ops.routed_nvfp4_moe`` per activation (weights ``RoutedNVFP4Weights``; inputs/pertoken.py)."""
    from flint_moe.conformance.inputs.pertoken import PERTOKEN_PATHS, run_pertoken

    return {name: KernelPath(name, 1 << 20, "nvfp4_pertoken", run_pertoken) for name in PERTOKEN_PATHS}


PATHS: dict[str, KernelPath] = _build()


def kernel_configs(path: str, config: str = "default") -> dict:
    """Launcher overrides of ``config`` for ``path`` (``cases.PATH_CONFIGS``), names of
    flint_moe/kernels/nvfp4/tuned.py resolved to their dicts: ``{"gate_up": dict, "down": dict, "BM": int}``
    (keys present only where overridden). Raises KeyError for an unknown path or configuration."""
    from flint_moe.conformance.inputs.cases import PATH_CONFIGS

    out = {}
    for key, v in PATH_CONFIGS[path][config].items():
        if isinstance(v, str):
            from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned

            v = getattr(nvfp4_tuned, v)
        out[key] = dict(v) if isinstance(v, dict) else v
    return out


def _nvfp4_with(cfg: dict) -> Callable:
    def fn(inputs, counter, taps):
        from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
        from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
        from flint_moe.ops.route import route

        k = _top_k(inputs)
        ids, tw = route(inputs.x, inputs.router_weight, k, counter, taps=taps)
        act = nvfp4_gate_up(inputs.x, ids, inputs.stored, taps=taps, config=cfg.get("gate_up"))
        return nvfp4_down(act, ids, tw, inputs.stored, inputs.shared, taps=taps, config=cfg.get("down"))

    return fn


def _bf16_with(cfg: dict) -> Callable:
    def fn(inputs, counter, taps):
        from flint_moe.kernels.bf16.down_combine import bf16_down_combine
        from flint_moe.kernels.bf16.gate_up import bf16_gate_up
        from flint_moe.ops.route import route

        g1, g2, maps = inputs.stored
        k = _top_k(inputs)
        ids, tw = route(inputs.x, inputs.router_weight, k, counter, taps=taps)
        act = bf16_gate_up(inputs.x, ids, g1, maps[0], taps=taps, config=cfg.get("gate_up"))
        return bf16_down_combine(act, ids, tw, g2, maps[1], inputs.shared, taps=taps, config=cfg.get("down"))

    return fn


def _grouped_with(cfg: dict) -> Callable:
    def fn(inputs, counter, taps):
        from flint_moe.ops import flint_moe_grouped

        k = _top_k(inputs)
        return flint_moe_grouped(
            inputs.x, inputs.router_weight, inputs.stored, k, counter, inputs.shared, taps=taps, config=cfg
        )

    return fn


_WITH = {"nvfp4_decode": _nvfp4_with, "bf16_decode": _bf16_with, "nvfp4_grouped": _grouped_with}


def path_for(case) -> KernelPath:
    """The KernelPath of ``case`` (``case.path`` with ``case.config``; the plain ``PATHS`` entry for the
    default configuration)."""
    base = PATHS[case.path]
    config = getattr(case, "config", "default")
    if config == "default":
        return base
    cfg = kernel_configs(case.path, config)
    return KernelPath(f"{base.name}[{config}]", base.max_tokens, base.weights, _WITH[case.path](cfg))


def dispatch_path(M: int, E: int, k: int) -> str:
    """The path whose kernels ``ops.flint_moe`` runs for M tokens of a layer with E experts and top_k k (the
    ``nvfp4_module`` and ``nvfp4_dispatch`` cases, the checkpoint cases): ``"nvfp4_decode"`` for M <=
    ``ops.decode_max_tokens(E, k)`` (the op's own rule), else ``"nvfp4_grouped"``. TypeError / ValueError for E
    or k out of range (``decode_max_tokens``)."""
    from flint_moe.ops import decode_max_tokens

    return "nvfp4_decode" if int(M) <= decode_max_tokens(int(E), int(k)) else "nvfp4_grouped"


def declared_orders(case) -> dict:
    """Stage (``"router"``, ``"gate_up"``, ``"down"``) -> the summation order the kernels of ``case`` declare
    (``flint_moe.kernels.orders``: data built from the launch configuration and the case's shape), for the
    golden model's order replay. The module and dispatch paths follow the op they call: ``nvfp4_module`` and
    ``nvfp4_dispatch`` the decode kernels up to ``ops.decode_max_tokens(E, k)`` (:func:`dispatch_path`), then
    the grouped ones; ``bf16_module`` the BF16 decode kernels.
    Raises KeyError for an unknown path or configuration, ``OrderError`` for a configuration without a
    declared order (a kernel variant must declare its order before the harness can judge it bitwise)."""
    from flint_moe.kernels import orders

    path, config = case.path, getattr(case, "config", "default")
    H, I, M = int(case.H), int(case.I), int(case.M)  # noqa: E741
    if path in ("ll_block", "ll_module"):
        return block_orders(case)
    if path.startswith("nvfp4_pertoken_"):  # stages "fc1", "fc2" (judge/pertoken.py)
        return orders.pertoken_orders(H, I)
    if path in ("nvfp4_module", "nvfp4_dispatch"):  # ops.flint_moe: decode kernels up to the threshold
        path, config = dispatch_path(M, case.E, case.k), "default"
    elif path == "bf16_module":
        path, config = "bf16_decode", "default"
    cfg = kernel_configs(path, config)
    if path == "nvfp4_decode":
        return orders.nvfp4_decode_orders(H, I, M=M, gate_up=cfg.get("gate_up"), down=cfg.get("down"))
    if path == "nvfp4_grouped":
        return orders.nvfp4_grouped_orders(H, I, M=M, config=cfg)
    if path == "bf16_decode":  # the BF16 kernels' down reduction runs over the stored (padded) intermediate size
        pad = getattr(case, "pad_to", None)
        return orders.bf16_decode_orders(H, -(-I // pad) * pad if pad else I, M=M)
    raise KeyError(f"declared_orders: no kernel orders for path {path!r}")


def block_orders(case) -> dict:
    """The declared orders of the decode block's kernels for ``case`` (an ``ll_block`` / ``ll_module`` case):
    ``kernels.orders.ll_block_orders`` (``router``, ``gate_up``, ``down``) merged with
    ``ll_block_extra_orders`` (``sumsq``, ``shared_gate_up``, ``shared_down``), for the case's H, I, stored
    intermediate size, shared intermediate size, E and top_k."""
    from flint_moe.conformance.inputs.block import block_shape
    from flint_moe.kernels import orders

    shape, _eps = block_shape(case.shape)
    H, I = int(case.H), int(case.I)  # noqa: E741
    pad = getattr(case, "pad_to", None)
    kw = {"Ip": -(-I // pad) * pad if pad else I, "top_k": int(case.k), "E": int(case.E)}
    si = shape.shared_intermediate
    return {**orders.ll_block_orders(H, I, si, **kw), **orders.ll_block_extra_orders(H, I, si, **kw)}
