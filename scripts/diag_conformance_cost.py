"""Where the gpu conformance profile's time goes: one device call.

Times the mutation self-test, then runs a stride sample of the gpu matrix (every --stride-th case, all paths
and shapes) with invariances, under cProfile; writes per-case phase seconds and the profile's top functions
to --out. Not a test; a measurement script (METHOD.md: measure before changing)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--budget", type=float, default=200.0, help="stop starting cases after this many seconds")
    ap.add_argument("--mutation", action="store_true")
    ap.add_argument("--ids", nargs="*", default=None, help="profile these case ids instead of a stride sample")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from flint_moe.conformance.inputs.cases import matrix
    from flint_moe.conformance.run.runner import run_case
    from flint_moe.ops import make_route_counter

    dev = torch.device("cuda")
    t_start = time.perf_counter()
    rec: dict = {"cases": []}
    if a.mutation:
        from flint_moe.conformance.judge.mutation import mutation_report, run_mutations

        t0 = time.perf_counter()
        pr = cProfile.Profile()
        pr.enable()
        rep = mutation_report(run_mutations())
        pr.disable()
        rec["mutation_seconds"] = time.perf_counter() - t0
        rec["mutation_kill"] = f"{rep['killed']}/{rep['total']}"
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(50)
        (out / "mutation_profile.txt").write_text(s.getvalue())
    cases = [c for c in matrix("gpu") if c.id in set(a.ids)] if a.ids else matrix("gpu")[:: a.stride]
    counter = make_route_counter(dev)
    pr = cProfile.Profile()
    for c in cases:
        if time.perf_counter() - t_start > a.budget:
            break
        pr.enable()
        try:
            r = run_case(c, dev, counter, invariance=True)
            rec["cases"].append(
                {"id": c.id, "verdict": r.verdict, **{k: r.meta.get(k) for k in ("seconds", "phase_seconds")}}
            )
        except Exception as e:  # noqa: BLE001
            rec["cases"].append({"id": c.id, "error": repr(e)})
        pr.disable()
        (out / "cases.json").write_text(json.dumps(rec, indent=1))
        print(rec["cases"][-1], flush=True)
    for key, name in (("cumulative", "cases_profile_cum.txt"), ("tottime", "cases_profile_tot.txt")):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(70)
        (out / name).write_text(s.getvalue())
    rec["total_seconds"] = time.perf_counter() - t_start
    (out / "cases.json").write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
