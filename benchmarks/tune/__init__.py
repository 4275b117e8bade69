"""Tuning sweeps of the kernels' launch configurations (device runs; they write the tuned tables)."""

from __future__ import annotations

import argparse
import os


def out_dir(argv, default: str, description: str | None = None) -> str:
    """The ``--out DIR`` of a sweep whose only option it is (default ``$OUT``, else ``default``), created."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=os.environ.get("OUT", default))
    out = ap.parse_args(argv).out
    os.makedirs(out, exist_ok=True)
    return out
