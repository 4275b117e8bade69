"""The structure of report.json (``report.SCHEMA``), checked before a loaded report is used.

:func:`validate_report` ``(data)`` checks the JSON types of every field that the readers of a loaded report use:
``baseline.compare_reports`` (``--baseline``), the ``--rerun-failed`` merge in ``__main__`` (whose merged cases
are then rendered by ``summary.summary_markdown``, ``summary_full.full_summary_markdown`` and
``html.render_html``) and the re-render CLI of :mod:`flint_moe.conformance.report.html`. Fields a reader does
not use, and fields an older report lacks, are not required; a field that is present must have its type
(``None`` only where the writer writes it). Besides types: ``env.profile`` is ``"cpu"``, ``"gpu"`` or
``"gpu-full"``, a mismatch map's grid is at most ``maps.MAP_ROWS`` x ``maps.MAP_COLS`` and its cells lie inside
it, an ulp histogram has ``maps.ULP_BINS`` counts.

Numbers may be the strings ``"inf"``, ``"-inf"``, ``"nan"`` (how ``results._json_safe`` writes non-finite
floats). Booleans are not integers here.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ReportSchemaError", "validate_report"]


class ReportSchemaError(ValueError):
    """A report.json field of the wrong type; ``field`` is its path (e.g. ``cases[3].stages[0].verdict``)."""

    def __init__(self, field: str, expected: str | None, value=None):
        self.field = field
        super().__init__(f"field {field}: " + ("missing" if expected is None else f"expected {expected}, got "
                                                                                  f"{_kind(value)}"))  # fmt: skip


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return f"the integer {v}" if abs(v) < 10**12 else "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return f"the string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


Check = Callable[[object, str], None]


def _is(expected: str, pred) -> Check:
    def check(v, path: str) -> None:
        if not pred(v):
            raise ReportSchemaError(path, expected, v)

    return check


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


STR = _is("a string", lambda v: isinstance(v, str))
INT = _is("an integer", _int)
NAT = _is("an integer >= 0", lambda v: _int(v) and v >= 0)
BOOL = _is("true or false", lambda v: isinstance(v, bool))
_NONFINITE = ("inf", "-inf", "nan")
NUM = _is('a number (or "inf", "-inf", "nan")',
          lambda v: _int(v) or isinstance(v, float) or (isinstance(v, str) and v in _NONFINITE))  # fmt: skip


def opt(check: Check) -> Check:
    """``check`` or null."""

    def c(v, path: str) -> None:
        if v is not None:
            check(v, path)

    return c


def one_of(*values: str) -> Check:
    return _is(" or ".join(repr(v) for v in values), lambda v: isinstance(v, str) and v in values)


def list_of(item: Check, length: int | None = None) -> Check:
    def c(v, path: str) -> None:
        if not isinstance(v, list) or (length is not None and len(v) != length):
            raise ReportSchemaError(path, "a list" + (f" of {length}" if length is not None else ""), v)
        for i, x in enumerate(v):
            item(x, f"{path}[{i}]")

    return c


def _key(path: str, k: str) -> str:
    return f"{path}[{k[:40]!r}]"


def dict_of(value: Check) -> Check:
    def c(v, path: str) -> None:
        if not isinstance(v, dict):
            raise ReportSchemaError(path, "an object", v)
        for k, x in v.items():
            value(x, _key(path, str(k)))

    return c


def obj(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    """An object whose listed fields, where present, pass their checks (other fields are not looked at)."""

    def c(v, path: str) -> None:
        if not isinstance(v, dict):
            raise ReportSchemaError(path, "an object", v)
        for name in required:
            if name not in v:
                raise ReportSchemaError(f"{path}.{name}" if path else name, None)
        for name, check in fields.items():
            if name in v:
                check(v[name], f"{path}.{name}" if path else name)

    return c


def _map(v, path: str) -> None:
    """``maps.mismatch_map`` dict: grid within MAP_ROWS x MAP_COLS, cells [i, j, count] inside the grid."""
    from flint_moe.conformance.report.maps import MAP_COLS, MAP_ROWS

    pair = list_of(NAT, 2)
    obj({"shape": pair, "dims": list_of(NAT), "cell": pair, "grid": pair, "total": NAT,
         "cells": list_of(list_of(NAT, 3))}, required=("shape", "cell", "grid", "cells"))(v, path)  # fmt: skip
    gr, gc = v["grid"]
    if gr > MAP_ROWS or gc > MAP_COLS:
        raise ReportSchemaError(f"{path}.grid", f"at most [{MAP_ROWS}, {MAP_COLS}]", gr if gr > MAP_ROWS else gc)
    if min(v["cell"]) < 1:
        raise ReportSchemaError(f"{path}.cell", "two integers >= 1", min(v["cell"]))
    for n, (i, j, _) in enumerate(v["cells"]):
        if i >= gr or j >= gc:
            raise ReportSchemaError(f"{path}.cells[{n}]", f"a cell inside the grid [{gr}, {gc}]", i if i >= gr else j)


def _hist(v, path: str) -> None:
    from flint_moe.conformance.report.maps import ULP_BINS

    list_of(NAT, ULP_BINS)(v, path)


COORDS = list_of(list_of(INT))
MAP = opt(_map)
HIST = opt(_hist)
STRS = list_of(STR)

STAGE = obj({
    "stage": STR, "kind": opt(STR), "verdict": STR, "elements": opt(INT), "mismatches": opt(INT), "exact": opt(INT),
    "max_ulp": opt(NUM), "first_failures": COORDS, "note": opt(STR), "model": opt(STR), "max_err_ulps": opt(NUM),
    "max_bound_fraction": opt(NUM), "warnings": opt(INT), "map": MAP, "ulp_hist": HIST,
    "worst_warnings": list_of(obj({"index": list_of(INT), "err_ulps": NUM, "ratio": NUM, "bound_fraction": opt(NUM)},
                                  required=("index", "err_ulps", "ratio"))),
}, required=("stage", "verdict"))  # fmt: skip

END_TO_END = obj({
    "mode": opt(STR), "verdict": STR, "elements": opt(INT), "differing": opt(INT), "explained": opt(INT),
    "unexplained": opt(INT), "nan_mismatches": opt(INT), "signed_zero_mismatches": opt(INT), "max_ulp": opt(NUM),
    "first_differences": COORDS, "first_failures": COORDS, "causes": dict_of(INT),
    "rows": list_of(obj({"row": INT, "differing": opt(INT), "unexplained": opt(INT), "causes": STRS},
                        required=("row",))),
    "failure_details": list_of(obj({"index": list_of(INT), "kernel": opt(NUM), "golden": opt(NUM), "lo": opt(NUM),
                                    "hi": opt(NUM), "why": opt(STR)})),
    "map": MAP, "unexplained_map": MAP, "ulp_hist": HIST, "note": opt(STR),
})  # fmt: skip

INVARIANCE = obj({
    "name": STR, "required": opt(BOOL), "outcome": opt(STR), "runs": opt(INT), "note": opt(STR),
    "details": obj({"rows": opt(INT), "rows_equal": opt(INT), "rows_differing": list_of(INT), "max_ulp": opt(NUM)}),
}, required=("name",))  # fmt: skip

META = obj({
    "M": INT, "k": opt(INT), "E": opt(INT), "H": opt(INT), "I": opt(INT), "pad_to": opt(INT), "seed": opt(INT),
    "shape": opt(STR), "profile": opt(STR), "phase_seconds": dict_of(NUM), "seconds": opt(NUM),
})  # fmt: skip

CASE = obj({
    "case_id": STR, "path": STR, "mode": opt(STR), "verdict": STR, "warnings": opt(INT), "meta": META,
    "digests": opt(dict_of(STR)), "stages": list_of(STAGE), "end_to_end": opt(END_TO_END),
    "invariance": opt(list_of(INVARIANCE)), "diagnosis": opt(STRS),
}, required=("case_id", "verdict"))  # fmt: skip

SOURCE_DIGEST = obj({"algorithm": STR, "digest": STR, "dirs": STRS, "files": dict_of(STR)})

ENV = obj({
    "backend": opt(STR), "gpu": opt(STR), "cuda": opt(STR), "driver": opt(STR), "git_commit": opt(STR),
    "git_dirty": opt(STRS), "date_utc": opt(STR), "profile": opt(one_of("cpu", "gpu", "gpu-full")), "filters": STRS,
    "command": opt(STR), "cases_run": opt(STR), "run_seconds": opt(NUM), "jobs": opt(INT), "incomplete": opt(STR),
    "black_box": opt(BOOL), "invariance": opt(BOOL), "checkpoint": opt(STR), "source_digest": opt(SOURCE_DIGEST),
    "rerun": opt(obj({"report": opt(STR), "previous_run": opt(STR), "previous_commit": opt(STR),
                      "previous_run_seconds": opt(NUM), "previous_jobs": opt(INT), "rerun_cases": STRS})),
})  # fmt: skip

MUTATION = obj({
    "killed": opt(INT), "named": opt(INT), "total": opt(INT), "kill_rate": opt(NUM), "catalogue": STRS,
    "untested": opt(STRS), "error": opt(STR),
    "results": opt(list_of(obj({"fault": opt(STR), "name": opt(STR), "path": opt(STR), "case_id": opt(STR),
                                "injection": opt(STR), "killed": opt(BOOL), "named": opt(BOOL), "verdict": opt(STR),
                                "failed_stages": opt(STRS), "diagnosis": opt(STRS), "note": opt(STR)}))),
})  # fmt: skip

_OUTPUT = obj({"case_id": STR, "output": STR}, required=("case_id", "output"))
BASELINE = obj({
    "other": opt(STR), "other_commit": opt(STR), "other_date": opt(STR), "other_backend": opt(STR),
    "cases_compared": opt(INT), "unchanged_cases": INT,
    "verdict_changes": list_of(obj({"case_id": STR, "before": STR, "after": STR, "direction": STR},
                                   required=("case_id", "before", "after", "direction"))),
    "digest_changes": list_of(obj({"case_id": STR, "output": STR, "before": STR, "after": STR},
                                  required=("case_id", "output", "before", "after"))),
    "outputs_only_here": list_of(_OUTPUT), "outputs_only_there": list_of(_OUTPUT), "cases_only_here": STRS,
    "cases_only_there": STRS, "sources_changed": opt(STRS),
}, required=("cases_compared", "unchanged_cases", "verdict_changes", "digest_changes", "outputs_only_here",
             "outputs_only_there", "cases_only_here", "cases_only_there"))  # fmt: skip

REPORT = obj({
    "schema": opt(STR), "env": ENV, "totals": dict_of(INT), "cases": list_of(CASE), "mutation": opt(MUTATION),
    "baseline": opt(BASELINE), "gpu_report": opt(obj({"status": opt(STR), "line": opt(STR)})), "trimmed": opt(STR),
}, required=("cases",))  # fmt: skip


def validate_report(data) -> None:
    """Check that ``data`` (a loaded report.json) has the structure described in the module docstring.

    Raises:
        ReportSchemaError (a ValueError): the first field of a wrong type, as ``field <path>: expected <type>,
        got <what>``, or a required field absent, as ``field <path>: missing`` (one line; ``path`` like
        ``cases[2].digests['out']``); for a non-object ``data`` the path is ``(top level)``.
    """
    if not isinstance(data, dict):
        raise ReportSchemaError("(top level)", "an object", data)
    REPORT(data, "")
