"""Where a conformance run writes its report: ``--out`` checks, the committed-evidence guard, the staging
directory and the replace at the end of the run.

- :func:`check_out` (before the first case): ``--out`` must not be an existing file, its nearest existing
  ancestor must be a writable directory, and a non-empty directory is refused unless ``--overwrite``.
- :func:`evidence_guard` (before the first case): the committed GPU evidence (:data:`EVIDENCE_DIRS` under the
  repository root, paths resolved) may only be written by a complete gpu-profile run on a GPU
  (:class:`RunKind`), ``--overwrite`` or not.
- :func:`staging_dir` / :func:`publish`: the report is written into a sibling directory
  ``.<name>.partial-<run id>`` and renamed onto ``--out`` when the run completes: an existing ``--out`` is
  first renamed aside (``.<name>.old-<run id>``), then the staging directory takes its name, then the old one
  is deleted. Files of the old directory other than :data:`REPORT_FILES` (a README, logs) are copied into the
  new one first. A run that does not complete (SIGTERM / SIGINT: an INCOMPLETE report) is never published:
  its report stays in the staging directory, whose path the CLI prints, and ``--out`` is left as it was.
- :func:`new_run_id`: ``<UTC time>-<profile>-<6 hex digits>``, unique for runs started in the same second.
"""

from __future__ import annotations

import datetime
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EVIDENCE_DIRS",
    "REPORT_FILES",
    "OutDirError",
    "RunKind",
    "check_out",
    "evidence_dir",
    "evidence_guard",
    "new_run_id",
    "prepare_staging",
    "publish",
    "staging_dir",
]

#: Directories of committed GPU evidence, relative to the repository root (each with everything under it).
EVIDENCE_DIRS = ("reports/h200", "reports/gpu")
#: The files a run writes (``report.write_report``); publishing replaces these and keeps any other file.
REPORT_FILES = ("report.json", "summary.md", "summary-full.md", "report.html")


class OutDirError(ValueError):
    """``--out`` cannot take this run's report (the message is one line naming the directory)."""


@dataclass(frozen=True)
class RunKind:
    """What a run covers, for :func:`evidence_guard`: ``gpu`` (kernels compiled for a CUDA GPU, not the
    Triton interpreter), ``profile`` (``"cpu"`` / ``"gpu"``), ``partial`` (why the run does not cover the whole
    profile with its default checks: ``"filtered (S)"``, ``"--rerun-failed"``, ``"--black-box"``,
    ``"--no-invariance"``, ...; empty for a complete run)."""

    gpu: bool
    profile: str
    partial: tuple[str, ...] = ()

    @property
    def complete_gpu(self) -> bool:
        """A complete gpu-profile run on a GPU (the only kind that may replace committed evidence)."""
        return self.gpu and self.profile == "gpu" and not self.partial

    def describe(self) -> str:
        """The reasons it is not a complete gpu-profile GPU run, joined ("" when it is one)."""
        why = [] if self.gpu else ["a CPU run (Triton interpreter)"]
        if self.profile != "gpu":
            why.append(f"profile {self.profile!r}")
        return ", ".join(why + list(self.partial))


def _root() -> Path:
    from flint_moe.conformance.report import digest

    return digest.repo_root()


def evidence_dir(out_dir) -> Path | None:
    """The :data:`EVIDENCE_DIRS` entry (absolute) that ``out_dir`` (resolved: ``..`` and symlinks followed,
    relative to the working directory) is or lies under, else None."""
    out = Path(out_dir).resolve()
    root = _root().resolve()
    for rel in EVIDENCE_DIRS:
        ev = (root / rel).resolve()
        if out == ev or ev in out.parents:
            return ev
    return None


def evidence_guard(out_dir, run_kind: RunKind) -> None:
    """Refuse to write a report into the committed GPU evidence unless ``run_kind`` is a complete gpu-profile
    run on a GPU (:attr:`RunKind.complete_gpu`), whether or not ``--overwrite`` is given.

    Raises:
        OutDirError: ``out_dir`` is or lies under an :data:`EVIDENCE_DIRS` directory and the run is not a
        complete gpu-profile GPU run; the message names the directory and the reasons.
    """
    ev = evidence_dir(out_dir)
    if ev is None or run_kind.complete_gpu:
        return
    raise OutDirError(
        f"--out {out_dir}: refused: {ev} holds committed GPU evidence, which only a complete gpu-profile run on a "
        f"GPU may replace (even with --overwrite); this run is {run_kind.describe()}. Choose another --out."
    )


def check_out(out_dir, overwrite: bool) -> None:
    """Check before the run that ``out_dir`` can take the report.

    Raises:
        OutDirError: ``out_dir`` exists and is not a directory; its nearest existing ancestor is not a
        directory or not writable; or it is a non-empty directory and ``overwrite`` is False.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out_dir}: exists and is not a directory")
    if out.is_dir():
        if not overwrite and any(out.iterdir()):
            raise OutDirError(f"--out {out_dir}: directory not empty (pass --overwrite to replace its report)")
        parent = out.resolve().parent
    else:
        parent = out.absolute().parent
        while not parent.exists():
            parent = parent.parent
    if not parent.is_dir():
        raise OutDirError(f"--out {out_dir}: cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutDirError(f"--out {out_dir}: cannot be created: {parent} is not writable")


def new_run_id(now: datetime.datetime, profile: str) -> str:
    """``YYYYmmddTHHMMSSZ-<profile>-<6 hex digits>`` (``now`` in UTC; the random suffix keeps runs started in
    the same second apart)."""
    return now.strftime("%Y%m%dT%H%M%SZ") + f"-{profile}-{secrets.token_hex(3)}"


def staging_dir(out_dir, run_id: str) -> Path:
    """The staging directory of a run: ``.<name>.partial-<run_id>`` beside ``out_dir`` (resolved, so that a
    symlinked ``--out`` is published where it points). Not created here."""
    out = Path(out_dir).resolve()
    return out.parent / f".{out.name}.partial-{run_id}"


def prepare_staging(out_dir, run_id: str, run_kind: RunKind, overwrite: bool) -> Path:
    """Check ``out_dir`` before a run (:func:`evidence_guard`, :func:`check_out`) and create the run's staging
    directory (:func:`staging_dir`); returns it.

    Raises:
        OutDirError: a check refuses ``out_dir``, or the staging directory cannot be created (the message names
        it and the OS error).
    """
    staging = staging_dir(out_dir, run_id)
    evidence_guard(out_dir, run_kind)
    check_out(out_dir, overwrite)
    try:
        staging.mkdir(parents=True)
    except OSError as e:
        raise OutDirError(f"--out {out_dir}: cannot create {staging}: {e}") from e
    return staging


def publish(staging, out_dir, run_id: str) -> Path:
    """Make the report in ``staging`` the directory ``out_dir`` (see the module docstring) and return it.

    Files and directories of an existing ``out_dir`` other than :data:`REPORT_FILES` are copied into
    ``staging`` first; then ``out_dir`` is renamed aside, ``staging`` renamed onto it, and the old one removed.
    If the second rename fails the old directory is put back and the OSError propagates (``staging`` keeps
    the report).
    """
    staging, out = Path(staging), Path(out_dir).resolve()
    if out.is_dir():
        for entry in out.iterdir():
            if entry.name in REPORT_FILES:
                continue
            dest = staging / entry.name
            if entry.is_dir() and not entry.is_symlink():
                shutil.copytree(entry, dest, symlinks=True)
            else:
                shutil.copy2(entry, dest, follow_symlinks=False)
        aside = out.parent / f".{out.name}.old-{run_id}"
        os.rename(out, aside)
        try:
            os.rename(staging, out)
        except OSError:
            os.rename(aside, out)
            raise
        shutil.rmtree(aside)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)
    return out
