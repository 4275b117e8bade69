"""Mutation testing of the harness itself.

Every catalogued fault (``faults.FAULTS``) is injected into a kernel path on a small case (cpu-sized, one M,
the Triton interpreter without a GPU); the harness (``stages.compare_case`` + ``faults.diagnose``) must FAIL
the case (the fault is *killed*) and name the fault (*named*). Three ways of injecting, chosen per fault
(implemented in :mod:`flint_moe.conformance.judge.injections`):

* ``weights``: the kernel reads tampered stored weights, equal to what a kernel with the layout fault reads
  from the correct ones: the faulty logical checkpoint is built on the KERNEL side (production layout code,
  ``flint_moe.layouts``, and byte-level edits; not ``faults.py``'s golden decoders) and converted with
  ``FlintMoEWeights.from_modelopt``. The harness still sees the correct stored weights.
* ``path``: the path function is wrapped (BF16 decode: the row maps the kernel reads are replaced by those
  of the faulty layout).
* ``tap``: the kernel runs cleanly; its taps are post-processed at the faulty stage by an independent
  implementation of the faulty rule, and every later stage (and the returned output) is re-simulated with
  the golden model, as the faulty kernel would go on to produce them.

Faults whose effect is rare on random data run on crafted inputs (``prepare``): ``exact_sigmoid`` on tokens
scaled so that the gate values fall in (-103, -87), where ``rcp.approx.ftz`` flushes a subnormal ``r`` to 0
while the exact sigmoid does not; ``renorm_reverse_order`` on router logits found by a deterministic search
where the reverse-order sum flips a bf16 rounding of a routing weight; ``renorm_no_eps`` on the
``tiny_sigmoids`` profile; the top-k faults on ``tied_logits``.

``run_mutations(mutations=None) -> list[MutationResult]``; ``mutation_report(results) -> dict`` is the
report.json block (docs/ARCHITECTURE.md, section 2).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from flint_moe.conformance.inputs.block import BLOCK_PATHS
from flint_moe.conformance.inputs.cases import GPU_PENDING_PATHS, SHAPES, Case, ShapeSpec
from flint_moe.conformance.judge.block import compare_block_case
from flint_moe.conformance.judge.block_injections import BLOCK_INJECTIONS, BLOCK_PREPARE, resimulate_block
from flint_moe.conformance.judge.faults import FAULTS, FAULTS_BY_NAME, diagnose
from flint_moe.conformance.judge.injections import (
    _EPS,
    PREPARE,
    _clone,
    _combine_bf16,
    _combine_unrounded,
    _ids_ties_high,
    _p_maps,
    _rcp_form,
    _resimulate,
    _seq_sum,
    _tap_act,
    _tap_ids,
    _tap_out,
    _tap_weights,
    _tap_y,
    _w_halves_nv,
    _w_interleave,
    _w_nibbles,
    _w_swizzle,
)
from flint_moe.conformance.judge.results import FAIL
from flint_moe.conformance.judge.stages import compare_case
from flint_moe.reference.experts import (
    swiglu,
)
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.routing import topk_total_order

__all__ = [
    "MUTATION_SHAPES",
    "Mutation",
    "MutationResult",
    "MUTATIONS",
    "run_mutation",
    "run_mutations",
    "mutation_report",
    "self_test",
]

#: Small shapes of the mutation cases (keys: a path, or a path and a variant): the smallest NVFP4 cpu shape,
#: one with Ip % 128 == 0 (so the 128-row interleave fault applies), a BF16 one (2I and H multiples of the
#: 32-row shuffle block, H of the 64-element BlockMajorK block); ``<key>@cuda``: the shape a mutation takes on the
#: GPU instead.
MUTATION_SHAPES = {
    "nvfp4_decode": ShapeSpec("cpu-E6-H96-I64-k3", 6, 96, 64, 3),
    "nvfp4_decode_i128": ShapeSpec("mut-E6-H96-I128-k3", 6, 96, 128, 3),
    "bf16_decode": ShapeSpec("mut-E6-H128-I64-k3", 6, 128, 64, 3),
    "nvfp4_grouped": ShapeSpec("cpu-E6-H96-I64-k3", 6, 96, 64, 3),
    # on the GPU reductions of two K steps of 128 in both GEMMs, so that the faults reach the engine the default
    # takes there at these row blocks (the Gluon kernels, ``grouped_gate_up.default_engine``)
    "nvfp4_grouped@cuda": ShapeSpec("mut-E6-H256-I256-k3", 6, 256, 256, 3),
    # the decode block: the scaled-down DeepSeek-V3 layer (H % 128 and SI % 64, as the shared linears need) for
    # the CPU stand-in; on the GPU Ling-mini-2.0, whose H, I and SI are multiples of 512 (the CuTe split-K
    # kernels' lane blocking, docs/kernels/ll-block.md)
    "ll_block": SHAPES["cpu-deepseek-v3"],
    "ll_block@cuda": SHAPES["ling-mini-2.0"],
    "nvfp4_pertoken_swiglu": ShapeSpec("pt-cpu-E5-H160-I176-P256-k3", 5, 160, 176, 3, 256),
    "nvfp4_pertoken_relu2": ShapeSpec("pt-cpu-E5-H160-I176-P256-k3", 5, 160, 176, 3, 256),
}
M_TOKENS = 2


@dataclass(frozen=True)
class Mutation:
    """One injected fault: ``fault`` (a ``faults.FAULTS`` name), ``path``, ``profile`` (data profile),
    ``injection`` ("weights" | "path" | "tap"), ``inject`` (weights / path: ``inject(case, inputs) ->
    inputs for the kernel``; tap: ``inject(case, inputs, taps) -> stage name``, mutating ``taps`` in place),
    ``prepare`` (a ``injections.PREPARE`` key of crafted inputs, or ""), ``shape`` (a :data:`MUTATION_SHAPES` key;
    default the path)."""

    fault: str
    path: str
    profile: str
    injection: str
    inject: Callable
    prepare: str = ""
    shape: str = ""

    def case(self, device=None) -> Case:
        """The mutation's case; on a CUDA ``device`` the ``<key>@cuda`` shape where :data:`MUTATION_SHAPES` has
        one (kernels whose limits the CPU-sized shape does not meet)."""
        key = self.shape or self.path
        if device is not None and torch.device(device).type == "cuda" and f"{key}@cuda" in MUTATION_SHAPES:
            key = f"{key}@cuda"
        return Case.make(self.path, MUTATION_SHAPES[key], M_TOKENS, self.profile)

    @property
    def case_id(self) -> str:
        return self.case_id_on(None)

    def case_id_on(self, device) -> str:
        """The case id (plus ``+<prepare>`` for crafted inputs) of the mutation's case on ``device``."""
        return self.case(device).id + (f"+{self.prepare}" if self.prepare else "")


@dataclass
class MutationResult:
    """Outcome of one mutation.

    Fields: fault (its catalogue name; also written as ``name``), path, case_id, injection;
    killed (the harness FAILed the case); named (``diagnose`` named this fault); verdict (case verdict);
    failed_stages; diagnosis (every fault ``diagnose`` named); note (e.g. "fault invisible on this data",
    or other faults named alongside).
    """

    fault: str
    path: str
    case_id: str
    injection: str
    killed: bool = False
    named: bool = False
    verdict: str = ""
    failed_stages: list[str] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict:
        """JSON-ready dict: every field, plus ``name`` (= ``fault``)."""
        d = asdict(self)
        d["name"] = self.fault
        return d


# ---------------------------------------------------------------------------------------------------------
# the catalogue of mutations
# ---------------------------------------------------------------------------------------------------------

_NV, _BF, _GR = "nvfp4_decode", "bf16_decode", "nvfp4_grouped"


def _muts() -> tuple[Mutation, ...]:
    act_swap = _tap_act(lambda g, u: swiglu(u, g))
    act_twice = _tap_act(lambda g, u: to_bf16(u * to_bf16(g * _rcp_form(g)).float()))
    act_exact = _tap_act(lambda g, u: to_bf16(u * (g * torch.sigmoid(g.double()).float())))
    ties = _tap_ids(_ids_ties_high)
    asc = _tap_ids(lambda lg, k: torch.sort(topk_total_order(lg, k), dim=1).values)
    no_eps = _tap_weights(lambda s: round_bf16(s / _seq_sum(s, list(range(s.shape[1])))[:, None]))
    rev = _tap_weights(lambda s: round_bf16(s / (_seq_sum(s, list(range(s.shape[1] - 1, -1, -1))) + _EPS)[:, None]))
    unrounded = _tap_weights(lambda s: s / (_seq_sum(s, list(range(s.shape[1]))) + _EPS)[:, None])
    return (
        Mutation("w13_halves_swapped", _NV, "gaussian", "weights", _w_halves_nv),
        Mutation("w13_halves_swapped", _BF, "gaussian", "path", _p_maps("halves")),
        Mutation("interleave_group_32", _NV, "gaussian", "weights", _w_interleave(32)),
        Mutation("interleave_group_128", _NV, "gaussian", "weights", _w_interleave(128), shape="nvfp4_decode_i128"),
        Mutation("scale_swizzle_missing", _NV, "gaussian", "weights", _w_swizzle("missing")),
        Mutation("scale_swizzle_transposed", _NV, "gaussian", "weights", _w_swizzle("transposed")),
        Mutation("nibble_order_swapped", _NV, "gaussian", "weights", _w_nibbles),
        Mutation("row_shuffle_missing", _BF, "gaussian", "path", _p_maps("shuffle")),
        Mutation("gate_up_swapped", _NV, "gaussian", "tap", act_swap),
        Mutation("gate_up_swapped", _BF, "gaussian", "tap", act_swap),
        Mutation("act_rounded_twice", _NV, "gaussian", "tap", act_twice),
        Mutation("act_rounded_twice", _BF, "gaussian", "tap", act_twice),
        Mutation("exact_sigmoid", _NV, "asymmetric", "tap", act_exact, "negative_gate"),
        Mutation("global_scale_after_round", _NV, "gaussian", "tap",
                 _tap_y(lambda d, gs: to_bf16(to_bf16(d).float() * gs))),
        Mutation("global_scale_missing", _NV, "gaussian", "tap", _tap_y(lambda d, gs: to_bf16(d))),
        Mutation("topk_ties_highest", _NV, "tied_logits", "tap", ties),
        Mutation("topk_ties_highest", _BF, "tied_logits", "tap", ties),
        Mutation("topk_ascending_index", _NV, "gaussian", "tap", asc, "descending"),
        Mutation("renorm_no_eps", _NV, "tiny_sigmoids", "tap", no_eps),
        Mutation("renorm_reverse_order", _NV, "gaussian", "tap", rev, "renorm_probe"),
        Mutation("routing_weights_unrounded", _NV, "gaussian", "tap", unrounded),
        Mutation("combine_bf16_accumulate", _NV, "gaussian", "tap", _tap_out(_combine_bf16)),
        Mutation("combine_bf16_accumulate", _BF, "gaussian", "tap", _tap_out(_combine_bf16)),
        Mutation("shared_added_unrounded", _NV, "gaussian", "tap", _tap_out(_combine_unrounded)),
        # the grouped path reads the same stored weights: a layout fault and two rule faults there too
        Mutation("scale_swizzle_missing", _GR, "gaussian", "weights", _w_swizzle("missing")),
        Mutation("gate_up_swapped", _GR, "gaussian", "tap", act_swap),
        Mutation("global_scale_after_round", _GR, "gaussian", "tap",
                 _tap_y(lambda d, gs: to_bf16(to_bf16(d).float() * gs))),
        # the decode block (its kernels need a GPU: on the CPU the tests give the path a stand-in kernel side)
        *(Mutation(name, "ll_block", "gaussian", "tap", fn, _LL_PREPARE.get(name, ""))
          for name, fn in BLOCK_INJECTIONS.items()),
        *_pertoken_muts(),
    )  # fmt: skip


_LL_PREPARE = {"eps_after_rsqrt": "ll_large_tokens", "rsqrt_exact": "ll_rsqrt_probe"}


def _pertoken_muts() -> tuple[Mutation, ...]:
    """The per-token paths' faults, injected into the taps (``judge/pertoken.py`` resimulates what follows)."""
    from flint_moe.conformance.judge import pertoken as P

    sw, r2 = "nvfp4_pertoken_swiglu", "nvfp4_pertoken_relu2"
    return (
        Mutation("pertoken_scale_per_tensor", sw, "gaussian", "tap", P.inject_scale_per_tensor),
        Mutation("requant_skipped", r2, "gaussian", "tap", P.inject_requant_skipped),
        Mutation("scale_after_activation", sw, "gaussian", "tap", P.inject_scale_after_activation),
        Mutation("scale_after_activation", r2, "gaussian", "tap", P.inject_scale_after_activation),
        Mutation("minus_one_not_masked", sw, "dispatcher", "tap", P.inject_minus_one_unmasked),
        Mutation("padding_not_zeroed", sw, "gaussian", "tap", P.inject_padding("x_padding")),
        Mutation("fc2_input_padding_not_zeroed", r2, "gaussian", "tap", P.inject_padding("a_padding")),
    )


MUTATIONS: tuple[Mutation, ...] = _muts()


# ---------------------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------------------


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _counter(device):
    from flint_moe.ops import make_route_counter

    return make_route_counter(device)


def _run_kernel(case, inputs, counter):
    from flint_moe.conformance.run.paths import PATHS

    taps: dict = {}
    out = PATHS[case.path].run(inputs, counter, taps)
    return taps, out


def _changed(a: dict, b: dict) -> bool:
    for name in set(a) | set(b):
        x, y = a.get(name), b.get(name)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return True
            xv = x.contiguous().view(torch.uint8) if x.is_floating_point() else x
            yv = y.contiguous().view(torch.uint8) if y.is_floating_point() else y
            if not torch.equal(xv, yv):
                return True
    return False


def run_mutation(mut: Mutation, *, cache: dict | None = None, device=None) -> MutationResult:
    """Inject ``mut`` and judge the harness: compare_case must FAIL the case and diagnose must name the fault.

    ``cache`` (a dict) keeps the clean inputs and kernel runs per case between mutations. ``device``: default
    CUDA when available, else the CPU (Triton interpreter)."""
    from flint_moe.conformance.inputs.cases import make_inputs

    cache = {} if cache is None else cache
    device = _device() if device is None else torch.device(device)
    counter = cache.get(("counter", str(device)))
    if counter is None:
        counter = cache[("counter", str(device))] = _counter(device)
    case = mut.case(device)
    key = (mut.case_id_on(device), str(device))
    if key not in cache:
        inputs = make_inputs(case, device)
        if mut.prepare:
            inputs = {**PREPARE, **BLOCK_PREPARE}[mut.prepare](case, inputs)
        cache[key] = (inputs, *_run_kernel(case, inputs, counter))
    inputs, clean_taps, clean_out = cache[key]
    res = MutationResult(mut.fault, mut.path, mut.case_id_on(device), mut.injection)
    block = case.path in BLOCK_PATHS
    if mut.injection == "tap":
        taps = _clone(clean_taps)
        after = mut.inject(case, inputs, taps)
        if after != "out":
            (resimulate_block if block else _resimulate)(case, inputs, taps, after)
        out = taps["out"]
    else:
        kin = mut.inject(case, inputs)
        taps, out = _run_kernel(case, kin, counter)
    if not _changed({**clean_taps, "_out": clean_out}, {**taps, "_out": out}):
        res.note = "fault invisible on this data (kernel output and taps unchanged)"
        return res
    if case.path.startswith("nvfp4_pertoken_"):  # its own stages, P1-P12
        from flint_moe.conformance.judge.pertoken import compare_pertoken

        cmp = compare_pertoken(case, inputs, taps, out)
    else:
        cmp = (compare_block_case if block else compare_case)(case, inputs, taps, out)
    res.verdict, res.failed_stages = cmp.verdict, cmp.failed_stages
    res.killed = cmp.verdict == FAIL
    if res.killed:
        res.diagnosis = diagnose(case, inputs, taps, out, cmp)
    names = [d.split(":")[0] for d in res.diagnosis]
    res.named = mut.fault in names
    others = [n for n in names if n != mut.fault]
    if others:
        res.note = f"also reproduced by: {', '.join(others)}"
    return res


@contextlib.contextmanager
def _faults_quiet():
    """The injected faults produce NaN / inf on purpose: numpy's RuntimeWarnings about them (the Triton
    interpreter runs on numpy) are silenced while they run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def run_mutations(mutations=None, *, device=None) -> list[MutationResult]:
    """Run ``mutations`` (default :data:`MUTATIONS`: every catalogued fault, on each path it has an injection
    for; on the CPU without the decode block's, whose kernels need a GPU; on a GPU without the paths whose kernels
    have not yet passed there, ``inputs.cases.GPU_PENDING_PATHS``) on ``device`` (default CUDA when
    available, else the CPU) and return one :class:`MutationResult` each.
    On the CPU the interpreter makes this a few minutes (each weights / path injection is a kernel run); numpy's
    warnings about the faults' NaN / inf are silenced (:func:`_faults_quiet`)."""
    cache: dict = {}
    device = _device() if device is None else torch.device(device)
    if mutations is None:
        skip = GPU_PENDING_PATHS if device.type == "cuda" else BLOCK_PATHS
        mutations = [m for m in MUTATIONS if m.path not in skip]
    with _faults_quiet():
        return [run_mutation(m, cache=cache, device=device) for m in mutations]


def mutation_report(results: list[MutationResult], sub_bound: dict | None = None) -> dict:
    """The report.json ``"mutation"`` block: killed, named, total, kill_rate (killed AND named / total),
    catalogue (every catalogued fault name), untested (catalogued faults without a mutation), results; and
    ``sub_bound`` (``subbound.sub_bound_report``: the sub-bound faults' kill rates with and without the order
    replay) when given."""
    total = len(results)
    ok = sum(r.killed and r.named for r in results)
    tested = {r.fault for r in results}
    return {
        "killed": sum(r.killed for r in results),
        "named": sum(r.named for r in results),
        "total": total,
        "kill_rate": ok / total if total else 0.0,
        "catalogue": [f.name for f in FAULTS],
        "untested": [f.name for f in FAULTS if f.name not in tested],
        "results": [r.to_json() for r in results],
        **({"sub_bound": sub_bound} if sub_bound is not None else {}),
    }


def self_test(device=None) -> dict:
    """The harness's self-test on ``device``: every catalogued fault (:func:`run_mutations`) and every
    sub-bound fault (``subbound.run_sub_bound``), as the report.json ``"mutation"`` block."""
    from flint_moe.conformance.judge.subbound import run_sub_bound, sub_bound_report

    results = run_mutations(device=device)
    with _faults_quiet():
        sub_bound = sub_bound_report(run_sub_bound(device=device))
    return mutation_report(results, sub_bound)


assert all(m.fault in FAULTS_BY_NAME for m in MUTATIONS)
