"""Several worker processes sharing one device for a conformance run (the gpu profile in minutes).

A case is mostly host work: Python-driven golden-model reductions, Triton compiles, kernel launches and
synchronisations; the GPU itself is idle most of the time (``meta.phase_seconds`` of an H200 run). ``jobs``
worker processes on the same GPU therefore finish the matrix about ``jobs`` times faster, while every case
still runs exactly as in a serial run (same inputs, same kernels, same comparison; each worker has its own
CUDA context, route counter and weight cache).

Scheduling (:func:`plan_units`, :func:`pick_unit`):

- **Units.** Cases that share weights (``profiles.weight_key``) form a unit, in matrix order, split into
  pieces of at most ``max_cases`` cases and about ``max_seconds`` estimated seconds (a piece rebuilds its
  weights: cheap, they are synthesised on the device). A worker runs one unit at a time, so its one-entry
  weight cache works as in a serial run. The decode block's cases (:data:`COMPILE_ONCE_PATHS`) are one unit per
  shape instead: their CuTe DSL builds compile once per process.
- **Longest first.** Units are handed out by decreasing estimated cost (:func:`estimate_seconds`), so the
  long ones (large-M grouped cases, DeepSeek-V3 layers) do not start last.
- **Measured costs.** Where an earlier GPU report of the same profile and GPU, with the invariances and not
  black-box, has the case without out-of-memory retries (:func:`measured_costs`: by default the committed
  ``reports/h200/report.json``, ``FLINT_PLAN_FROM=path`` another, ``FLINT_PLAN_FROM=none`` none), its
  measured seconds replace :func:`estimate_seconds` and its peak reserved device memory (``meta.
  peak_reserved_bytes``, recorded by ``runner.run_case``) plus :data:`CONTEXT_BYTES`, times
  :data:`MEASURED_MARGIN`, replaces :func:`estimate_bytes`: the workers are packed by what they really held (the
  model's allowance is conservative and kept workers idle: on the H200 one of 8 workers got no unit). Only the
  order and the packing change, never what a case runs; an underestimate costs an out-of-memory retry.
- **Device memory.** A unit starts only while the estimated device memory of the running units plus its own
  (:func:`estimate_bytes`: the logical and stored expert weights and a fixed allowance for the golden model,
  or the measured peak) stays within the budget (default 85 % of the free device memory at the start); a unit
  bigger than the budget runs alone. The BF16 Kimi-K2 and Llama-4-Maverick layers hold ~70 GB each: two at
  once would not fit on a 141 GB H200. After each unit a worker drops every weight cache (:func:`clear_caches`)
  and returns cached blocks to the driver.
- **Several GPUs.** With CUDA the workers are spread round robin over every visible GPU; each worker process
  sees only its own (``CUDA_VISIBLE_DEVICES``), and the memory budget above holds per GPU.
- **Mutation self-test.** ``mutation.run_mutations`` is one more unit, run beside the cases.
- **What-if.** ``python -m flint_moe.conformance.run.simulate`` replays this hand-out on the CPU from a report's
  measured costs (makespan, the work and memory lower bounds, the largest memory-time shares); the run records its
  real ``timeline`` in ``env.parallel``.

A case that raises is a FAIL with the exception (``runner.raised_result``), as in the serial runner, except
that a CUDA out-of-memory error is retried after a pause (:func:`_run_with_retries`; out of memory on every
attempt: NOT-JUDGED, as the serial runner's out of memory); a worker that dies
(e.g. a device fault) fails the rest of its unit with the exit code and is replaced.
SIGTERM / SIGINT to the parent stops the workers; the cases finished so far are returned (INCOMPLETE report).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass, field

__all__ = [
    "Unit",
    "clear_caches",
    "default_jobs",
    "estimate_bytes",
    "estimate_seconds",
    "gpu_slots",
    "pick_unit",
    "measured_costs",
    "plan_units",
    "run_parallel",
    "visible_gpus",
    "visible_to_children",
]

#: Device memory the golden model and the kernels' scratch may need beside a unit's weights (bytes; the H200
#: run of adc6a3d saw workers 15-20 GB above their weights' bytes with 6 GB: reports/h200/README.md).
GOLDEN_ALLOWANCE = 12 << 30
#: Estimated seconds of the mutation self-test on the H200 (22 s measured, reports/h200/README.md).
MUTATION_SECONDS = 25.0
#: Device memory of the mutation self-test (small shapes).
MUTATION_BYTES = 2 << 30
#: Device memory a worker holds outside the caching allocator's reserved pool (CUDA context, cuBLAS and
#: Triton workspaces), added to a measured peak, with :data:`MEASURED_MARGIN` on top.
CONTEXT_BYTES = 2 << 30
MEASURED_MARGIN = 1.10
#: The report whose measured case costs plan a CUDA run (relative to the working directory; the repository root
#: in ``scripts/h200.sh``): the committed GPU report.
DEFAULT_PLAN_FROM = "reports/h200/report.json"


@dataclass
class Unit:
    """Work for one worker: ``cases`` as (position in the run, Case) in matrix order, or the mutation self-test
    (``kind == "mutation"``); ``seconds`` / ``nbytes``: estimated cost and device memory."""

    uid: int
    kind: str
    cases: list = field(default_factory=list)
    seconds: float = 0.0
    nbytes: int = 0


def _params(case) -> int:
    return case.E * 3 * case.Ip * case.H  # stored (padded) intermediate size


#: Bytes per NVFP4 weight: the E2M1 code (half a byte) and one E4M3 block scale per 16 weights.
NVFP4_BYTES = 0.5 + 1 / 16


def estimate_bytes(case) -> int:
    """Device memory (bytes) a case's weights occupy in a worker: NVFP4 (the ``nvfp4_*`` paths and the decode
    block's, ``ll_block`` / ``ll_module``) :data:`NVFP4_BYTES` per parameter twice (the checkpoint layout and
    FlintMoEWeights), plus the fp32 / bf16 expert stacks the ``modelopt`` profile quantises (and the module
    path's own repacked copy; the decode block's shared expert, [2 SI, H] and [H, SI] in NVFP4 plus a copy of
    its scales swizzled); BF16 2 bytes per parameter twice (the logical stack and the TRT-LLM layout); plus
    :data:`GOLDEN_ALLOWANCE`."""
    from flint_moe.conformance.inputs.block import BLOCK_PATHS, block_shape

    p = _params(case)
    if case.path.startswith("nvfp4_") or case.path in BLOCK_PATHS:
        b = int(2 * NVFP4_BYTES * p) + (6 * p if case.profile == "modelopt" else 0)
        if case.path == "nvfp4_module":  # the module repacks its own FlintMoEWeights
            b += int(NVFP4_BYTES * p)
        if case.path in BLOCK_PATHS:
            b += int((NVFP4_BYTES + 1 / 16) * 3 * block_shape(case.shape)[0].shared_intermediate * case.H)
    else:
        b = 4 * p
    return b + GOLDEN_ALLOWANCE


def estimate_seconds(case) -> float:
    """Rough wall seconds of a case on the H200 (for ordering only): a fixed part plus the golden model's
    float64 reductions over the experts the case touches (``min(E, M k)`` experts of ``3 H I`` weights;
    ~3 ns per weight, from the DeepSeek-V3 M=300 grouped case's 34 s of comparison)."""
    experts = min(case.E, case.M * case.k)
    return 0.5 + 3e-9 * experts * 3 * case.H * case.I


def measured_costs(
    report_path: str | os.PathLike | None, *, profile: str | None = None, gpu: str | None = None
) -> dict[str, tuple[float, int | None]]:
    """Case id -> (``meta.seconds``, ``meta.peak_reserved_bytes`` or None) of the cases of a conformance report
    JSON that measured what this run will run: made on a GPU (``env.gpu`` set; equal to ``gpu`` when given), of
    ``profile`` (when given), with the invariances on (``env.invariance``) and not black-box (``env.black_box``);
    cases retried after running out of device memory (``meta.oom_retries`` / ``meta.oom_attempts``: their time
    includes the waits, their peak another worker's squeeze) are left out. {} when ``report_path`` is None,
    missing, unreadable, or the report is of another kind."""
    import json

    if report_path is None:
        return {}
    try:
        with open(report_path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return {}
    env = rep.get("env") if isinstance(rep, dict) else None
    if not isinstance(env, dict) or not env.get("gpu") or (gpu is not None and env.get("gpu") != gpu):
        return {}
    if (profile is not None and env.get("profile") != profile) or env.get("invariance") is not True:
        return {}
    if env.get("black_box"):
        return {}
    out: dict[str, tuple[float, int | None]] = {}
    for c in rep.get("cases") or []:
        meta = c.get("meta") or {}
        if meta.get("oom_retries") or meta.get("oom_attempts"):
            continue
        sec, peak = meta.get("seconds"), meta.get("peak_reserved_bytes")
        if isinstance(c.get("case_id"), str) and isinstance(sec, (int, float)):
            out[c["case_id"]] = (float(sec), int(peak) if isinstance(peak, int) else None)
    return out


def _case_cost(case, measured: dict) -> tuple[float, int]:
    sec, peak = measured.get(case.id, (None, None))
    sec = estimate_seconds(case) if sec is None else sec
    nbytes = estimate_bytes(case) if peak is None else int(MEASURED_MARGIN * (peak + CONTEXT_BYTES))
    return sec, nbytes


#: Paths whose kernels compile in each worker process that launches them, at a cost that dwarfs a case: the
#: decode block's CuTe DSL builds (per shape and top_k, not per token count or data; 11-18 s per build set on the
#: H200 run of 74c640f, where every one of 8 workers compiled the DeepSeek-V3 builds and slowed the golden
#: compares beside them). Their cases form one unit per shape, whatever its estimate, so each build compiles once.
COMPILE_ONCE_PATHS = ("ll_block", "ll_module")


def plan_units(
    cases: list,
    *,
    max_cases: int = 8,
    max_seconds: float = 15.0,
    mutation: bool = False,
    measured: dict | None = None,
) -> list[Unit]:
    """Units of ``cases`` (see the module docstring), longest estimated first; a unit ends after ``max_cases``
    cases or before the case that would take its estimate past ``max_seconds`` (a long case is a unit of its
    own), except that the cases of :data:`COMPILE_ONCE_PATHS` on one shape are one unit; with ``mutation`` the
    mutation self-test is one more unit. ``measured``: :func:`measured_costs` of an earlier run; its cases'
    seconds and peak device memory replace the estimates."""
    from flint_moe.conformance.inputs.profiles import weight_key

    measured = measured or {}
    cost = {id(c): _case_cost(c, measured) for c in cases}

    groups: dict[tuple, list] = {}
    whole: dict[str, list] = {}  # shape -> the cases of COMPILE_ONCE_PATHS on it
    for pos, case in enumerate(cases):
        if case.path in COMPILE_ONCE_PATHS:
            whole.setdefault(case.shape, []).append((pos, case))
        else:
            groups.setdefault(weight_key(case), []).append((pos, case))
    pieces: list[list] = []
    for members in whole.values():  # one unit per shape, cases sharing weights adjacent
        first: dict = {}
        for pos, case in members:
            first.setdefault(weight_key(case), pos)
        pieces.append(sorted(members, key=lambda pc: (first[weight_key(pc[1])], pc[0])))
    for members in groups.values():
        part: list = []
        for pos, case in members:
            est = sum(cost[id(c)][0] for _, c in part)
            if part and (len(part) == max_cases or est + cost[id(case)][0] > max_seconds):
                pieces.append(part)
                part = []
            part.append((pos, case))
        pieces.append(part)
    units: list[Unit] = []
    for part in pieces:
        sec = 2.0 + sum(cost[id(c)][0] for _, c in part)  # + the first case's compiles
        units.append(Unit(len(units), "cases", part, sec, max(cost[id(c)][1] for _, c in part)))
    if mutation:
        units.append(Unit(len(units), "mutation", [], MUTATION_SECONDS, MUTATION_BYTES))
    units.sort(key=lambda u: -u.seconds)
    return units


#: The fields of one ``env.parallel.timeline`` entry: a unit as it ran (worker, seconds into the run when handed out
#: and when its worker reported it done; a worker's first unit also holds that process's start-up, imports and CUDA
#: context) beside what the planner expected of it (seconds, GiB) and its first case.
TIMELINE_FIELDS = ("uid", "worker", "start_s", "end_s", "planned_s", "planned_gib", "first_case")


def _timeline_entry(unit: Unit, wid: int, start: float, end: float) -> list:
    first = unit.cases[0][1].id if unit.cases else unit.kind
    return [unit.uid, wid, round(start, 1), round(end, 1), round(unit.seconds, 1), round(unit.nbytes / 2**30, 1),
            str(first)]  # fmt: skip


def pick_unit(pending: list[Unit], running_bytes: list[int], budget: int) -> Unit | None:
    """The first unit of ``pending`` (longest first) that fits ``budget`` beside the running units'
    ``running_bytes``; with nothing running, the first unit even if it alone exceeds the budget; None when
    nothing fits now. Removes the chosen unit from ``pending``."""
    used = sum(running_bytes)
    for i, u in enumerate(pending):
        if not running_bytes or used + u.nbytes <= budget:
            return pending.pop(i)
    return None


def default_jobs(device_type: str, gpus: int = 1) -> int:
    """Worker processes for ``--jobs auto``: 1 on the CPU (the interpreter already uses the cores), else
    half the host's cores, at most 8 per GPU (each worker also runs Triton's compiler processes)."""
    if device_type != "cuda":
        return 1
    return max(1, min(8 * max(1, gpus), (os.cpu_count() or 2) // 2))


def visible_gpus(environ: dict | None = None, device_count: int | None = None) -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` tokens: that variable's entries when it
    is set (indices or UUIDs, in order), else ``"0" .. str(device_count - 1)`` (default: torch's count)."""
    env = os.environ if environ is None else environ
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [t.strip() for t in vis.split(",") if t.strip()]
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    return [str(i) for i in range(device_count)]


@contextlib.contextmanager
def visible_to_children(gpu: str | None):
    """While open, ``CUDA_VISIBLE_DEVICES`` is ``gpu`` in this process's environment, which a spawned child
    takes at its start; restored (or removed again) on exit. ``None``: leave the environment alone."""
    if gpu is None:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def gpu_slots(workers: int, gpus: int) -> list[int]:
    """GPU (position in :func:`visible_gpus`) of each of ``workers`` workers: round robin, so every GPU gets
    ``workers // gpus`` or one more."""
    return [w % max(1, gpus) for w in range(workers)]


# ------------------------------------------------------------------------------------------------------
# worker process
# ------------------------------------------------------------------------------------------------------


def _worker(wid: int, tasks, results, invariance: bool, device: str, black_box: bool = False) -> None:
    """Worker loop: run each unit from ``tasks`` and put one message per case, then ("done", ...)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    import gc

    import torch

    from flint_moe.conformance.run.runner import raised_result, run_case
    from flint_moe.ops import make_route_counter

    dev = torch.device(device)
    counter = make_route_counter(dev)
    while True:
        task = tasks.get()
        if task is None:
            return
        unit: Unit = task
        t0 = time.perf_counter()
        if unit.kind == "mutation":
            from flint_moe.conformance.judge.mutation import self_test

            try:
                rep = self_test(device=dev)
            except Exception as e:  # noqa: BLE001  (reported, not fatal for the cases)
                traceback.print_exc()
                rep = {"error": f"{type(e).__name__}: {e}"}
            results.put(("mutation", wid, unit.uid, rep))
        else:
            for pos, case in unit.cases:
                r = _run_with_retries(case, dev, counter, invariance, run_case, raised_result, black_box)
                results.put(("case", wid, unit.uid, pos, r.to_json()))
        clear_caches()
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        results.put(("done", wid, unit.uid, round(time.perf_counter() - t0, 3)))


def clear_caches() -> None:
    """Drop every case-data cache a worker keeps between cases (each holds the weights of the last shape): the
    inputs' (``inputs.profiles``, ``inputs.block``, ``inputs.pertoken``) and the module paths' loaded modules
    (``run.paths``: ``_MODULE``, ``_BF16_MODULE``, ``_LL_MODULE``). Called at the end of each unit."""
    from flint_moe.conformance.inputs import block, pertoken, profiles
    from flint_moe.conformance.run import paths

    for cache in (profiles._cache, block._cache, pertoken._cache, paths._MODULE, paths._BF16_MODULE,
                  paths._LL_MODULE):  # fmt: skip
        cache.clear()


#: Attempts of a case that runs out of device memory in a worker (other workers' peaks come and go).
OOM_ATTEMPTS = 4


def _run_with_retries(case, dev, counter, invariance, run_case, raised_result, black_box=False):
    """``run_case``; a CUDA out-of-memory error (the device is shared by the workers, and the memory estimates
    are estimates) frees this worker's cached blocks, waits and runs the case again from scratch, at most
    :data:`OOM_ATTEMPTS` times; the attempts are recorded in ``meta.oom_retries``. Any other exception is a FAIL
    of the case (``raised_result``); out of memory on the last attempt leaves the case NOT-JUDGED (neither a pass
    nor a FAIL of the kernel; the run's exit status is 1)."""
    import gc

    import torch

    for attempt in range(OOM_ATTEMPTS):
        try:
            r = run_case(case, dev, counter, invariance=invariance, black_box=black_box)
        except torch.OutOfMemoryError as e:
            if attempt + 1 == OOM_ATTEMPTS:
                traceback.print_exc()
                return raised_result(case, e, OOM_ATTEMPTS)  # NOT-JUDGED: the device's memory, not the kernel
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            time.sleep(5.0 * (attempt + 1))
            continue
        except Exception as e:  # noqa: BLE001  (any kernel / input error is a FAIL of this case)
            traceback.print_exc()
            return raised_result(case, e)
        if attempt and isinstance(getattr(r, "meta", None), dict):
            r.meta["oom_retries"] = attempt
        return r
    raise AssertionError("unreachable")  # pragma: no cover


# ------------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------------


def _gpu_name() -> str:
    """The name of the first visible GPU, as a report's ``env.gpu`` records it."""
    import torch

    return torch.cuda.get_device_name(0)


def _budget(device: str, fraction: float = 0.85, index: int = 0) -> int:
    import torch

    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(index)
        return int(free * fraction)
    return 1 << 62


def run_parallel(
    cases: list,
    jobs: int,
    device: str,
    console=None,
    *,
    invariance: bool = False,
    mutation: bool = False,
    stopped: list | None = None,
    black_box: bool = False,
    max_cases: int = 8,
    max_seconds: float = 15.0,
    profile: str | None = None,
) -> tuple[list[dict], dict | None, dict]:
    """Run ``cases`` in ``jobs`` worker processes on ``device`` ("cuda" or "cpu").

    With CUDA the workers are spread round robin over every visible GPU (:func:`visible_gpus`, :func:`gpu_slots`):
    each worker process sees only its GPU (``CUDA_VISIBLE_DEVICES`` set for it), and a unit starts on a GPU
    only while the units running there fit that GPU's memory budget.

    Returns (case result dicts of the finished cases in ``cases`` order, the mutation report or None, run
    info: jobs, GPUs, per-GPU budget bytes, units, per-worker busy seconds, and the ``timeline``: one entry of
    :data:`TIMELINE_FIELDS` per unit that ran, the real schedule beside what ``simulate`` replays from the plan).
    ``stopped`` receives the signal
    name when SIGTERM / SIGINT stops the run (the parent's handlers raise ``__main__.RunStopped``). ``profile``:
    the run's case matrix profile ("gpu" / "cpu"), which a report must share for its measured costs to plan the
    units (:func:`measured_costs`; None: no measured costs)."""
    import multiprocessing as mp

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flint_moe.conformance.run.runner import RunStopped, raised_result

    stopped = [] if stopped is None else stopped
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # inherited by the workers
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    gpus = visible_gpus() if device.startswith("cuda") else []
    budgets = [_budget(device, index=i) for i in range(len(gpus))] or [_budget(device)]
    plan_from = os.environ.get("FLINT_PLAN_FROM", DEFAULT_PLAN_FROM) if gpus else None
    if plan_from in (None, "", "none") or profile is None:
        plan_from = None  # without the run's profile no report can be matched to it
    measured = measured_costs(plan_from, profile=profile, gpu=_gpu_name() if gpus else None)
    pending = plan_units(cases, max_cases=max_cases, max_seconds=max_seconds, mutation=mutation, measured=measured)
    n_units = len(pending)
    results_q = ctx.Queue()
    workers: dict[int, tuple] = {}  # wid -> (process, task queue)
    running: dict[int, Unit] = {}
    left: dict[int, set] = {}  # uid -> positions not yet reported
    busy: dict[int, float] = {}
    done: dict[int, dict] = {}
    mutation_rep = None
    next_wid = 0
    slot_of: dict[int, int] = {}  # wid -> GPU position

    def start_worker(slot: int) -> None:
        nonlocal next_wid
        q = ctx.Queue()
        p = ctx.Process(target=_worker, args=(next_wid, q, results_q, invariance, device, black_box), daemon=True)
        with visible_to_children(gpus[slot] if gpus else None):
            p.start()
        workers[next_wid] = (p, q)
        slot_of[next_wid] = slot
        next_wid += 1

    n_workers = max(1, min(jobs, n_units))
    for slot in gpu_slots(n_workers, len(gpus)):
        start_worker(slot)
    deaths = 0
    t0 = time.perf_counter()
    started: dict[int, float] = {}  # uid -> seconds into the run when handed out
    timeline: list[list] = []
    cols = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*cols, console=console, transient=False) as prog:
            bar = prog.add_task(f"conformance ({len(workers)} workers)", total=len(cases))
            while pending or running:
                for wid in sorted(workers):
                    if wid in running or not pending:
                        continue
                    slot = slot_of[wid]
                    here = [u.nbytes for w, u in running.items() if slot_of[w] == slot]
                    unit = pick_unit(pending, here, budgets[slot])
                    if unit is None:
                        continue  # nothing fits this GPU now; another GPU may take one
                    running[wid] = unit
                    left[unit.uid] = {pos for pos, _ in unit.cases}
                    workers[wid][1].put(unit)
                    started[unit.uid] = time.perf_counter() - t0
                try:
                    msg = results_q.get(timeout=2.0)
                except queue.Empty:
                    for wid, (p, _) in list(workers.items()):
                        if p.is_alive():
                            continue
                        unit = running.pop(wid, None)
                        del workers[wid]
                        slot = slot_of.pop(wid)
                        if unit is not None:  # fail what the dead worker had not reported
                            err = RuntimeError(f"conformance worker died (exit code {p.exitcode}) in this unit")
                            for pos, case in unit.cases:
                                if pos in left[unit.uid]:
                                    done[pos] = raised_result(case, err).to_json()
                                    prog.advance(bar)
                            if unit.kind == "mutation":
                                mutation_rep = {"error": str(err)}
                        deaths += 1
                        if deaths > n_workers + 3:  # workers keep dying (e.g. at start-up): give up loudly
                            why = f"conformance workers keep dying (last exit code {p.exitcode})"
                            raise RuntimeError(why) from None
                        start_worker(slot)  # the replacement takes the dead worker's GPU
                    continue
                kind, wid = msg[0], msg[1]
                if kind == "case":
                    _, _, uid, pos, res = msg
                    done[pos] = res
                    left[uid].discard(pos)
                    prog.update(bar, description=res["case_id"])
                    prog.advance(bar)
                elif kind == "mutation":
                    mutation_rep = msg[3]
                elif kind == "done":
                    unit = running.pop(wid, None)
                    busy[wid] = busy.get(wid, 0.0) + float(msg[3])
                    if unit is not None:
                        end = time.perf_counter() - t0
                        timeline.append(_timeline_entry(unit, wid, started.get(unit.uid, 0.0), end))
    except (RunStopped, KeyboardInterrupt) as e:
        stopped.append(str(e) or "SIGINT")
        while True:  # keep the cases the workers finished before the stop
            try:
                msg = results_q.get(timeout=0.2)
            except (queue.Empty, OSError, EOFError):
                break
            if msg[0] == "case":
                done[msg[3]] = msg[4]
            elif msg[0] == "mutation":
                mutation_rep = msg[3]
    finally:
        for p, q in workers.values():
            if stopped:
                p.terminate()
            else:
                q.put(None)
        for p, _ in workers.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    info = {
        "jobs": n_workers,
        "gpus": gpus,
        "device_memory_budget_bytes": budgets[0] if gpus else None,
        "device_memory_budget_bytes_per_gpu": budgets if gpus else None,
        "units": n_units,
        "plan_from": plan_from if measured else None,
        "measured_cases": sum(c.id in measured for c in cases),
        "worker_busy_seconds": {str(k): round(v, 1) for k, v in sorted(busy.items())},
        "timeline_fields": list(TIMELINE_FIELDS),
        "timeline": sorted(timeline, key=lambda e: (e[2], e[1])),
    }
    return [done[pos] for pos in sorted(done)], mutation_rep, info
