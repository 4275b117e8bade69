"""Running conformance cases in this process: one case (:func:`run_case`: inputs, kernel path with taps, golden
comparison, diagnosis, invariances, per-phase seconds), a list of them with a progress bar (:func:`run_cases`),
a case that raised as a FAIL (:func:`raised_result`), and the SIGTERM / SIGINT stop (:class:`RunStopped`).

Used by the CLI (``__main__``), the worker processes of ``parallel`` and the pytest entry
(tests/conformance/test_matrix.py). Kept out of ``__main__`` so every importer sees one module (under
``python -m`` the CLI module is ``__main__``, and a second import of it would define a second RunStopped).
"""

from __future__ import annotations

import contextlib
import signal
import time

import torch

__all__ = ["RunStopped", "raised_result", "run_case", "run_cases", "stop_handler"]


class RunStopped(BaseException):  # noqa: N818  (a signal, like KeyboardInterrupt: not an Exception of a case)
    """SIGTERM / SIGINT during a run (e.g. ``timeout`` in CI): the cases done so far are reported."""


#: Signals already turned into RunStopped in this run: ``timeout`` sends SIGTERM to the child and then to its
#: whole process group, so the runner sees it twice; only the first stops the run (a second one raised while
#: the first is handled would lose the cases done).
_STOPS: list[int] = []


def _stop(signum, frame) -> None:  # noqa: ARG001
    if _STOPS:
        return
    _STOPS.append(signum)
    raise RunStopped(signal.Signals(signum).name)


def run_cases(
    cases: list,
    device: torch.device,
    console=None,
    *,
    invariance: bool = False,
    inputs: dict | None = None,
    stopped: list | None = None,
    black_box: bool = False,
) -> list:
    """Run and compare every case on ``device`` (rich progress bar); returns the CaseResults in order.
    With ``invariance``, each case's invariances (``invariance.check_invariances``) are attached; a required
    one that FAILs makes the case FAIL. FAIL cases get ``faults.diagnose`` names.
    An exception in a case (bad inputs, a kernel error) is printed with its traceback and recorded as a FAIL
    with one stage ``run`` whose note names the exception (:func:`raised_result`; out of device memory: NOT-JUDGED);
    the run goes on."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flint_moe.ops import make_route_counter

    stopped = [] if stopped is None else stopped  # receives the signal name if SIGTERM / SIGINT stops the run
    counter = make_route_counter(device)
    results = []
    cols = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console, transient=False) as prog:
        task = prog.add_task("conformance", total=len(cases))
        for case in cases:
            prog.update(task, description=case.id)
            try:
                given = None if inputs is None else inputs.get(case.id)
                r = run_case(case, device, counter, invariance=invariance, inputs=given, black_box=black_box)
                results.append(r)
            except Exception as e:  # noqa: BLE001  (any kernel / input error is a FAIL of this case)
                (console or prog.console).print_exception(max_frames=8)
                results.append(raised_result(case, e))
            except (RunStopped, KeyboardInterrupt) as e:
                (console or prog.console).print(f"run stopped ({e or 'SIGINT'}) at {case.id}", style="bold yellow",
                                                markup=False, emoji=False)
                stopped.append(str(e) or "SIGINT")
                break
            prog.advance(task)
    return results


def raised_result(case, exc: BaseException, attempts: int = 1):
    """The CaseResult of a case whose run raised ``exc``: verdict FAIL, one stage ``run`` (FAIL) whose note is
    ``raised <Type>: <message>``, the case parameters in ``meta``. A ``torch.OutOfMemoryError`` (on the last of
    ``attempts``) says nothing about the kernel: verdict and stage NOT-JUDGED (``results.NOT_JUDGED``), note
    ``not judged: out of device memory on <attempts> attempt(s): <message>``, ``meta.oom_attempts``."""
    from flint_moe.conformance.judge.results import FAIL, NOT_JUDGED, CaseResult, StageResult

    meta = {k: getattr(case, k) for k in ("shape", "M", "k", "E", "H", "I", "profile", "seed") if hasattr(case, k)}
    meta = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in meta.items()}
    verdict, note = FAIL, f"raised {type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError):
        verdict = NOT_JUDGED
        note = f"not judged: out of device memory on {attempts} attempt{'s' if attempts > 1 else ''}: {exc}"
        meta["oom_attempts"] = attempts
    return CaseResult(
        case_id=str(case.id), path=str(case.path), verdict=verdict,
        stages=[StageResult("run", "bits", verdict, note=note)], meta=meta,
    )  # fmt: skip


def run_case(
    case,
    device: torch.device,
    counter: torch.Tensor | None = None,
    *,
    invariance: bool = False,
    inputs=None,
    black_box: bool = False,
):
    """Run one case on ``device`` and compare it (the body of :func:`run_cases`; the pytest entry
    tests/conformance/test_matrix.py calls it too). ``counter``: ``ops.make_route_counter(device)`` (made here
    when None). ``inputs``: the case's ``CaseInputs`` when they do not come from ``cases.make_inputs`` (a
    checkpoint layer: ``checkpoint.checkpoint_cases``). The golden model's long accumulations use the
    certified float64 filter (``reference.exact.filtered_sums``: same RN32 values and acceptance decisions as
    exact summation). ``black_box``: judge the case as a kernel without taps would be judged
    (``blackbox.compare_blackbox``: the path runs its production build, the output is compared end to end with
    the golden model's intervals, ``mode = "black-box"``; no stages, no diagnosis). Returns the CaseResult
    (FAIL cases of the taps mode carry ``faults.diagnose`` names). On CUDA, ``meta["peak_reserved_bytes"]`` is the
    caching allocator's peak reserved device memory during the case (weights cached by earlier cases of the
    worker included), which ``parallel.plan_units`` reads back from a committed report."""
    from flint_moe.reference.exact import filtered_sums

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with filtered_sums():
        res = _run_case(case, device, counter, invariance, inputs, black_box)
    if isinstance(getattr(res, "meta", None), dict):
        res.meta["seconds"] = round(time.perf_counter() - t0, 3)  # wall time of the case (run + golden + checks)
        if cuda:  # the process's device footprint during the case (the planner packs workers by it)
            res.meta["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    return res


def _run_case(case, device, counter, invariance, inputs, black_box=False):
    from flint_moe.conformance.inputs.block import BLOCK_PATHS
    from flint_moe.conformance.inputs.cases import make_inputs
    from flint_moe.conformance.judge.block import compare_block_case
    from flint_moe.conformance.judge.faults import diagnose
    from flint_moe.conformance.judge.invariance import check_invariances, required_failed
    from flint_moe.conformance.judge.results import FAIL
    from flint_moe.conformance.judge.stages import compare_case
    from flint_moe.conformance.run.paths import path_for
    from flint_moe.ops import make_route_counter

    phases: dict[str, float] = {}
    if counter is None:
        counter = make_route_counter(device)
    if inputs is None:
        with _phase(phases, "inputs", device):
            inputs = make_inputs(case, device)
    block = case.path in BLOCK_PATHS
    if block and black_box:
        raise ValueError(f"{case.id}: the decode block has no black-box judge (its stages need the taps)")
    taps: dict = {}
    path = path_for(case)
    with _phase(phases, "run", device):  # the first case of a shape / configuration includes the Triton compiles
        out = path.run(inputs, counter, None if black_box else taps)
    with _phase(phases, "compare", device):
        if black_box:
            from flint_moe.conformance.judge.blackbox import compare_blackbox
            from flint_moe.ops.route import router_accumulation_model

            res = compare_blackbox(lambda *_: out, inputs.x, inputs.router_weight, inputs.stored,
                                   int(inputs.notes["top_k"]), inputs.logical, shared=inputs.shared,
                                   name=case.path, case_id=case.id,
                                   router_model=router_accumulation_model(int(inputs.x.shape[0])))  # fmt: skip
            res.meta.update({k: getattr(case, k) for k in ("shape", "profile", "seed")})
        elif case.path.startswith("nvfp4_pertoken_"):  # its own stages, P1-P12
            from flint_moe.conformance.judge.pertoken import compare_pertoken

            res = compare_pertoken(case, inputs, taps, out)
        else:
            res = (compare_block_case if block else compare_case)(case, inputs, taps, out)
    if res.verdict == FAIL and not black_box:
        with _phase(phases, "diagnose", device):
            res.diagnosis = diagnose(case, inputs, taps, out, res)
    if invariance:
        with _phase(phases, "invariance", device):
            res.invariance = check_invariances(case, inputs, path, counter, out, taps)
        if required_failed(res.invariance):
            res.verdict = FAIL
    if isinstance(getattr(res, "meta", None), dict):
        res.meta["phase_seconds"] = {k: round(v, 3) for k, v in phases.items()}
    return res


@contextlib.contextmanager
def _phase(phases: dict, name: str, device):
    """Add the block's wall seconds to ``phases[name]`` (CUDA synchronised at both ends, so asynchronous
    kernels are charged to the phase that launched them)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if cuda:
            torch.cuda.synchronize()
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0


def stop_handler():
    """A fresh SIGTERM handler for one run (:class:`RunStopped` on the first signal only)."""
    _STOPS.clear()
    return _stop
