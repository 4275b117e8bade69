"""Where a conformance run's wall time goes: one log line (the CLI prints it before the freshness line).

The parallel runner's ``env.run_seconds`` covers the cases; a gpu-profile run's ``conformance wall`` (scripts/h200.sh)
also holds the interpreter's start and imports, the CLI's set-up (case matrix, baseline, staging, environment) and
the judging of the whole run and the report files. :func:`wall_line` names each part so that a run over its
budget says which one grew.
"""

from __future__ import annotations

import os

__all__ = ["process_seconds", "wall_line"]


def process_seconds() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat`` start time against ``/proc/uptime``), or
    None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def wall_line(process_s: float | None, setup_s: float, run_s: float, report_s: float) -> str:
    """One log line splitting a run's wall time: ``process_s`` seconds from the process's start to the report
    written (None: unknown; the console summary after it is not counted), of which ``setup_s`` from the CLI's entry
    to the first case (matrix, baseline, staging, environment), ``run_s`` the cases (``env.run_seconds``) and
    ``report_s`` the judging of the whole run and the report files; the rest (interpreter start and imports before
    the entry) is named ``start-up``."""
    parts = [f"set-up {setup_s:.1f} s", f"cases {run_s:.1f} s", f"report {report_s:.1f} s"]
    if process_s is not None:
        startup = process_s - setup_s - run_s - report_s
        parts.insert(0, f"start-up {max(0.0, startup):.1f} s")
        return f"wall {process_s:.1f} s: " + ", ".join(parts)
    return "wall: " + ", ".join(parts)
