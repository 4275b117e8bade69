"""sm_90 PTX audit of every kernel specialisation the conformance matrix launches (on the CPU, in CI).

The kernel modules register hand-picked specialisations (``flint_moe.kernels.audit.registry.AUDIT_REGISTRY``, each
module's ``audit_specs()``). This module derives the specialisations from the matrix itself, so that a new
shape, top_k, expert count or launch configuration in ``cases.matrix`` cannot slip past the audit:

- ``matrix_launches(profiles)`` runs every case of ``cases.matrix("gpu")`` and ``cases.matrix("cpu")`` (every
  path and ``cases.PATH_CONFIGS`` entry) through the same op / launcher calls as
  ``flint_moe.conformance.run.paths`` does, as the harness runs it (``_case_launches``: with taps, the TAP builds
  the conformance run compares and its invariance reruns; without, the production builds its production-build /
  CUDA-graph checks run; each row alone at M = 1 for batch invariance), plus, with ``"gpu"``, the cases the
  mutation self-test runs on CUDA (``self_test_cases``: the default path with taps), on fake CUDA tensors of the
  case's real sizes (``torch._subclasses.fake_tensor.FakeTensorMode``: device ``cuda``, no data, no GPU), with
  ``JITFunction.run`` replaced by a recorder: no kernel compiles or runs; each ``kernel[grid](...)`` launch is
  recorded as a ``Launch`` (kernel, argument types, constexpr values, compile options) exactly as the launcher
  computed them on a CUDA device (default configs, K-splits, warps, register caps, ...). Two stand-ins:
  ``moe_permute`` (pure torch, no kernel) returns its outputs' shapes only, and the module paths run the op
  their ``forward`` calls (the fake inputs and stand-ins: ``conformance.audit_fakes``). The decode block's
  cases record its Triton router kernel; its CuTe DSL kernels are listed from their plans by
  ``conformance.audit_block`` and audited by tests/kernels/test_cute_ptx.py.
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
    "self_test_cases",
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


def _case_launches(case, counter) -> list[Launch]:
    """The launches of every run the conformance harness makes for ``case`` (``runner.run_case`` with the
    invariances, ``invariance.check_invariances``): the compared run and its determinism / row-independence
    reruns (taps), the production build (``production_build`` and the CUDA-graph capture: taps None), and each
    row alone at M = 1 (``batch_invariance``, taps; the grouped path keeps its op at M = 1, with a smaller row
    block), all through the case's configuration (``paths.path_for``). The per-token paths take their routing
    as an input of M rows and skip the batch invariance: no M = 1 run. A decode-block case records its router
    kernel in both builds (the router's constexprs do not depend on M; the CuTe DSL expert kernels are
    ``audit_block``'s). The mutation self-test's runs are :func:`_self_test_launches`."""
    from dataclasses import replace

    from flint_moe.conformance.audit_fakes import MODULE_OP_PATH, fake_block_router, fake_inputs
    from flint_moe.conformance.inputs.block import BLOCK_PATHS
    from flint_moe.conformance.inputs.pertoken import PERTOKEN_PATHS
    from flint_moe.conformance.run.paths import path_for

    launches: list[Launch] = []
    if case.path in BLOCK_PATHS:
        with _recording(launches):
            for taps in ({}, None):
                fake_block_router(case, counter, taps)
        return launches
    run_case = case
    if case.path in MODULE_OP_PATH:
        run_case = replace(case, path=MODULE_OP_PATH[case.path], profile="gaussian")
    path = path_for(run_case)
    inputs = fake_inputs(case)
    runs = [(path, inputs, {}), (path, inputs, None)]
    if case.M >= 2 and case.path not in PERTOKEN_PATHS:
        runs.append((path, fake_inputs(replace(case, M=1, route=None)), {}))
    with _fake_run_patches(launches):
        for p, inp, taps in runs:
            p.fn(inp, counter, taps)
    return launches


def _h200_capability(device=None) -> tuple[int, int]:
    """The fake CUDA device's compute capability: the H200's (9, 0), so the launchers pick the kernels (engine,
    build) they pick there."""
    del device
    return (9, 0)


def _h200_properties(device=None):
    """The fake CUDA device's properties the launchers read: the H200's 132 SMs (a persistent grid's size)."""
    del device
    from types import SimpleNamespace

    return SimpleNamespace(multi_processor_count=132, major=9, minor=0, name="NVIDIA H200")


@contextlib.contextmanager
def _fake_run_patches(launches: list[Launch]):
    """The recorder plus the stand-ins the ops need on fake tensors (``conformance.audit_fakes``)."""
    import flint_moe.ops.moe_nvfp4_grouped as grouped_op
    import flint_moe.ops.moe_pertoken as pertoken_op
    from flint_moe.conformance.audit_fakes import fake_row_slicing, shape_only_permute

    with (
        _recording(launches),
        _patched(grouped_op, "moe_permute", shape_only_permute),
        _patched(pertoken_op, "moe_permute", shape_only_permute),
        _patched(torch.Tensor, "__getitem__", fake_row_slicing(torch.Tensor.__getitem__)),
        _patched(torch.cuda, "get_device_capability", _h200_capability),
        _patched(torch.cuda, "get_device_properties", _h200_properties),
    ):
        yield


def self_test_cases() -> list:
    """The cases the gpu profile's mutation self-test (``mutation.self_test``) runs on CUDA, each once, in
    order: the case ``m.case("cuda")`` of every catalogued mutation ``run_mutations`` runs there (not the
    paths of ``cases.GPU_PENDING_PATHS``), without the decode block's (its Triton router at the block's
    shapes is recorded from the matrix, its CuTe DSL kernels are ``audit_block``'s), then the sub-bound cases
    (``subbound.SUB_BOUND_CASES["cuda"]``)."""
    from flint_moe.conformance.inputs.block import BLOCK_PATHS
    from flint_moe.conformance.inputs.cases import GPU_PENDING_PATHS, Case
    from flint_moe.conformance.judge.mutation import MUTATIONS
    from flint_moe.conformance.judge.subbound import SUB_BOUND_CASES

    out: dict[str, Any] = {}
    for m in MUTATIONS:
        if m.path not in BLOCK_PATHS and m.path not in GPU_PENDING_PATHS:
            c = m.case("cuda")
            out.setdefault(c.id, c)
    for cid in SUB_BOUND_CASES["cuda"]:
        out.setdefault(cid, Case.from_id(cid))
    return list(out.values())


def _self_test_launches(case, counter) -> list[Launch]:
    """The launches of a self-test run of ``case``: the default path (``paths.PATHS[case.path]``) with taps,
    as ``mutation.run_mutation`` (clean and weights / path injected runs: the same shapes) and
    ``subbound.run_sub_bound`` run it."""
    from flint_moe.conformance.audit_fakes import fake_inputs
    from flint_moe.conformance.run.paths import PATHS

    launches: list[Launch] = []
    with _fake_run_patches(launches):
        PATHS[case.path].fn(fake_inputs(case), counter, {})
    return launches


def matrix_launches(profiles: Sequence[str] = ("gpu", "cpu")) -> dict[tuple, tuple[Launch, list[str]]]:
    """Distinct launches (``launch_key`` -> (first ``Launch``, ids of the cases that launch it)) of every case
    of ``cases.matrix(p)`` for ``p`` in ``profiles``, and with ``"gpu"`` of ``cases.pending_gpu_cases()`` (the
    paths that run beside the gpu profile until their first committed H200 run) and of the mutation self-test's
    CUDA cases (:func:`self_test_cases`, those not already recorded). Raises RuntimeError under
    TRITON_INTERPRET=1 and any error a launcher raises for a case (with the case id)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flint_moe.conformance.inputs.cases import matrix, pending_gpu_cases

    _check_not_interpreted()
    out: dict[tuple, tuple[Launch, list[str]]] = {}
    with FakeTensorMode():
        counter = torch.zeros(64, dtype=torch.int32, device="cuda")
        seen: set[str] = set()
        for profile in profiles:
            runs = [(c, _case_launches) for c in [*matrix(profile), *(pending_gpu_cases() if profile == "gpu" else [])]]
            if profile == "gpu":
                runs += [(c, _self_test_launches) for c in self_test_cases()]
            for case, record in runs:
                if record is _self_test_launches and case.id in seen:
                    continue  # a matrix case of the default configuration: the same tapped run, already recorded
                seen.add(case.id)
                try:
                    launches = record(case, counter)
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
    tags = [f"{k}{int(consts[k])}" for k in _TAG_KEYS if isinstance(consts.get(k), int)]  # not a Gluon layout
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
    sizes). For a kernel with a ``GATED`` (or ``GATE_UP``: one kernel for both GEMMs) constexpr, the specs with the
    same value; with an ``MMA``
    constexpr, the specs with the same ``MMA`` value; when its module audits
    only the other path, that path's list with the path instructions swapped as the module's ``audit_specs()``
    swaps them (``_swap_path``). Raises LookupError when the kernel module registers no spec for this kernel or
    its specs disagree."""
    fn = getattr(kernel, "fn", kernel)
    own = [s for s in specs.values() if getattr(s.kernel, "fn", s.kernel) is fn and not s.name.startswith("matrix.")]
    for flag in ("GATED", "GATE_UP"):  # the activation's instructions (SwiGLU's sigmoid) depend on it
        if flag in constexprs:
            own = [s for s in own if bool(s.constexprs.get(flag)) == bool(constexprs[flag])]
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
    matrix cases launch it), ``example`` (the first such case id) and ``layouts`` (the names of the constexprs that
    are Gluon layouts, left out of ``constexprs``: ``register_records`` has the kernel's module rebuild them). Sorted
    by name."""
    from flint_moe.kernels.audit.registry import collect_audit_specs

    specs = {n: s for n, s in collect_audit_specs().items() if not n.startswith("matrix.")}
    out = []
    for ln, ids in uncovered_launches(matrix_launches(profiles), specs).values():
        consts = dict(ln.constexprs)
        require, forbid = _rule_lists(ln.kernel, consts, specs)
        layouts = sorted(k for k, v in consts.items() if not isinstance(v, (bool, int, float, str, type(None))))
        out.append(
            {
                "name": _spec_name(ln),
                "kernel": _kernel_ref(ln.kernel),
                "signature": dict(ln.signature),
                "constexprs": {k: v for k, v in consts.items() if k not in layouts},
                "layouts": layouts,
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
        kernel, consts = _resolve_kernel(r["kernel"]), dict(r["constexprs"])
        if r.get("layouts"):  # a Gluon kernel's layout constexprs, rebuilt by its module as its launchers build them
            import importlib

            made = importlib.import_module(kernel.fn.__module__).layout_constexprs(consts)
            if sorted(made) != sorted(r["layouts"]):
                raise ValueError(f"register_records: {r['name']}: layouts {sorted(made)} != {r['layouts']}")
            consts.update(made)
        register_audit(
            r["name"],
            kernel,
            r["signature"],
            consts,
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
