"""Invariance checks of one kernel path on one case.

``check_invariances(case, inputs, path, counter, out, taps, *, repeats=3) -> list[InvarianceResult]``:

============================  ====================================================================  =========
name                          what                                                                  required
============================  ====================================================================  =========
production_build              the production build (no taps) on the same inputs and launch           yes
                              configuration returns the tapped build's output bitwise (a fault of
                              the build a server runs, absent once taps are compiled in, fails)
determinism                   ``repeats`` runs (the given one plus ``repeats - 1`` more): the        yes
                              output and every tap bitwise equal
row_independence              two reruns, each keeping the rows of one parity and replacing the     yes
                              other rows' ``x`` and ``shared`` with different random data: the
                              kept rows' output and per-row taps bitwise equal (M >= 2)
cuda_graph                    a CUDA-graph capture of the run, replayed, equals eager bitwise        yes
                              (CUDA only: SKIP with the reason on the CPU)
batch_invariance              each token run alone (M = 1) vs inside the batch: rows bitwise equal  no
                              (measured and reported, never a FAIL; M >= 2)
============================  ====================================================================  =========

Outcomes: ``PASS``, ``FAIL`` (required ones only), ``SKIP`` (with ``note``), ``MEASURED`` (batch invariance:
``details`` holds rows equal / differing and the max ulp distance of the differing rows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from flint_moe.conformance.judge.metrics import _bits_equal, ulp_distance
from flint_moe.conformance.judge.results import _json_safe

__all__ = [
    "PASS",
    "FAIL",
    "SKIP",
    "MEASURED",
    "InvarianceResult",
    "check_invariances",
    "production_build",
    "required_failed",
]

PASS = "PASS"
FAIL = "FAIL"
SKIP = "SKIP"
MEASURED = "MEASURED"

#: Seed offset of the replacement rows (row independence).
_REPLACE_SEED = 0x5EED


@dataclass
class InvarianceResult:
    """One invariance on one case. ``name`` (see module table), ``required`` (a FAIL fails the case),
    ``outcome`` (PASS / FAIL / SKIP / MEASURED), ``runs`` (extra kernel runs it cost), ``note`` (reason or
    first difference), ``details`` (numbers: rows compared, rows differing, differing tensors, max ulp)."""

    name: str
    required: bool
    outcome: str
    runs: int = 0
    note: str = ""
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """JSON-ready dict."""
        return _json_safe(asdict(self))

    @property
    def failed(self) -> bool:
        """True for a required invariance that FAILed."""
        return self.required and self.outcome == FAIL


def required_failed(results: list[InvarianceResult]) -> list[str]:
    """Names of the required invariances that FAILed."""
    return [r.name for r in results if r.failed]


def _with(inputs, **changes):
    """A shallow copy of ``inputs`` (a dataclass or a namespace) with some attributes replaced."""
    import copy

    new = copy.copy(inputs)
    for k, v in changes.items():
        setattr(new, k, v)
    return new


def _diff_tensors(a: dict, b: dict) -> list[str]:
    """Names of the tensors differing bitwise (or missing on one side) between two {name: tensor} dicts."""
    bad = []
    for name in sorted(set(a) | set(b)):
        ta, tb = a.get(name), b.get(name)
        if not (isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor)):
            if isinstance(ta, torch.Tensor) or isinstance(tb, torch.Tensor):
                bad.append(name)
            continue
        if ta.shape != tb.shape or ta.dtype != tb.dtype or not bool(_bits_equal(ta, tb.to(ta.device)).all()):
            bad.append(name)
    return bad


def _rows_equal(a, b, m: int, device: torch.device) -> torch.Tensor:
    """bool [m]: row r of ``a`` bitwise equal to row r of ``b`` (all False when either is missing or their
    shapes or dtypes differ), computed on the device without a host read."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or b.shape != a.shape or b.dtype != a.dtype:
        return torch.zeros(m, dtype=torch.bool, device=device)
    if a.numel() == 0:
        return torch.ones(m, dtype=torch.bool, device=device)
    return _bits_equal(a, b.to(a.device)).reshape(m, -1).all(dim=1).to(device)


def _outputs(out: torch.Tensor, taps: dict) -> dict:
    d = {"out": out.detach()}
    d.update({f"taps.{k}": v.detach() for k, v in taps.items() if isinstance(v, torch.Tensor)})
    return d


def _run(path, inputs, counter) -> tuple[torch.Tensor, dict]:
    taps: dict = {}
    out = path.run(inputs, counter, taps)
    return out, taps


def production_build(case, inputs, path, counter, out, taps) -> InvarianceResult:
    """One run of the production build (``taps`` None): its output must equal the tapped build's ``out``
    bitwise, so what the taps show is what the build without taps computes."""
    prod = path.run(inputs, counter, None)
    if prod.shape != out.shape:
        why = f"output shape {tuple(prod.shape)} vs the tapped build's {tuple(out.shape)}"
        return InvarianceResult("production_build", True, FAIL, 1, why)
    same = _bits_equal(prod, out)
    if not bool(same.all()):
        bad = (~same).nonzero()
        n, first = int(bad.shape[0]), [int(v) for v in bad[0].tolist()]
        return InvarianceResult("production_build", True, FAIL, 1,
                                f"production build (no taps) differs from the tapped build in {n} output elements, "
                                f"first at {first}", {"differing_elements": n, "first": first})  # fmt: skip
    return InvarianceResult("production_build", True, PASS, 1, "production build bitwise equal to the tapped build")


def determinism(case, inputs, path, counter, out, taps, repeats: int = 3) -> InvarianceResult:
    """``repeats - 1`` more runs; every output and tap bitwise equal to the first run's."""
    ref = _outputs(out, taps)
    for i in range(1, repeats):
        o, t = _run(path, inputs, counter)
        bad = _diff_tensors(ref, _outputs(o, t))
        if bad:
            return InvarianceResult("determinism", True, FAIL, i, f"run {i + 1} of {repeats} differs: {bad}",
                                    {"repeats": repeats, "differing": bad})  # fmt: skip
    return InvarianceResult("determinism", True, PASS, repeats - 1, f"{repeats} runs bitwise equal",
                            {"repeats": repeats})  # fmt: skip


def row_independence(case, inputs, path, counter, out, taps) -> InvarianceResult:
    """Two reruns: keep the even (then odd) rows, replace the others' x and shared with other random
    data; the kept rows of the output and of every per-row tap must stay bitwise equal."""
    x = inputs.x
    M = int(x.shape[0])
    if M < 2:
        return InvarianceResult("row_independence", True, SKIP, 0, "M = 1: no other rows")
    ref = _outputs(out, taps)
    g = torch.Generator(device=x.device).manual_seed(_REPLACE_SEED + int(getattr(case, "seed", 0)))
    rows = torch.arange(M, device=x.device)
    bad_rows: list[int] = []
    bad_names: set[str] = set()
    for parity in (0, 1):
        keep = rows % 2 == parity
        nx = (torch.randn(x.shape, generator=g, device=x.device) * x.float().std().clamp_min(1e-3)).to(x.dtype)
        ns = torch.randn(inputs.shared.shape, generator=g, device=x.device).to(inputs.shared.dtype)
        nx = torch.where(keep[:, None], x, nx)
        ns = torch.where(keep[:, None], inputs.shared, ns)
        o, t = _run(path, _with(inputs, x=nx, shared=ns), counter)
        new = _outputs(o, t)
        # per-row equality of every row-indexed tensor at once: one host read per parity, not one per row
        names = sorted({k for d in (ref, new) for k, v in d.items() if v.dim() >= 1 and v.shape[0] == M})
        if not names:
            continue
        row_ok = torch.stack([_rows_equal(ref.get(k), new.get(k), M, x.device) for k in names])
        bad = (~row_ok) & keep[None, :]
        if bool(bad.any()):
            bad_cpu = bad.cpu()
            bad_rows.extend(int(r) for r in bad_cpu.any(dim=0).nonzero().flatten())
            bad_names.update(names[i] for i in bad_cpu.any(dim=1).nonzero().flatten().tolist())
    details = {"rows": M, "rows_differing": sorted(bad_rows), "differing": sorted(bad_names)}
    if bad_rows:
        return InvarianceResult("row_independence", True, FAIL, 2,
                                f"rows {sorted(bad_rows)[:8]} change when other rows change: {sorted(bad_names)}",
                                details)  # fmt: skip
    return InvarianceResult("row_independence", True, PASS, 2, "every row unchanged when the others change",
                            details)  # fmt: skip


def cuda_graph(case, inputs, path, counter, out, taps) -> InvarianceResult:
    """Capture the run in a CUDA graph, replay it, compare with eager bitwise (CUDA only)."""
    dev = inputs.x.device
    if dev.type != "cuda" or not torch.cuda.is_available():
        return InvarianceResult("cuda_graph", True, SKIP, 0, "no CUDA device (Triton interpreter run)")
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            path.run(inputs, counter, None)  # warm-up (compiles) outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_out = path.run(inputs, counter, None)
        graph.replay()
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:  # not a property of the path: the runner retries or reports it not judged
        raise
    except Exception as exc:  # a path that cannot be captured fails this required invariance
        return InvarianceResult("cuda_graph", True, FAIL, 1, f"capture/replay raised {type(exc).__name__}: {exc}")
    ok = g_out.shape == out.shape and bool(_bits_equal(g_out, out).all())
    if not ok:
        n = int((~_bits_equal(g_out, out)).sum()) if g_out.shape == out.shape else -1
        return InvarianceResult("cuda_graph", True, FAIL, 2, f"replay differs from eager in {n} elements",
                                {"differing_elements": n})  # fmt: skip
    return InvarianceResult("cuda_graph", True, PASS, 2, "graph replay bitwise equal to eager")


#: Most tokens run alone by :func:`batch_invariance` (evenly spaced, first and last included, above that).
BATCH_INVARIANCE_ROWS = 64


def batch_invariance(case, inputs, path, counter, out, taps) -> InvarianceResult:
    """Each token alone (M = 1) vs inside the batch: count the rows whose output is bitwise equal. Batches of
    more than :data:`BATCH_INVARIANCE_ROWS` tokens check that many evenly spaced rows (``details["rows"]``;
    ``details["rows_total"]`` = M)."""
    M = int(inputs.x.shape[0])
    if M < 2:
        return InvarianceResult("batch_invariance", False, SKIP, 0, "M = 1: the batch is the token alone")
    n = min(M, max(2, BATCH_INVARIANCE_ROWS))
    rows = sorted({round(i * (M - 1) / (n - 1)) for i in range(n)})
    differ, max_ulp = [], 0.0
    for r in rows:
        sl = slice(r, r + 1)
        o, _ = _run(path, _with(inputs, x=inputs.x[sl].contiguous(), shared=inputs.shared[sl].contiguous()),
                    counter)  # fmt: skip
        if not bool(_bits_equal(o[0], out[r]).all()):
            differ.append(r)
            max_ulp = max(max_ulp, float(ulp_distance(o[0], out[r]).max()))
    n = len(rows)
    details = {"rows": n, "rows_total": M, "rows_equal": n - len(differ), "rows_differing": differ,
               "max_ulp": max_ulp}  # fmt: skip
    of = f"{n} rows checked of {M}" if n < M else f"{M} rows"
    note = (f"every token alone equals its row in the batch ({of})" if not differ
            else f"{len(differ)} of {of} differ alone vs in the batch (max {max_ulp:g} ulp)")  # fmt: skip
    return InvarianceResult("batch_invariance", False, MEASURED, n, note, details)


def check_invariances(case, inputs, path, counter, out, taps, *, repeats: int = 3) -> list[InvarianceResult]:
    """All invariances of one case, given the first run's ``out`` and ``taps`` (``path``: a
    ``paths.KernelPath`` or anything with ``run(inputs, counter, taps)``). The per-token paths take their
    routing as an input of M rows, so they skip the batch invariance (a token alone has no routing)."""
    if str(case.path).startswith("nvfp4_pertoken_"):
        return [production_build(case, inputs, path, counter, out, taps),
                determinism(case, inputs, path, counter, out, taps, repeats),
                row_independence(case, inputs, path, counter, out, taps),
                cuda_graph(case, inputs, path, counter, out, taps)]  # fmt: skip
    return [
        production_build(case, inputs, path, counter, out, taps),
        determinism(case, inputs, path, counter, out, taps, repeats),
        row_independence(case, inputs, path, counter, out, taps),
        cuda_graph(case, inputs, path, counter, out, taps),
        batch_invariance(case, inputs, path, counter, out, taps),
    ]
