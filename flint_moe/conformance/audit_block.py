"""The decode block's CuTe DSL specialisations that the conformance runs launch, for the sm_90a PTX audit.

The block's expert kernels are compiled once per (kernel, spec, tap) (``kernels.cute.ll_launch._run``): the
spec is the layer's :func:`kernels.cute.ll_launch.ll_plan` (hidden size, stored and valid intermediate sizes,
shared intermediate size, experts, top_k and the K-splits ``choose_splits`` derives from them; never the token
count), ``tap`` whether the stages are written out. A conformance case runs both builds (the compared run with
taps, the production build of the invariances), so every block case of a profile, of the paths pending their
first H200 run and of the mutation self-test on CUDA launches, per layer: the routed gate/up, the shared
gate/up (``ll_gate_up.GateUpSpec``, top_k included) and the down + combine (``ll_down.DownSpec``), each tapped
and untapped.

:func:`block_launches` lists them from the case shapes alone (the plan of the ``LLMoEWeights`` that
``inputs.block.build_block_inputs`` builds: the case's H, I, stored I, E and top_k, the model's shared
intermediate size), and tests/kernels/test_cute_ptx.py compiles and audits each one with the kernels' own
required / forbidden instruction lists (``ll_partial.audit_gate_up``, ``ll_partial.audit_down``), so a new shape
or a changed split rule cannot run unaudited. Nothing here needs a GPU or CuTe DSL itself.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["case_launches", "block_launches"]


def _block_cases(profiles: Sequence[str], pending: bool, mutations: bool) -> list:
    from flint_moe.conformance.inputs.block import BLOCK_PATHS
    from flint_moe.conformance.inputs.cases import matrix, pending_gpu_cases

    cases = [c for p in profiles for c in matrix(p)]
    if pending:
        cases += pending_gpu_cases()
    if mutations:
        from flint_moe.conformance.judge.mutation import MUTATIONS

        cases += [m.case("cuda") for m in MUTATIONS if m.path in BLOCK_PATHS]
    return [c for c in cases if c.path in BLOCK_PATHS]


def case_launches(case) -> list[tuple[str, object]]:
    """(kernel, spec) of the expert kernels a block case launches (each in a tapped and an untapped build):
    routed gate/up, shared gate/up, down + combine, from the plan of the case's layer. Raises ValueError for a
    shape the block does not serve (``inputs.block.block_shape``) or the kernels refuse (``plan_shapes``)."""
    from flint_moe.conformance.inputs.block import block_shape
    from flint_moe.kernels.cute.ll_launch import plan_shapes

    shape, _eps = block_shape(case.shape)
    plan = plan_shapes(case.H, case.I, case.Ip, shape.shared_intermediate, case.E, case.k)
    return [("gate_up", plan.gate_up_spec()), ("gate_up", plan.shared_gate_up_spec()), ("down", plan.down_spec())]


def block_launches(
    profiles: Sequence[str] = ("gpu", "cpu"), *, pending: bool = True, mutations: bool = True
) -> dict[tuple[str, object, bool], list[str]]:
    """(kernel ``"gate_up"`` | ``"down"``, its ``GateUpSpec`` / ``DownSpec``, tap) -> the ids of the cases that
    launch it, over the block cases of ``cases.matrix(p)`` for ``p`` in ``profiles``, of
    ``cases.pending_gpu_cases()`` (``pending``) and of the mutation self-test's block cases on CUDA
    (``mutations``); in first-launch order. Raises ValueError for a case shape the kernels refuse
    (``ll_launch.plan_shapes``)."""
    out: dict[tuple[str, object, bool], list[str]] = {}
    for case in _block_cases(profiles, pending, mutations):
        for kernel, spec in case_launches(case):
            for tap in (True, False):
                ids = out.setdefault((kernel, spec, tap), [])
                if case.id not in ids:
                    ids.append(case.id)
    return out
