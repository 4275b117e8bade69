"""sm_90 PTX audit of every kernel specialisation the conformance matrix launches (on the CPU, in CI).

The kernel modules register hand-picked specialisations (``flint_moe.kernels.audit.registry.AUDIT_REGISTRY``, each
module's ``audit_specs()``). This module derives the specialisations from the matrix itself, so that a new
shape, top_k, expert count or launch configuration in ``cases.matrix`` cannot slip past the audit:

- ``matrix_launches(profiles)`` runs every case of ``cases.matrix("gpu")`` and ``cases.matrix("cpu")`` (every
  path and ``cases.PATH_CONFIGS`` entry) through the same op / launcher calls as
  ``flint_moe.conformance.run.paths`` does, as the harness runs it (``_case_launches``: with taps, the TAP builds
  the conformance run compares; without, the production builds its determinism / CUDA-graph replays run; each
  row alone at M = 1 for batch invariance; the default path for mutation testing), on fake CUDA tensors of the
  case's real sizes (``torch._subclasses.fake_tensor.FakeTensorMode``: device ``cuda``, no data, no GPU), with
  ``JITFunction.run`` replaced by a recorder: no kernel compiles or runs; each ``kernel[grid](...)`` launch is
  recorded as a ``Launch`` (kernel, argument types, constexpr values, compile options) exactly as the launcher
  computed them on a CUDA device (default configs, K-splits, warps, register caps, ...). Two stand-ins:
  ``moe_permute`` (pure torch, no kernel) returns its outputs' shapes only, and the module paths run the op
  their ``forward`` calls (``_MODULE_OP_PATH``).
- Launches are deduplicated by what changes the compiled kernel: the kernel function, the Triton types of
  its runtime arguments (dead tap pointers included: Triton caches one binary per signature), its constexpr
  arguments, and the compile options (``num_warps``, ``num_stages``, ``maxnreg``, ``enable_fp_fusion``, ...).
  ``launch_pdl`` (a launch attribute, not in the PTX) is left out of the key.
- ``register_matrix_audit()`` registers, through ``audit.registry.register_audit``, every distinct launch no
  kernel-module spec already covers, as ``matrix.<kernel>.<digest>`` with the ``require`` / ``forbid`` lists
  of that kernel's own registered specs (a kernel's rule instructions do not depend on its sizes; where the
  module's specs differ by path (MMA vs CUDA cores), the list of the specs with the same ``MMA`` constexpr,
  or the other path's list with the path instructions swapped as the module swaps them, ``_rule_lists``).
- ``python -m flint_moe.conformance.audit specs | report | list | uncovered | audit [--specs FILE] NAME...``
  mirrors ``python -m flint_moe.kernels.audit`` with the matrix specs registered too (``audit`` compiles
  with the same ``compile_ptx_sm90`` / ``audit_ptx``, prints JSON and exits 1 on problems; ``uncovered``
  prints the launches no registered spec covers, exit 1 if any; ``report``: ``coverage_report()``).

Must run without ``TRITON_INTERPRET`` (the recorder patches ``triton.runtime.jit.JITFunction``; under the
interpreter kernels are ``InterpretedFunction`` objects and launch options differ); raises ``RuntimeError``
otherwise. The kernel / op / layout modules are only imported, never modified.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Launch",
    "IGNORED_OPTIONS",
    "matrix_launches",
    "spec_key",
    "launch_key",
    "uncovered_launches",
    "register_matrix_audit",
    "collect_all_specs",
]

#: Launch keyword arguments that do not change the compiled PTX: ``launch_pdl`` is a launch attribute (Triton 3.6
#: reads it only in the NVIDIA driver's launcher).
IGNORED_OPTIONS = frozenset({"launch_pdl"})
#: Compile options' values when a launch does not pass them (Triton 3.6 CUDAOptions defaults that matter).
#: ``enable_fp_fusion`` stays in the key: ``audit.ptx.compile_ptx_sm90`` always compiles with True, so a launch
#: with False would match no spec and fail the coverage test.
_OPTION_DEFAULTS = {"num_warps": 4, "num_stages": 3, "enable_fp_fusion": True}


def _kernel_name(kernel: Any) -> str:
    """``<module path under flint_moe.kernels>.<function>``, e.g. ``nvfp4.gate_up._nvfp4_gate_up_kernel`` (the
    nvfp4/ and bf16/ packages both have a ``gate_up``)."""
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__.removeprefix('flint_moe.kernels.')}.{fn.__name__}"


@dataclass(frozen=True)
class Launch:
    """One recorded ``kernel[grid](...)`` launch: ``kernel`` (the JITFunction), ``signature`` (runtime argument
    name -> Triton type string), ``constexprs`` (constexpr argument name -> value), ``options`` (compile
    options passed at the launch, ``IGNORED_OPTIONS`` removed; ``enable_fp_fusion`` kept)."""

    kernel: Any
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]

    @property
    def kernel_name(self) -> str:
        return _kernel_name(self.kernel)

    @property
    def key(self) -> tuple:
        return launch_key(self.kernel, dict(self.signature), dict(self.constexprs), dict(self.options))


def _norm_options(options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    opts = {**_OPTION_DEFAULTS, **{k: v for k, v in options.items() if k not in IGNORED_OPTIONS}}
    return tuple(sorted((k, v) for k, v in opts.items() if v is not None))


def launch_key(kernel: Any, signature: dict, constexprs: dict, options: dict) -> tuple:
    """What makes one compiled specialisation: (kernel function, runtime argument types, constexprs, options)."""
    fn = getattr(kernel, "fn", kernel)
    consts = {k: (bool(v) if isinstance(v, bool) else v) for k, v in constexprs.items()}
    return (
        f"{fn.__module__}.{fn.__qualname__}",
        tuple(sorted((k, v) for k, v in signature.items() if k not in consts)),
        tuple(sorted(consts.items())),
        _norm_options(options),
    )


def spec_key(spec) -> tuple:
    """``launch_key`` of a registered ``audit.registry.AuditSpec`` (compiled with ``enable_fp_fusion=True`` always)."""
    return launch_key(spec.kernel, spec.signature, spec.constexprs, {**spec.options, "enable_fp_fusion": True})


# ---------------------------------------------------------------------------------------------------------
# Recording launches
# ---------------------------------------------------------------------------------------------------------


def _check_not_interpreted() -> None:
    from flint_moe.kernels._launch import INTERPRET

    if INTERPRET:
        raise RuntimeError(
            "flint_moe.conformance.audit: TRITON_INTERPRET=1 was set when the kernels were imported; the launch "
            "recorder needs real JITFunctions (run `python -m flint_moe.conformance.audit` without it)"
        )


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _recording(out: list[Launch]):
    """Replace ``JITFunction.run`` by a recorder appending a ``Launch`` to ``out`` (no compile, no launch)."""
    from triton.runtime.jit import JITFunction, mangle_type

    orig = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        del grid, warmup
        names = self.arg_names
        bound = dict(zip(names, args, strict=False))
        options = {}
        for k, v in kwargs.items():
            if k in names:
                bound[k] = v
            else:
                options[k] = v
        sig, consts = {}, {}
        for p in self.params:
            name = p.name
            if name not in bound:
                if p.has_default:
                    bound[name] = p.default
                else:
                    raise TypeError(f"recorder: {self.__name__} launched without argument {name!r}")
            v = bound[name]
            if p.is_constexpr:
                consts[name] = v
            else:
                sig[name] = mangle_type(v)
        out.append(
            Launch(
                self,
                tuple(sorted(sig.items())),
                tuple(sorted(consts.items())),
                tuple(sorted((k, v) for k, v in options.items() if k not in IGNORED_OPTIONS)),
            )
        )

    JITFunction.run = record
    try:
        yield out
    finally:
        JITFunction.run = orig


def _fake_inputs(case):
    """``profiles.CaseInputs`` of ``case`` as fake CUDA tensors (call inside ``FakeTensorMode``): the stored
    layouts' shapes and dtypes on device ``cuda``, no data."""
    from flint_moe.conformance.inputs.pertoken import PERTOKEN_PATHS
    from flint_moe.conformance.inputs.profiles import CaseInputs

    E, H, I, Ip, M = case.E, case.H, case.I, case.Ip, case.M  # noqa: E741

    def t(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="cuda")

    if case.path in PERTOKEN_PATHS:
        return _fake_pertoken_inputs(case, t)
    notes = {"top_k": case.k, "injected_row_maps": True}  # fake maps hold no values to check
    if case.path.startswith("nvfp4"):
        from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights
        from flint_moe.layouts.swizzle import swizzled_scale_shape

        stored = FlintMoEWeights(
            w1=t(E, 2 * Ip, H // 2, dtype=torch.uint8),
            w1_sf_swizzled=t(E, *swizzled_scale_shape(2 * Ip, H // 16), dtype=torch.float8_e4m3fn),
            w1_alpha=t(E, dtype=torch.float32),
            w2=t(E, H, Ip // 2, dtype=torch.uint8),
            w2_sf_swizzled=t(E, *swizzled_scale_shape(H, Ip // 16), dtype=torch.float8_e4m3fn),
            w2_alpha=t(E, dtype=torch.float32),
            valid_intermediate=I,
        )
    else:
        stored = (t(E, H // 64, 2 * Ip, 64), t(E, Ip // 64, H, 64), (t(2 * Ip, dtype=torch.int32),
                  t(H, dtype=torch.int32)))  # fmt: skip
    return CaseInputs(t(M, H), t(E, H), t(M, H), None, stored, notes)


def _fake_pertoken_inputs(case, t):
    """``inputs.pertoken.build_pertoken_inputs`` of ``case`` as fake tensors made by ``t(*shape, dtype=)``: the
    ``RoutedNVFP4Weights`` stacks' padded shapes (``layouts.routed_nvfp4``), the routing map and probabilities,
    and the dispatcher profile's rank offset and token capacity (its pre-filled ``out`` left out: the same
    launches write the op's own output)."""
    from flint_moe.conformance.inputs.pertoken import PERTOKEN_PATHS
    from flint_moe.conformance.inputs.profiles import CaseInputs
    from flint_moe.layouts._core import round_up
    from flint_moe.layouts.routed_nvfp4 import ROUTED_ALIGNMENT, RoutedNVFP4Weights
    from flint_moe.layouts.swizzle import mma_view

    E, H, I, M, k = case.E, case.H, case.I, case.M, case.k  # noqa: E741
    act = PERTOKEN_PATHS[case.path]
    hp, ip = round_up(H, ROUTED_ALIGNMENT), round_up(I, ROUTED_ALIGNMENT)
    n1 = 2 * ip if act == "swiglu" else ip
    s1, s2 = t(E, n1, hp // 16, dtype=torch.float8_e4m3fn), t(E, hp, ip // 16, dtype=torch.float8_e4m3fn)
    stored = RoutedNVFP4Weights(
        H, I, hp, ip, act == "swiglu", t(E, n1, hp // 2, dtype=torch.uint8), s1, mma_view(s1, name="fc1_scale"),
        t(E, dtype=torch.float32), t(E, hp, ip // 2, dtype=torch.uint8), s2, mma_view(s2, name="fc2_scale"),
        t(E, dtype=torch.float32),
    )  # fmt: skip
    disp = case.profile == "dispatcher"
    notes = {
        "top_k": k, "routing_map": t(M, k, dtype=torch.int32), "probabilities": t(M, k, dtype=torch.float32),
        "num_experts": 2 * E if disp else E, "local_expert_offset": E if disp else 0,
        "token_capacity": M - M // 4 if disp else None, "activation": act,
        "out_init": None,  # fake tensors share address 0, which the op's overlap check of ``out=`` refuses
    }  # fmt: skip
    return CaseInputs(t(M, H), t(E, H), t(M, H), None, stored, notes)


#: The op path each module path runs (``modules.FlintNvfp4Experts.forward`` calls ``ops.flint_moe``,
#: ``modules.FlintBf16DecodeMoE.forward`` calls ``ops.flint_moe_bf16_decode``, default configurations; the
#: modules only load / repack the weights, and pass their own route counter and shared output).
_MODULE_OP_PATH = {"nvfp4_module": "nvfp4_decode", "bf16_module": "bf16_decode"}


def _fake_row_slicing(getitem):
    """``Tensor.__getitem__`` that takes basic slicing ``t[a:b, ..., :c]`` (unit steps) as ``narrow`` per dimension (the
    same view): indexing a fake CUDA tensor needs a CUDA build of PyTorch, narrowing does not."""

    def item(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if parts.count(Ellipsis) == 1 and len(parts) <= self.dim() + 1:
            i = parts.index(Ellipsis)
            parts = parts[:i] + (slice(None),) * (self.dim() - len(parts) + 1) + parts[i + 1 :]
        if not all(isinstance(p, slice) and p.step in (None, 1) for p in parts) or len(parts) > self.dim():
            return getitem(self, index)
        out = self
        for d, p in enumerate(parts):
            start, stop, _ = p.indices(out.shape[d])
            out = out.narrow(d, start, max(stop - start, 0))
        return out

    return item


def _shape_only_permute(ids, num_experts, block_m, tail=0):
    """``moe_permute`` (pure torch, no Triton kernel) reduced to its outputs' shapes: its index arithmetic
    needs a real device, and the grouped launchers read only the sizes, ``block_m`` and ``tail`` on the host."""
    from flint_moe.kernels.nvfp4.permute import MoEPermutation, num_blocks_bound

    m, k = ids.shape
    nb = num_blocks_bound(m * k, num_experts, block_m, tail)

    def i32(n):
        return torch.empty(n, dtype=torch.int32, device=ids.device)

    return MoEPermutation(i32(m * k), i32(num_experts + 1), i32(nb), i32(nb), i32(nb), num_experts, int(k), block_m,
                          tail)  # fmt: skip


def _case_launches(case, counter) -> list[Launch]:
    """The launches of every run the conformance harness makes for ``case``: the compared run (taps), the
    production build (determinism / row independence / CUDA-graph replays: taps None), each row alone at M = 1
    (``invariance.batch_invariance``, taps; the grouped path keeps its op at M = 1, with a smaller row block),
    and, for a non-default configuration, the default path at the same M (``mutation``: ``PATHS[case.path]``)."""
    from dataclasses import replace

    import flint_moe.ops.moe_nvfp4_grouped as grouped_op
    import flint_moe.ops.moe_pertoken as pertoken_op
    from flint_moe.conformance.run.paths import PATHS, path_for

    run_case = case
    if case.path in _MODULE_OP_PATH:
        run_case = replace(case, path=_MODULE_OP_PATH[case.path], profile="gaussian")
    path = path_for(run_case)
    inputs = _fake_inputs(case)
    runs = [(path, inputs, {}), (path, inputs, None)]
    if case.M >= 2:
        runs.append((path, _fake_inputs(replace(case, M=1, route=None)), {}))
    if run_case.config != "default":
        runs.append((PATHS[run_case.path], inputs, {}))
    launches: list[Launch] = []
    with (
        _recording(launches),
        _patched(grouped_op, "moe_permute", _shape_only_permute),
        _patched(pertoken_op, "moe_permute", _shape_only_permute),
        _patched(torch.Tensor, "__getitem__", _fake_row_slicing(torch.Tensor.__getitem__)),
    ):
        for p, inp, taps in runs:
            p.fn(inp, counter, taps)
    return launches


def matrix_launches(profiles: Sequence[str] = ("gpu", "cpu")) -> dict[tuple, tuple[Launch, list[str]]]:
    """Distinct launches (``launch_key`` -> (first ``Launch``, ids of the cases that launch it)) of every case
    of ``cases.matrix(p)`` for ``p`` in ``profiles``. Raises RuntimeError under TRITON_INTERPRET=1 and any
    error a launcher raises for a case (with the case id)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flint_moe.conformance.inputs.block import BLOCK_PATHS
    from flint_moe.conformance.inputs.cases import matrix

    _check_not_interpreted()
    out: dict[tuple, tuple[Launch, list[str]]] = {}
    with FakeTensorMode():
        counter = torch.zeros(64, dtype=torch.int32, device="cuda")
        for profile in profiles:
            for case in matrix(profile):
                if case.path in BLOCK_PATHS:  # CuTe DSL kernels + the ll router: audited by their own specs
                    continue
                try:
                    launches = _case_launches(case, counter)
                except Exception as e:
                    raise RuntimeError(f"matrix_launches: case {case.id}: {type(e).__name__}: {e}") from e
                for ln in launches:
                    entry = out.setdefault(ln.key, (ln, []))
                    entry[1].append(case.id)
    return out


def _kernel_ref(kernel: Any) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__}:{fn.__name__}"


def _resolve_kernel(ref: str) -> Any:
    import importlib

    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


_TAG_KEYS = ("H", "IP", "INTER", "TOPK", "EP2", "BM", "BN", "BH", "MMA", "TAP")


def _spec_name(ln: Launch) -> str:
    consts = dict(ln.constexprs)
    tags = [f"{k}{int(consts[k])}" for k in _TAG_KEYS if k in consts]
    digest = hashlib.sha1(repr(ln.key).encode()).hexdigest()[:10]
    return ".".join(["matrix", ln.kernel_name, *tags, digest])


#: The instructions that tell the NVFP4 decode kernels' two paths apart, as their ``audit_specs()`` pick them:
#: ``*(MMA_PTX if cfg["MMA"] else ["mul.rn.f16x2"])`` (flint_moe/kernels/nvfp4/gate_up.py, down_combine.py).
_CUDA_CORE_PTX = ("mul.rn.f16x2",)


def _swap_path(require: tuple, mma: bool) -> tuple:
    from flint_moe.kernels.nvfp4.gate_up import MMA_PTX

    drop = set(MMA_PTX) | set(_CUDA_CORE_PTX)
    return tuple(r for r in require if r not in drop) + tuple(MMA_PTX if mma else _CUDA_CORE_PTX)


def _rule_lists(kernel: Any, constexprs: dict, specs: dict) -> tuple[tuple, tuple]:
    """(require, forbid) of ``kernel``'s own registered specs (a kernel's rule instructions do not depend on its
    sizes). For a kernel with a ``GATED`` constexpr, the specs with the same ``GATED`` value; with an ``MMA``
    constexpr, the specs with the same ``MMA`` value; when its module audits
    only the other path, that path's list with the path instructions swapped as the module's ``audit_specs()``
    swaps them (``_swap_path``). Raises LookupError when the kernel module registers no spec for this kernel or
    its specs disagree."""
    fn = getattr(kernel, "fn", kernel)
    own = [s for s in specs.values() if getattr(s.kernel, "fn", s.kernel) is fn and not s.name.startswith("matrix.")]
    if "GATED" in constexprs:  # the activation's instructions (SwiGLU's sigmoid) depend on it
        own = [s for s in own if bool(s.constexprs.get("GATED")) == bool(constexprs["GATED"])]
    lists = {(s.require, s.forbid) for s in own}
    if "MMA" in constexprs:
        mma = bool(constexprs["MMA"])
        same = {(s.require, s.forbid) for s in own if bool(s.constexprs.get("MMA")) == mma}
        lists = same or {(_swap_path(r, mma), f) for r, f in lists}
    if not lists:
        raise LookupError(
            f"{_kernel_ref(kernel)}: the conformance matrix launches it but its module's audit_specs() registers "
            "no specialisation to take the required / forbidden instructions from"
        )
    if len(lists) > 1:
        raise LookupError(f"{_kernel_ref(kernel)}: its registered specs disagree on require / forbid: {lists}")
    return lists.pop()


def matrix_spec_records(profiles: Sequence[str] = ("gpu", "cpu")) -> list[dict]:
    """JSON-able records of every distinct matrix launch no kernel-module spec covers: ``name``, ``kernel``
    ("module:function"), ``signature``, ``constexprs``, ``options``, ``require``, ``forbid``, ``cases`` (how many
    matrix cases launch it) and ``example`` (the first such case id). Sorted by name."""
    from flint_moe.kernels.audit.registry import collect_audit_specs

    specs = {n: s for n, s in collect_audit_specs().items() if not n.startswith("matrix.")}
    out = []
    for ln, ids in uncovered_launches(matrix_launches(profiles), specs).values():
        consts = dict(ln.constexprs)
        require, forbid = _rule_lists(ln.kernel, consts, specs)
        out.append(
            {
                "name": _spec_name(ln),
                "kernel": _kernel_ref(ln.kernel),
                "signature": dict(ln.signature),
                "constexprs": consts,
                "options": {k: v for k, v in _norm_options(dict(ln.options)) if k != "enable_fp_fusion"},
                "require": [list(r) if isinstance(r, tuple) else r for r in require],
                "forbid": list(forbid),
                "cases": len(ids),
                "example": ids[0],
            }
        )
    return sorted(out, key=lambda r: r["name"])


def register_records(records: Iterable[dict]) -> list[str]:
    """Register ``matrix_spec_records`` entries through ``audit.registry.register_audit``; returns their names."""
    from flint_moe.kernels.audit.registry import register_audit

    names = []
    for r in records:
        register_audit(
            r["name"],
            _resolve_kernel(r["kernel"]),
            r["signature"],
            r["constexprs"],
            [tuple(x) if isinstance(x, list) else x for x in r["require"]],
            r["forbid"],
            options=r["options"],
        )
        names.append(r["name"])
    return names


def register_matrix_audit(profiles: Sequence[str] = ("gpu", "cpu")) -> list[str]:
    """Derive the matrix's uncovered specialisations (``matrix_spec_records``) and register them."""
    return register_records(matrix_spec_records(profiles))


def collect_all_specs() -> dict:
    """The kernel modules' registry (``audit.registry.collect_audit_specs``) plus ``register_matrix_audit()``'s
    specs."""
    from flint_moe.kernels.audit.registry import collect_audit_specs

    collect_audit_specs()
    register_matrix_audit()
    return collect_audit_specs()


def uncovered_launches(launches: dict, specs: dict) -> dict[tuple, tuple[Launch, list[str]]]:
    """The entries of ``launches`` (``matrix_launches``) whose key no spec of ``specs`` (name -> AuditSpec) has."""
    covered = {spec_key(s) for s in specs.values()}
    return {k: v for k, v in launches.items() if k not in covered}


def _audit_names(specs: dict, names: Sequence[str]) -> dict[str, list[str]]:
    from flint_moe.kernels.audit.ptx import audit_ptx, compile_ptx_sm90

    out = {}
    for n in names:
        if n not in specs:
            raise KeyError(f"audit: no audit specialisation named {n!r}")
        s = specs[n]
        out[n] = audit_ptx(compile_ptx_sm90(s.kernel, s.signature, s.constexprs, s.options), s.require, s.forbid)
    return out


def coverage_report(profiles: Sequence[str] = ("gpu", "cpu")) -> dict:
    """Everything the CI test needs from one derivation (JSON-able): ``records`` (``matrix_spec_records``),
    ``uncovered`` (matrix launches that neither a kernel-module spec nor a record covers once the records have
    gone through JSON and ``register_records``; must be empty), ``cases`` (number of matrix cases),
    ``silent_cases`` (ids of cases that launched no kernel), ``kernels_by_path`` (path -> kernel names its cases
    launch), ``per_kernel`` (kernel -> [distinct launches, covered by kernel-module specs, module specs])."""
    from flint_moe.conformance.inputs.cases import matrix
    from flint_moe.kernels.audit.registry import collect_audit_specs

    module_specs = {n: s for n, s in collect_audit_specs().items() if not n.startswith("matrix.")}
    launches = matrix_launches(profiles)
    records = matrix_spec_records(profiles)
    register_records(json.loads(json.dumps(records)))
    left = uncovered_launches(launches, collect_audit_specs())
    ids = [c.id for p in profiles for c in matrix(p)]
    launched: dict[str, set] = {}
    by_path: dict[str, set] = {}
    for ln, case_ids in launches.values():
        for cid in case_ids:
            launched.setdefault(cid, set()).add(ln.kernel_name)
            by_path.setdefault(cid.split("/", 1)[0], set()).add(ln.kernel_name)
    module_keys = {spec_key(s) for s in module_specs.values()}
    per_kernel: dict[str, list[int]] = {}
    for key, (ln, _) in launches.items():
        row = per_kernel.setdefault(ln.kernel_name, [0, 0, 0])
        row[0] += 1
        row[1] += key in module_keys
    for s in module_specs.values():
        row = per_kernel.setdefault(_kernel_name(s.kernel), [0, 0, 0])
        row[2] += 1
    return {
        "records": records,
        "uncovered": [
            {"kernel": ln.kernel_name, "constexprs": dict(ln.constexprs), "cases": c[:3]} for ln, c in left.values()
        ],  # fmt: skip
        "cases": len(ids),
        "silent_cases": [cid for cid in ids if cid not in launched],
        "kernels_by_path": {p: sorted(k) for p, k in sorted(by_path.items())},
        "per_kernel": dict(sorted(per_kernel.items())),
    }


_USAGE = (
    "usage: python -m flint_moe.conformance.audit specs | report | list | uncovered | audit [--specs FILE] NAME...\n"
    "  specs      JSON records of the matrix launches no kernel-module spec covers (matrix_spec_records)\n"
    "  report     JSON coverage_report()\n"
    "  list       JSON names of every spec (kernel modules' + matrix)\n"
    "  uncovered  JSON of the matrix launches no registered spec covers (exit 1 if any)\n"
    "  audit      compile NAME... for sm_90 and audit the PTX (JSON name -> problems; exit 1 on problems);\n"
    "             --specs FILE: take the matrix records from FILE (output of `specs`) instead of re-deriving them"
)


def _main(argv: Sequence[str]) -> int:
    from flint_moe.kernels.audit.registry import collect_audit_specs

    if not argv or argv[0] not in ("specs", "report", "list", "uncovered", "audit"):
        print(_USAGE, file=sys.stderr)
        return 2
    try:
        _check_not_interpreted()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    cmd, args = argv[0], list(argv[1:])
    if cmd == "specs":
        print(json.dumps(matrix_spec_records()))
        return 0
    if cmd == "report":
        print(json.dumps(coverage_report(), default=str))
        return 0
    if cmd == "list":
        print(json.dumps(sorted(collect_all_specs())))
        return 0
    if cmd == "uncovered":
        # the records go through JSON, as the audit subprocesses receive them
        register_records(json.loads(json.dumps(matrix_spec_records())))
        left = uncovered_launches(matrix_launches(), collect_audit_specs())
        rows = [{"kernel": ln.kernel_name, "constexprs": dict(ln.constexprs), "signature": dict(ln.signature),
                 "options": dict(ln.options), "cases": ids[:3]} for ln, ids in left.values()]  # fmt: skip
        print(json.dumps(rows, default=str))
        return 1 if rows else 0
    if args[:1] == ["--specs"]:
        if len(args) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        with open(args[1]) as f:
            register_records(json.load(f))
        args = args[2:]
        specs = collect_audit_specs()
    else:
        specs = collect_all_specs()
    result = _audit_names(specs, args)
    print(json.dumps(result))
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    # through the package module, so that the registry is the one the kernel modules register into
    from flint_moe.conformance.audit import _main as _package_main

    sys.exit(_package_main(sys.argv[1:]))
