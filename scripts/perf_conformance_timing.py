"""Where the gpu conformance profile spends its time: per sampled case, seconds for inputs, first run (incl.
Triton compiles), a warm run, the comparison and the invariances. Output: one JSON line per case + a table.

    PYTHONPATH=$PWD python3 scripts/perf_conformance_timing.py [--filter S ...] [--invariance] > timing.txt
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", default=[], help="case id (repeatable)")
    ap.add_argument("--invariance", action="store_true")
    args = ap.parse_args()
    from flint_moe.ops import make_route_counter

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    counter = make_route_counter(dev)
    t_all = time.perf_counter()
    for cid in args.case:
        row = {"case": cid}
        try:
            _one(cid, row, dev, counter, args.invariance)
        except Exception as e:  # report and go on: this is a timing probe
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        if torch.cuda.is_available():
            row["max_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(json.dumps(row), flush=True)
    print(json.dumps({"total_s": time.perf_counter() - t_all}), flush=True)


def _one(cid, row, dev, counter, invariance):
    from flint_moe.conformance import compare
    from flint_moe.conformance.cases import Case, make_inputs
    from flint_moe.conformance.invariance import check_invariances
    from flint_moe.conformance.paths import PATHS

    if True:
        case = Case.from_id(cid)
        t = time.perf_counter()
        inputs = make_inputs(case, dev)
        _sync()
        row["inputs_s"] = time.perf_counter() - t
        path = PATHS[case.path]
        for key in ("run1_s", "run2_s"):
            taps: dict = {}
            t = time.perf_counter()
            out = path.run(inputs, counter, taps)
            _sync()
            row[key] = time.perf_counter() - t
        t = time.perf_counter()
        res = compare.compare_case(case, inputs, taps, out)
        _sync()
        row["compare_s"] = time.perf_counter() - t
        row["verdict"] = res.verdict
        if invariance:
            t = time.perf_counter()
            inv = check_invariances(case, inputs, path, counter, out, taps)
            _sync()
            row["invariance_s"] = time.perf_counter() - t
            row["invariance"] = {i.name: i.outcome for i in inv}


if __name__ == "__main__":
    main()
