"""Capture and verify the bit-exact special-function emulation (flint_moe.reference.mufu) on the GPU.

``python -m flint_moe.tools.mufu capture --out DIR``
    Runs the hardware instructions (flint_moe.kernels.audit.probes) on each table's canonical domain, builds the
    correctly rounded bases (RN32 of f64 on CPU and on CUDA + exact override list, see reference/mufu.py), and
    writes ``DIR/mufu_tables.npz`` (2-bit packed deltas, override lists, expf exception list) and
    ``DIR/mufu_tables.json`` (provenance: GPU, driver, CUDA, torch, triton, date, command, shapes, counts,
    sha256 of the npz). Needs a CUDA device.

``python -m flint_moe.tools.mufu verify [--tables NPZ] [--report FILE] [--dump NPZ]``
    Sweeps ALL 2^32 fp32 inputs through rcp/ex2/rsqrt and all 65,536 bf16 inputs through expf, hardware
    probe vs the emulation running on CUDA tensors (NaN compared as NaN-ness, everything else bit for bit),
    and checks that every correctly rounded base gives identical bits on CPU and CUDA over its canonical
    domain. Prints a table of mismatches per function with example inputs; exit code 1 if any mismatch.

``--simulate`` (both commands) replaces the hardware by a stand-in so the plumbing can be exercised on a CPU:
captured tables are then NOT hardware tables, and a simulated verify proves nothing about the hardware.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
import torch

from flint_moe.reference import mufu

_N23 = 1 << 23
_BASES = {"rsqrt": "rsqrt", "ex2_pos": "exp2", "ex2_neg": "exp2", "expf": "exp"}


# ------------------------------------------------------------------------------------------------------------
# environment


def environment(device: str) -> dict:
    """Versions and device facts for provenance and reports."""
    import triton

    env = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "command": " ".join(["python -m flint_moe.tools.mufu"] + sys.argv[1:]),
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        env["capability"] = f"sm_{major}{minor}"
        try:
            out = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=True,
                )
                .stdout.strip()
                .splitlines()
            )
            env["driver"] = out[0] if out else "unknown"
        except Exception as exc:  # pragma: no cover - depends on the machine
            env["driver"] = f"unknown ({type(exc).__name__})"
    else:
        env["gpu"] = "none (simulated hardware)"
        env["driver"] = "none"
    try:
        env["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except Exception:
        # The GPU machine receives a copy of the tree without .git: the caller passes the commit it sent.
        env["git_commit"] = os.environ.get("FLINT_GIT_COMMIT", "unknown")
    return env


def _hardware(simulate: bool):
    """name -> function(fp32 tensor) -> fp32 tensor: the probes, or a CPU stand-in when simulating."""
    if not simulate:
        from flint_moe.kernels.audit.probes import PROBES

        return PROBES
    return {
        "rcp": mufu.rcp_approx_ftz,
        "ex2": mufu.ex2_approx_ftz,
        "rsqrt": mufu.rsqrt_approx_ftz,
        "expf": mufu.expf_libdevice,
    }


def _simulated_capture_hw(name: str, x: torch.Tensor, base_bits: torch.Tensor) -> torch.Tensor:
    """Stand-in hardware for a simulated capture: base + a fixed pseudo-random delta pattern (not data)."""
    i = torch.arange(x.numel(), dtype=torch.int64, device=x.device)
    d = ((i * 2654435761) >> 7) % 5
    d = torch.where(d >= 3, torch.zeros_like(d), d - 1).to(torch.int32)  # {-1, 0, +1}
    if name == "expf":
        d = torch.where(torch.isfinite(x) & (x.abs() > 1.0) & (i % 29 == 0), d, torch.zeros_like(d))
    return (base_bits + d).view(torch.float32)


# ------------------------------------------------------------------------------------------------------------
# correctly rounded bases: override list


def near_midpoint(v64: np.ndarray, margin: float = mufu.OVERRIDE_MARGIN) -> np.ndarray:
    """Mask of f64 values within ``margin`` fp32-ulps of an fp32 rounding midpoint (NaN: False).

    r = RN32(v); the midpoints next to r are (r + next(r)) / 2 and (r + prev(r)) / 2, exact in f64; the ulp
    is the gap on that side. An infinite r is treated as 2^128 with the FLT_MAX / 2^128 midpoint below it.
    """
    v = np.asarray(v64, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        r32 = v.astype(np.float32)
    r = r32.astype(np.float64)
    up = np.nextafter(r32, np.float32(np.inf)).astype(np.float64)
    dn = np.nextafter(r32, np.float32(-np.inf)).astype(np.float64)
    flt_max = float(np.finfo(np.float32).max)
    up = np.where(np.isinf(up) & np.isfinite(r), 2.0**128, up)
    pinf = np.isposinf(r) & np.isfinite(v)
    r = np.where(pinf, 2.0**128, r)
    dn = np.where(pinf, flt_max, dn)
    up = np.where(pinf, 2.0**128 + 2.0**104, up)
    with np.errstate(invalid="ignore"):
        near_up = np.abs(v - (r + up) / 2) < margin * (up - r)
        near_dn = np.abs(v - (r + dn) / 2) < margin * (r - dn)
    return (near_up | near_dn) & np.isfinite(v)


def exact_value(base: str, x: float) -> Decimal:
    """The exact function value as a 60-digit Decimal: rsqrt(x), 2^x or e^x (x finite)."""
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(x)
        if base == "rsqrt":
            return 1 / d.sqrt()
        if base == "exp2":
            return (d * Decimal(2).ln()).exp()
        if base == "exp":
            return d.exp()
    raise ValueError(f"base: unknown {base!r}")


def nearest_f32_bits(value: Decimal, approx: float) -> int:
    """Bits of the fp32 nearest to ``value`` (>= 0), searched among ``approx`` and its fp32 neighbours.

    Raises ArithmeticError when the value lies within 1e-45 (relative) of the midpoint of the two nearest
    candidates, i.e. when 60 digits could not decide the rounding.
    """
    a = np.float32(approx)
    cands = {a, np.nextafter(a, np.float32(np.inf)), np.nextafter(a, np.float32(-np.inf))}
    scored = []
    for c in cands:
        if not np.isfinite(c) or c < 0:
            continue
        scored.append((abs(Decimal(float(c)) - value), c))
    scored.sort(key=lambda t: t[0])
    (d1, c1), (d2, _) = scored[0], scored[1]
    if d2 - d1 <= value * Decimal("1e-45"):
        raise ArithmeticError(f"cannot decide the rounding of {value} (nearest {float(c1)!r})")
    return int(np.array(c1, dtype=np.float32).view(np.uint32))


def build_overrides(base: str, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Canonical inputs of ``x`` (CPU fp32) whose f64 base value is near a midpoint on CPU or on CUDA.

    Returns (positions in x, correct fp32 bits as uint32), each resolved exactly
    (exact_value / nearest_f32_bits).
    """
    v_cpu = _raw64(base, x)
    mask = near_midpoint(v_cpu)
    if torch.cuda.is_available():
        mask |= near_midpoint(_raw64(base, x.cuda()))
    pos = np.flatnonzero(mask)
    xs = x.numpy()
    bits = np.empty(pos.size, dtype=np.uint32)
    for i, p in enumerate(pos):
        bits[i] = nearest_f32_bits(exact_value(base, float(xs[p])), float(np.float32(v_cpu[p])))
    return pos, bits


def _raw64(base: str, x: torch.Tensor) -> np.ndarray:
    return mufu._base64(base, x).cpu().numpy()


# ------------------------------------------------------------------------------------------------------------
# capture


def _delta_counts(d: np.ndarray) -> dict[str, int]:
    vals, counts = np.unique(d, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(vals, counts, strict=False)}


def capture(out: Path, simulate: bool = False) -> dict:
    """Build the tables from the hardware (a stand-in when ``simulate``) into ``out``; return the json."""
    device = "cpu" if simulate else "cuda"
    if not simulate and not torch.cuda.is_available():
        raise SystemExit("capture needs a CUDA device (use --simulate for a CPU dry run)")
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    hw = _hardware(simulate)
    arrays: dict[str, np.ndarray] = {}
    info: dict = {"deltas": {}, "overrides": {}, "timings_s": {}}
    t0 = time.time()

    # --- overrides (correct rounding of the f64 bases), shared by CPU and CUDA
    x_rsqrt = mufu.canonical_inputs("rsqrt")
    x_pos, x_neg = mufu.canonical_inputs("ex2_pos"), mufu.canonical_inputs("ex2_neg")
    x_exp = mufu.canonical_inputs("expf")
    p, b = build_overrides("rsqrt", x_rsqrt)
    arrays["rsqrt_override_index"], arrays["rsqrt_override_bits"] = p.astype(np.int64), b
    x2 = torch.cat([x_pos, x_neg[1:]])
    p, b = build_overrides("exp2", x2)
    k = np.rint(x2.double().numpy()[p] * 2.0**23).astype(np.int64)
    order = np.argsort(k)
    arrays["exp2_override_index"], arrays["exp2_override_bits"] = k[order], b[order]
    finite = torch.isfinite(x_exp)
    p, b = build_overrides("exp", torch.where(finite, x_exp, torch.zeros_like(x_exp)))
    keep = finite.numpy()[p]
    arrays["exp_override_index"], arrays["exp_override_bits"] = p[keep].astype(np.int64), b[keep]
    for name in ("rsqrt", "exp2", "exp"):
        info["overrides"][name] = int(arrays[f"{name}_override_index"].size)
    info["timings_s"]["overrides"] = round(time.time() - t0, 2)

    # --- bases with overrides, computed by the module itself from a provisional npz holding the overrides
    tmp = out / "mufu_tables.overrides-only.npz"
    np.savez_compressed(tmp, **arrays)
    mufu.use_tables(tmp)
    try:
        for name, base_fn in (
            ("rcp", mufu.rcp_rn),
            ("rsqrt", mufu.rsqrt_rn),
            ("ex2_pos", mufu.exp2_rn),
            ("ex2_neg", mufu.exp2_rn),
        ):
            x = mufu.canonical_inputs(name, device)
            base = base_fn(x).view(torch.int32)
            hw_bits = hw_capture(hw, name, x, base, simulate).view(torch.int32)
            d = (hw_bits.to(torch.int64) - base.to(torch.int64)).cpu().numpy()
            if d.min() < -2 or d.max() > 1:
                raise SystemExit(f"{name}: hardware delta outside {{-2..1}}: range [{d.min()}, {d.max()}]")
            arrays[f"{name}_delta"] = mufu.pack_deltas(d)
            info["deltas"][name] = _delta_counts(d)
        # expf: exceptions vs the correctly rounded e^x (NaN compared as NaN-ness)
        x = mufu.canonical_inputs("expf", device)
        base = mufu.exp_rn(x)
        hwv = hw_capture(hw, "expf", x, base.view(torch.int32), simulate)
        hb, bb = hwv.view(torch.int32), base.view(torch.int32)
        diff = (torch.isnan(hwv) != torch.isnan(base)) | (~torch.isnan(hwv) & (hb != bb))
        idx = torch.nonzero(diff).flatten().cpu().numpy()
        arrays["expf_exception_index"] = idx.astype(np.int64)
        arrays["expf_exception_bits"] = hb.cpu().numpy()[idx].view(np.uint32)
        info["expf"] = _expf_summary(x.cpu(), base.cpu(), hwv.cpu(), idx)
    finally:
        mufu.use_tables(None)
        tmp.unlink(missing_ok=True)
    arrays["format_version"] = np.array([1], dtype=np.int64)
    info["timings_s"]["capture"] = round(time.time() - t0, 2)

    npz = out / "mufu_tables.npz"
    np.savez_compressed(npz, **arrays)
    sha = hashlib.sha256(npz.read_bytes()).hexdigest()
    meta = {
        "what": "bit-exact tables for flint_moe.reference.mufu "
        "(rcp/ex2/rsqrt.approx.ftz.f32, libdevice expf)",
        "simulated": simulate,
        "environment": env,
        "npz": npz.name,
        "npz_sha256": sha,
        "npz_bytes": npz.stat().st_size,
        "format_version": 1,
        "delta_encoding": "2-bit codes delta+2, four per byte, element 4i in bits 0-1",
        "override_margin_fp32_ulp": mufu.OVERRIDE_MARGIN,
        "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(arrays.items())},
        **info,
    }
    (out / "mufu_tables.json").write_text(json.dumps(meta, indent=2) + "\n")
    # self-check: the freshly written tables reproduce the captured hardware bits on the canonical domains
    mufu.use_tables(npz)
    try:
        for name in ("rcp", "rsqrt", "ex2_pos", "ex2_neg", "expf"):
            x = mufu.canonical_inputs(name, device)
            emu = _emulate_canonical(name, x)
            ref = hw_capture(hw, name, x, None, simulate, base_fn_name=name)
            bad = _mismatch(ref, emu)
            if int(bad.sum()):
                raise SystemExit(f"capture self-check failed for {name}: {int(bad.sum())} mismatches")
    finally:
        mufu.use_tables(None)
    return meta


_SIM_CACHE: dict = {}


def hw_capture(hw, name, x, base_bits, simulate, base_fn_name=None):
    """Hardware output on a canonical domain (``simulate``: base + a fixed pattern, cached for the check)."""
    if simulate:
        if base_bits is None:
            return _SIM_CACHE[base_fn_name]
        y = _simulated_capture_hw(name, x, base_bits)
        _SIM_CACHE[name] = y
        return y
    fn = hw["ex2"] if name.startswith("ex2") else hw[name]
    return fn(x)


def _emulate_canonical(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "rcp":
        return mufu.rcp_approx_ftz(x)
    if name == "rsqrt":
        return mufu.rsqrt_approx_ftz(x)
    if name.startswith("ex2"):
        return mufu.ex2_approx_ftz(x)
    return mufu.expf_libdevice(x)


def _expf_summary(x: torch.Tensor, base: torch.Tensor, hwv: torch.Tensor, idx: np.ndarray) -> dict:
    xb = x[idx]
    hb = hwv.view(torch.int32)[idx].to(torch.int64)
    bb = base.view(torch.int32)[idx].to(torch.int64)
    tiny = float(np.finfo(np.float32).tiny)
    sub = (base[idx].abs() < tiny).numpy()
    d = (hb - bb).numpy()
    normal = ~sub
    return {
        "exceptions": int(idx.size),
        "exceptions_normal_result": int(normal.sum()),
        "normal_above": int((d[normal] > 0).sum()),
        "normal_below": int((d[normal] < 0).sum()),
        "normal_delta_counts": _delta_counts(d[normal]),
        "exceptions_subnormal_or_zero_base": int(sub.sum()),
        "hw_zero_where_base_subnormal": int(((hwv[idx] == 0).numpy() & sub).sum()),
        "example_inputs": [float(v) for v in xb[:8]],
        "subnormal_results_kept_by_hw": int(((hwv.abs() < tiny) & (hwv != 0) & torch.isfinite(hwv)).sum()),
    }


# ------------------------------------------------------------------------------------------------------------
# verify


def _mismatch(hwv: torch.Tensor, emu: torch.Tensor) -> torch.Tensor:
    hn, en = torch.isnan(hwv), torch.isnan(emu)
    return (hn != en) | (~hn & (hwv.view(torch.int32) != emu.view(torch.int32)))


def _sweep_bits(lo: int, hi: int, device: str) -> torch.Tensor:
    b = torch.arange(lo, hi, dtype=torch.int64, device=device)
    b = torch.where(b >= 1 << 31, b - (1 << 32), b)
    return b.to(torch.int32)


def verify(
    tables: Path | None,
    report: Path | None,
    dump: Path | None,
    simulate: bool,
    chunk_log2: int,
    limit_chunks: int | None,
) -> int:
    device = "cpu" if simulate else "cuda"
    if not simulate and not torch.cuda.is_available():
        raise SystemExit("verify needs a CUDA device (use --simulate for a CPU dry run)")
    path = mufu.use_tables(tables)
    env = environment(device)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    hw = _hardware(simulate)
    emus = {"rcp": mufu.rcp_approx_ftz, "ex2": mufu.ex2_approx_ftz, "rsqrt": mufu.rsqrt_approx_ftz}
    rows = []
    dumps: dict[str, np.ndarray] = {}
    chunk = 1 << chunk_log2
    nchunks = (1 << 32) // chunk if limit_chunks is None else limit_chunks
    for name, emu_fn in emus.items():
        t0 = time.time()
        total, bad_total, examples, samples = 0, 0, [], []
        hist = torch.zeros(512, dtype=torch.int64)
        for c in range(nchunks):
            # spread a limited (simulated) sweep over the whole bit range
            start = c * chunk if limit_chunks is None else (c * ((1 << 32) // nchunks))
            bits = _sweep_bits(start, start + chunk, device)
            x = bits.view(torch.float32)
            hwv = hw[name](x)
            emu = emu_fn(x)
            bad = _mismatch(hwv, emu)
            nb = int(bad.sum())
            total += bits.numel()
            if nb:
                bad_total += nb
                ib = bits[bad]
                hist += torch.bincount(((ib >> 23) & 0x1FF).to(torch.int64).cpu(), minlength=512)
                if len(samples) < 64:
                    sel = torch.stack(
                        [ib[:4096], hwv[bad][:4096].view(torch.int32), emu[bad][:4096].view(torch.int32)],
                        dim=1,
                    )
                    samples.append(sel.cpu().numpy())
                if len(examples) < 4:
                    for v in ib[:4].tolist():
                        examples.append(v & 0xFFFFFFFF)
            del bits, x, hwv, emu, bad
        if device == "cuda":
            torch.cuda.synchronize()
        rows.append(_row(name, total, bad_total, examples[:4], time.time() - t0))
        if bad_total:
            dumps[f"{name}_samples"] = np.concatenate(samples)
            dumps[f"{name}_exp_sign_hist"] = hist.numpy()
    # expf over all bf16 inputs
    t0 = time.time()
    x = mufu.canonical_inputs("expf", device)
    hwv, emu = hw["expf"](x), mufu.expf_libdevice(x)
    bad = _mismatch(hwv, emu)
    ex = [int(v) & 0xFFFFFFFF for v in x.view(torch.int32)[bad][:4].tolist()]
    rows.append(_row("expf (bf16 inputs)", x.numel(), int(bad.sum()), ex, time.time() - t0))
    if int(bad.sum()):
        dumps["expf_samples"] = (
            torch.stack([x.view(torch.int32)[bad], hwv.view(torch.int32)[bad], emu.view(torch.int32)[bad]], 1)
            .cpu()
            .numpy()
        )
    # bases: CPU vs CUDA over canonical domains
    base_rows = []
    for name, fn in (
        ("rcp_rn", mufu.rcp_rn),
        ("rsqrt_rn", mufu.rsqrt_rn),
        ("exp2_rn (+)", mufu.exp2_rn),
        ("exp2_rn (-)", mufu.exp2_rn),
        ("exp_rn", mufu.exp_rn),
    ):
        dom = {
            "rcp_rn": "rcp",
            "rsqrt_rn": "rsqrt",
            "exp2_rn (+)": "ex2_pos",
            "exp2_rn (-)": "ex2_neg",
            "exp_rn": "expf",
        }[name]
        xc = mufu.canonical_inputs(dom, "cpu")
        a = fn(xc)
        other = "cuda" if not simulate else "cpu"
        bdev = fn(xc.to(other)).cpu()
        nb = int(_mismatch(a, bdev).sum())
        base_rows.append((name, xc.numel(), nb))
    text = _report_text(env, path, sha, rows, base_rows, simulate)
    print(text)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(text)
    if dump is not None and dumps:
        dump.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(dump, **dumps)
    failed = any(r[2] for r in rows) or any(r[2] for r in base_rows)
    return 1 if failed else 0


def _row(name, total, bad, examples, secs):
    return (name, total, bad, " ".join(f"0x{v:08X}" for v in examples), secs)


def _report_text(env, path, sha, rows, base_rows, simulate) -> str:
    lines = []
    title = (
        "flint-moe mufu verify: hardware special functions vs flint_moe.reference.mufu (emulation on CUDA)"
    )
    lines.append(title)
    lines.append("=" * len(title))
    if simulate:
        lines.append("*** SIMULATED: no GPU, the 'hardware' is the emulation itself; proves nothing ***")
    for key in (
        "date_utc",
        "gpu",
        "capability",
        "driver",
        "cuda",
        "torch",
        "triton",
        "python",
        "git_commit",
        "command",
    ):
        if key in env:
            lines.append(f"{key:>11}: {env[key]}")
    lines.append(f"{'tables':>11}: {path.name} sha256 {sha}")
    lines.append("")
    lines.append("Hardware vs emulation (NaN compared as NaN-ness, all else bit for bit):")
    w = max(len(r[0]) for r in rows)
    lines.append(
        f"  {'function':<{w}}  {'inputs':>13}  {'mismatches':>10}  {'seconds':>7}  example inputs (bits)"
    )
    for name, total, bad, ex, secs in rows:
        lines.append(f"  {name:<{w}}  {total:>13,}  {bad:>10,}  {secs:>7.1f}  {ex or '-'}")
    lines.append("")
    lines.append("Correctly rounded bases, CPU vs CUDA bits over each canonical domain:")
    for name, total, bad in base_rows:
        lines.append(f"  {name:<12} {total:>11,} inputs  {bad:>6,} differ")
    ok = not any(r[2] for r in rows) and not any(r[2] for r in base_rows)
    lines.append("")
    lines.append(
        "RESULT: "
        + (
            "0 mismatches for all four functions; bases identical on CPU and CUDA"
            if ok
            else "MISMATCHES FOUND"
        )
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flint_moe.tools.mufu", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="capture the tables on the GPU")
    c.add_argument("--out", type=Path, required=True, help="folder for mufu_tables.npz / .json")
    c.add_argument("--simulate", action="store_true", help="CPU dry run with stand-in hardware")
    v = sub.add_parser("verify", help="exhaustive hardware vs emulation check on the GPU")
    v.add_argument("--tables", type=Path, default=None, help="npz to verify (default: the committed tables)")
    v.add_argument("--report", type=Path, default=None, help="write the report text here")
    v.add_argument("--dump", type=Path, default=None, help="npz of mismatch samples (only if any)")
    v.add_argument("--simulate", action="store_true", help="CPU dry run (hardware := emulation)")
    v.add_argument("--chunk-log2", type=int, default=28, help="sweep chunk size, log2 (default 28)")
    v.add_argument("--limit-chunks", type=int, default=None, help="sweep only this many chunks (dry runs)")
    a = ap.parse_args(argv)
    if a.cmd == "capture":
        meta = capture(a.out, a.simulate)
        print(
            json.dumps(
                {k: meta[k] for k in ("npz_sha256", "npz_bytes", "deltas", "overrides", "expf", "timings_s")},
                indent=2,
            )
        )
        return 0
    return verify(a.tables, a.report, a.dump, a.simulate, a.chunk_log2, a.limit_chunks)


if __name__ == "__main__":
    sys.exit(main())
