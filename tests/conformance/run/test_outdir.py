"""``run.outdir.prepare_staging``: the checks before a run and the staging directory, shared by the CLI and
``scripts/h200_pending.py``."""

from __future__ import annotations

import pytest

from flint_moe.conformance.run.outdir import OutDirError, RunKind, prepare_staging


def _kind() -> RunKind:
    return RunKind(False, "cpu", ())


def test_creates_the_staging_directory_beside_out(tmp_path) -> None:
    staging = prepare_staging(tmp_path / "out", "20261203T000000Z-cpu-abcdef", _kind(), overwrite=False)
    assert staging == tmp_path / ".out.partial-20261203T000000Z-cpu-abcdef"
    assert staging.is_dir() and not (tmp_path / "out").exists()


def test_refuses_a_non_empty_out_without_overwrite(tmp_path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.json").write_text("{}")
    with pytest.raises(OutDirError, match="directory not empty"):
        prepare_staging(tmp_path / "out", "r1", _kind(), overwrite=False)
    assert prepare_staging(tmp_path / "out", "r1", _kind(), overwrite=True).is_dir()


def test_an_existing_staging_directory_is_an_out_dir_error(tmp_path) -> None:
    prepare_staging(tmp_path / "out", "r2", _kind(), overwrite=False)
    with pytest.raises(OutDirError, match=r"cannot create .*\.out\.partial-r2"):
        prepare_staging(tmp_path / "out", "r2", _kind(), overwrite=False)
