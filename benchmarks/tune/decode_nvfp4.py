"""Tuning of the NVFP4 decode launch configurations on the H200 (writes ``flint_moe/kernels/nvfp4/tuned.py``).

``PYTHONPATH=$PWD python3 -m benchmarks.tune.decode_nvfp4 --tune [--write-tuned PATH] [--out DIR]``: checks,
timings and the choice of ``GATE_UP`` / ``DOWN`` (and the per-shape overrides) among the CUDA-core and
tensor-core candidates. ``--down-early``: the down candidates with early weight loads and a register cap, at
DeepSeek-V3. Setup (weights, inputs, CUDA-graph timing) comes from ``benchmarks/bench_decode_nvfp4.py``; the
method and the measurements are in docs/kernels/nvfp4-decode.md. Sweeps over launch variants that lost their
measurements are in the history of ``benchmarks/bench_decode_nvfp4.py`` (with the variants).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from benchmarks.bench_decode_nvfp4 import CALLS, MODELS, _prepare, copy_bw, random_weights, time_graph


#: Tune candidates (``--tune``): complete configurations (every key of the path given, so that no value is
#: inherited from whichever defaults are current). CUDA-core ("cc") and tensor-core ("mma") paths; k = K-parts
#: (SK), f = FENCE (all code / scale loads of an asm call before its first decode).
def _mma_cfg(rows_key, rows, nw, rt, s, sk=1, fence=False):
    return {"MMA": True, rows_key: rows, "num_warps": nw, "RT": rt, "S": s, "SK": sk, "FENCE": fence}


def _gu6(bn, nw, rt, s, sk=1, **kw):
    return _mma_cfg("BN", bn, nw, rt, s, sk, **kw)


def _dn6(bh, nw, rt, s, sk=1, **kw):
    return {**_mma_cfg("BH", bh, nw, rt, s, sk, **kw), "EARLY": 0, "MAXNREG": 0}


TUNE_GU = {
    "cc-BN8w2": {"MMA": False, "BN": 8, "num_warps": 2, "BKB": 512},
    "mma-BN16w2r2s4": _gu6(16, 2, 2, 4),
    "mma-BN8w4r2s4k4": _gu6(8, 4, 2, 4, 4),
    "mma-BN8w4r2s4k4-f": _gu6(8, 4, 2, 4, 4, fence=True),
    "mma-BN8w4r2s2k4-f": _gu6(8, 4, 2, 2, 4, fence=True),
    "mma-BN16w4r2s4k2-f": _gu6(16, 4, 2, 4, 2, fence=True),
    "mma-BN16w8r2s4k4-f": _gu6(16, 8, 2, 4, 4, fence=True),
    "mma-BN16w2r2s4-f": _gu6(16, 2, 2, 4, fence=True),
}
TUNE_DN = {
    "cc-BH16w4": {"MMA": False, "BH": 16, "num_warps": 4, "BKB": 512},
    "mma-BH16w1r2s4": _dn6(16, 1, 2, 4),
    "mma-BH16w1r2s4-f": _dn6(16, 1, 2, 4, fence=True),
    "mma-BH16w1r2s2-f": _dn6(16, 1, 2, 2, fence=True),
    "mma-BH16w2r2s4k2-f": _dn6(16, 2, 2, 4, 2, fence=True),
    "mma-BH32w2r2s4-f": _dn6(32, 2, 2, 4, fence=True),
    "mma-BH16w4r2s2k4-f": _dn6(16, 4, 2, 2, 4, fence=True),
}


def _eff_sk(cfg: dict, kbytes: int, rows: int) -> int:
    """The K-split the launcher runs ``cfg`` with at a row of ``kbytes`` code bytes (1 on the CUDA cores)."""
    from flint_moe.kernels.nvfp4.config import DownConfig, GateUpConfig

    if not cfg["MMA"]:
        return 0
    if "BN" in cfg:
        return GateUpConfig.from_dict({"BKB": 512, **cfg}).mma_launch(2 * kbytes)[0]
    return DownConfig.from_dict({"BKB": 512, **cfg}).mma_launch(2 * kbytes)[0]


def tune(out_dir: str, write_tuned: str | None, models=("deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b")) -> int:
    """``--tune`` (one device call, before the GPU tests and the runner): checks, timings, choice of the defaults
    per shape (docs/kernels/nvfp4-decode.md).

    Per model at M = 1: every candidate with the same path and the same K-split the launcher runs at that shape
    gives the same bits as the first (gate/up act; down y_acc); the first of each such group is checked against
    the golden model (``FP32_TRUNCATE`` for the tensor-core path, the block model for the CUDA cores; two
    (token, expert) pairs). Timings (CUDA graphs, rotating expert sets): gate/up alone and down alone per
    candidate; gate/up + down for every gate/up with the fastest down, and for the fastest of those with every
    down. Choice: the pair with the least gate/up + down time; DeepSeek-V3's becomes ``GATE_UP`` / ``DOWN``;
    another model's becomes a per-shape override when it differs (the best pair on the default's paths, so that
    ``accumulation_model`` does not depend on the shape). Written to ``write_tuned`` if every check passed, and
    to DIR/tuned.py always."""
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.reference.exact import FP32_TRUNCATE, block_model

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "kernels"))
    from _nvfp4_check import check_taps, make_inputs, same

    t0 = time.time()
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": [], "choice": {}}

    def note(name, ok, extra=""):
        res["checks"].append(dict(check=name, ok=bool(ok)))
        print(f"check {name}: {'ok' if ok else 'FAIL'} {extra}({time.time() - t0:.0f} s)", flush=True)

    def model_of(cfg):
        return FP32_TRUNCATE if cfg["MMA"] else block_model(16)

    def checks(mname):
        cfg = MODELS[mname]
        H, I, k = cfg["H"], cfg["I"], cfg["k"]
        w = random_weights(cfg["E"], H, I, seed=3)
        x, ids, tw, sh = make_inputs(1, H, cfg["E"], k, seed=11, device="cuda")
        pairs = {(0, 0), (0, k - 1)}
        refs = {}
        for v, gu in TUNE_GU.items():
            key = (gu["MMA"], _eff_sk(gu, H // 2, 2 * gu["BN"]))
            act = nvfp4_gate_up(x, ids, w, config=gu)
            if key in refs:
                note(f"{mname} gate/up {v} == first of its path and K-split", same(act, refs[key]))
                continue
            refs[key] = act
            taps = {}
            out = nvfp4_down(nvfp4_gate_up(x, ids, w, config=gu, taps=taps), ids, tw, w, sh, taps=taps,
                             config=TUNE_DN["mma-BH16w1r2s4"])  # fmt: skip
            try:
                check_taps(w, x, ids, tw, sh, taps, out, acc_pairs=pairs, gu_model=model_of(gu),
                           dn_model=FP32_TRUNCATE)  # fmt: skip
                note(f"{mname} gate/up {v} golden", True)
            except AssertionError as exc:
                note(f"{mname} gate/up {v} golden", False, f"{exc} ")
        cc = TUNE_GU["cc-BN8w2"]
        gtaps = {}
        act = nvfp4_gate_up(x, ids, w, config=cc, taps=gtaps)
        drefs = {}
        for v, dn in TUNE_DN.items():
            key = (dn["MMA"], _eff_sk(dn, I // 2, dn["BH"]))
            taps = {}
            out = nvfp4_down(act, ids, tw, w, sh, config=dn, taps=taps)
            if key in drefs:
                note(f"{mname} down {v} == first of its path and K-split", same(taps["down_acc"], drefs[key]))
                continue
            drefs[key] = taps["down_acc"]
            taps.update(act=act.view(1, k, -1), gate_acc=gtaps["gate_acc"], up_acc=gtaps["up_acc"])
            try:
                check_taps(w, x, ids, tw, sh, taps, out, acc_pairs=pairs, gu_model=block_model(16),
                           dn_model=model_of(dn))  # fmt: skip
                note(f"{mname} down {v} golden", True)
            except AssertionError as exc:
                note(f"{mname} down {v} golden", False, f"{exc} ")
        del w
        torch.cuda.empty_cache()

    def timings(mname):
        state = {"w": None}

        def timing(name, gu, dn, parts):
            prep, w, sets = _prepare(model=mname, M=1, gu=gu, dn=dn, weights=state["w"])
            state["w"] = w
            r = dict(model=mname, variant=name, gu=gu, dn=dn)
            if "all" in parts:
                t = time_graph(prep.fn, prep.rotations)
                r.update(us=t * 1e6, frac=prep.bytes_moved / t / bw)
            if "gu" in parts:
                r["gu_us"] = 1e6 * time_graph(
                    lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS
                )
            if "dn" in parts:
                acts = [nvfp4_gate_up(xx, ii, w, config=TUNE_GU["cc-BN8w2"]) for (xx, ii, _, _) in sets]
                r["dn_us"] = 1e6 * time_graph(
                    lambda i: nvfp4_down(
                        acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
                    ),
                    CALLS,
                )
            res["times"].append(r)
            print(
                f"{mname} M=1 {name:44s} "
                + "  ".join(f"{k} {r[k]:.1f}" for k in ("us", "gu_us", "dn_us") if k in r)
                + (f" ({100 * r['frac']:.1f}% of copy)" if "frac" in r else "")
                + f" ({time.time() - t0:.0f} s)",
                flush=True,
            )
            return r

        for v, gu in TUNE_GU.items():
            timing("gu " + v, gu, None, ("gu",))
        dn_t = {v: timing("dn " + v, None, dn, ("dn",))["dn_us"] for v, dn in TUNE_DN.items()}
        best_dn = min(dn_t, key=dn_t.get)
        pair_t = {}
        for v, gu in TUNE_GU.items():
            pair_t[(v, best_dn)] = timing(f"all {v} + {best_dn}", gu, TUNE_DN[best_dn], ("all",))["us"]
        best_gu = min((g for g, _ in pair_t), key=lambda g: pair_t[(g, best_dn)])
        for v, dn in TUNE_DN.items():
            if v != best_dn:
                pair_t[(best_gu, v)] = timing(f"all {best_gu} + {v}", TUNE_GU[best_gu], dn, ("all",))["us"]
        del state["w"]
        torch.cuda.empty_cache()
        return pair_t, dn_t

    per_model = {}
    for mname in models:
        checks(mname)
        per_model[mname] = timings(mname)
    n_bad = sum(not c["ok"] for c in res["checks"])

    ds_pairs, ds_dn = per_model["deepseek-v3"]
    gu0, dn0 = min(ds_pairs, key=ds_pairs.get)
    res["choice"]["deepseek-v3"] = dict(gate_up=gu0, down=dn0, us=ds_pairs[(gu0, dn0)])
    gu_by_shape, dn_by_shape = {}, {}
    for mname in models[1:]:
        pairs = per_model[mname][0]
        same_path = {
            p: t for p, t in pairs.items()
            if TUNE_GU[p[0]]["MMA"] == TUNE_GU[gu0]["MMA"] and TUNE_DN[p[1]]["MMA"] == TUNE_DN[dn0]["MMA"]
        }  # fmt: skip
        g, d = min(same_path, key=same_path.get)
        dflt = pairs.get((gu0, dn0))
        res["choice"][mname] = dict(gate_up=g, down=d, us=same_path[(g, d)], default_pair_us=dflt)
        shape = (MODELS[mname]["H"], MODELS[mname]["I"])
        if g != gu0:
            gu_by_shape[shape] = g
        if d != dn0:
            dn_by_shape[shape] = d
    gu_cc = "cc-BN8w2"
    gu_mma = min(
        (v for v in TUNE_GU if v.startswith("mma")), key=lambda v: ds_pairs.get((v, min(ds_dn, key=ds_dn.get)), 1e9)
    )
    dn_cc = min((v for v in TUNE_DN if v.startswith("cc")), key=ds_dn.get)
    dn_mma = min((v for v in TUNE_DN if v.startswith("mma")), key=ds_dn.get)
    print(f"choice: {res['choice']}; checks {len(res['checks'])}, failures {n_bad}", flush=True)

    def shapes_text(table, cands, what):
        if not table:
            return "{}"
        rows = [f"    {shape!r}: {cands[v]!r},  # {v}" for shape, v in sorted(table.items())]
        return "{\n" + "\n".join(rows) + "\n}"

    ds = res["choice"]["deepseek-v3"]
    text = tuned_text(
        "",
        f"DeepSeek-V3 M=1 gate/up + down {ds['us']:.1f} us\n(copy {bw / 1e12:.3f} TB/s).",
        [
            ("GATE_UP", TUNE_GU[gu0], gu0),
            ("DOWN", TUNE_DN[dn0], dn0),
            ("GATE_UP_CUDA_CORE", TUNE_GU[gu_cc], gu_cc),
            ("GATE_UP_MMA", TUNE_GU[gu_mma], gu_mma),
            ("DOWN_CUDA_CORE", TUNE_DN[dn_cc], dn_cc),
            ("DOWN_MMA", TUNE_DN[dn_mma], dn_mma),
        ],
        shapes_text(gu_by_shape, TUNE_GU, "gate/up"),
        shapes_text(dn_by_shape, TUNE_DN, "down"),
    )
    with open(os.path.join(out_dir, "tuned.py"), "w") as f:
        f.write(text)
    if write_tuned and n_bad == 0:
        with open(write_tuned, "w") as f:
            f.write(text)
    lines = [
        f"copy {bw / 1e12:.3f} TB/s; checks {len(res['checks'])}, failures {n_bad}; choice {res['choice']}",
        "| model | variant | all us | % copy | gu us | dn us |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["times"]:
        lines.append(
            f"| {r['model']} | {r['variant']} | "
            + " | ".join(
                (f"{100 * r[k]:.1f}" if k == "frac" else f"{r[k]:.1f}") if k in r else ""
                for k in ("us", "frac", "gu_us", "dn_us")
            )
            + " |"
        )
    with open(os.path.join(out_dir, "tune.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "tune.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("\n".join(lines))
    return 1 if n_bad else 0


#: Down candidates of ``--down-early`` (EARLY, MAXNREG, FENCE), DeepSeek-V3 shape, all tensor-core BH 16 / 1 warp /
#: RT 2 (complete configurations). e1 = EARLY 1 (first call's weights into registers before
#: griddepcontrol.wait), r72 = MAXNREG 72 (28 one-warp programs per SM: one wave of the 3584 programs at M=1),
#: f = FENCE. Every candidate has the default down's per-row MMA sequence: the same bits.
def _dn_early(s=4, early=0, maxnreg=0, fence=False):
    return {**_dn6(16, 1, 2, s, fence=fence), "EARLY": early, "MAXNREG": maxnreg}


TUNE_DN_EARLY = {
    "mma-BH16w1r2s4": _dn_early(),  # the base down (the ``--tune`` default)
    "mma-BH16w1r2s4-e1-r72": _dn_early(early=1, maxnreg=72),
    "mma-BH16w1r2s4-e1": _dn_early(early=1),
    "mma-BH16w1r2s2-e1": _dn_early(s=2, early=1),
    "mma-BH16w1r2s4-f-r72": _dn_early(fence=True, maxnreg=72),
    "mma-BH16w1r2s4-f-e1-r72": _dn_early(fence=True, early=1, maxnreg=72),
}
#: Keys that pin a per-shape down override to the base down's behaviour when DOWN changes.
PIN_EARLY = {"EARLY": 0, "MAXNREG": 0}


def tuned_text(doc_extra: str, measured: str, values: list, gu_by_shape: str, dn_by_shape: str) -> str:
    """Text of nvfp4/tuned.py: the module docstring (the ``--tune`` paragraph, then ``doc_extra`` and the
    ``measured`` line), ``values`` as ``(name, config, comment)`` assignments (comment "" for none; a config
    equal to an earlier one is written as ``dict(EARLIER)``) and the two per-shape override dicts as source
    text. Shared by ``tune`` and ``tune_down_early``."""
    body, written = "", {}
    for name, cfg, note in values:
        # a value equal to one written above is written as a copy of it
        same = next((n for n, c in written.items() if c == cfg), None)
        body += f"{name} = " + (f"dict({same})" if same else repr(cfg)) + (f"  # {note}" if note else "") + "\n"
        written[name] = cfg
    return (
        '"""Launch configurations of the NVFP4 decode kernels chosen on the H200.\n\n'
        "Written by ``python -m benchmarks.tune.decode_nvfp4 --tune --write-tuned`` (docs/kernels/nvfp4-decode.md):\n"
        "``GATE_UP`` / ``DOWN`` are the pair with the least gate/up + down time at DeepSeek-V3 M=1 among the\n"
        "CUDA-core and tensor-core (``MMA``) candidates, each checked against the golden model first;\n"
        "``*_BY_SHAPE[(H, I)]`` the pair of another measured model where it differs (same paths: a shape never\n"
        "changes ``MMA``); ``*_CUDA_CORE`` / ``*_MMA`` the best of each path at DeepSeek-V3 (tests run both).\n"
        f"{doc_extra}Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {measured}\n"
        '"""\n\n'
        f"{body}"
        "#: Per-shape overrides ((H, I) -> keys replacing GATE_UP's / DOWN's at that shape; never MMA).\n"
        f"GATE_UP_BY_SHAPE: dict = {gu_by_shape}\n"
        f"DOWN_BY_SHAPE: dict = {dn_by_shape}\n"
    )


def tuned_down_text(best: str, best_us: float, base_us: float, bw: float) -> str:
    """Text of nvfp4/tuned.py with ``DOWN`` / ``DOWN_MMA`` = ``TUNE_DN_EARLY[best]``, everything else as now and
    the per-shape down overrides pinned with ``PIN_EARLY`` (``tune_down_early``)."""
    from flint_moe.kernels.nvfp4 import tuned as T

    dn_shape = {shape: {**over, **PIN_EARLY} for shape, over in T.DOWN_BY_SHAPE.items()}
    return tuned_text(
        "Then ``--down-early --write-tuned``: ``DOWN`` / ``DOWN_MMA`` the fastest pair of the down candidates\n"
        "(weights loaded before the grid-dependency wait, register cap; same bits as the base down\n"
        "``mma-BH16w1r2s4``, the ``--tune`` choice); the per-shape down overrides pinned to the base down's behaviour\n"
        "(EARLY 0, MAXNREG 0).\n",
        f"DeepSeek-V3 M=1 gate/up + down {best_us:.1f} us\n(copy {bw / 1e12:.3f} TB/s; base down "
        f"{base_us:.1f} us in the same run).",
        [
            ("GATE_UP", T.GATE_UP, ""),
            ("DOWN", TUNE_DN_EARLY[best], best),
            ("GATE_UP_CUDA_CORE", T.GATE_UP_CUDA_CORE, ""),
            ("GATE_UP_MMA", T.GATE_UP_MMA, ""),
            ("DOWN_CUDA_CORE", T.DOWN_CUDA_CORE, ""),
            ("DOWN_MMA", TUNE_DN_EARLY[best], best),
        ],
        repr(T.GATE_UP_BY_SHAPE),
        repr(dn_shape),
    )


def tune_down_early(out_dir: str, write_tuned: str | None) -> int:
    """``--down-early`` (docs/kernels/nvfp4-decode.md): the ``TUNE_DN_EARLY`` downs at DeepSeek-V3 with the
    default gate/up.

    Checks: every candidate's y_acc, y and out bit-identical to the base down's (``mma-BH16w1r2s4``) at M = 1 and
    3 (same act). Timings (CUDA graphs, rotating expert sets, M=1): down alone, then gate/up + down for every
    candidate in 3 rounds (candidate order rotated each round; median of the rounds). Diagnostic: Qwen3 / gpt-oss
    M=1 pair with their own down, with and without EARLY 1. Choice: the least median pair time; written as
    ``DOWN`` / ``DOWN_MMA`` (per-shape down overrides pinned with ``PIN_EARLY``) to ``write_tuned`` only if every
    check passed and it beats the base down in every round; DIR/tuned_down.py always."""
    from flint_moe.kernels.nvfp4.down_combine import default_config as dn_default, nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "kernels"))
    from _nvfp4_check import make_inputs, same

    t0 = time.time()
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": [], "choice": None}
    base = "mma-BH16w1r2s4"
    cfg = MODELS["deepseek-v3"]
    E, H, I, k = cfg["E"], cfg["H"], cfg["I"], cfg["k"]
    w = random_weights(E, H, I, seed=3)
    for M in (1, 3):
        x, ids, tw, sh = make_inputs(M, H, E, k, seed=11 + M, device="cuda")
        act = nvfp4_gate_up(x, ids, w)
        t_ref = {}
        ref = nvfp4_down(act, ids, tw, w, sh, config=TUNE_DN_EARLY[base], taps=t_ref)
        for v, dn in TUNE_DN_EARLY.items():
            taps = {}
            out = nvfp4_down(act, ids, tw, w, sh, config=dn, taps=taps)
            out2 = nvfp4_down(act, ids, tw, w, sh, config=dn)
            ok = same(out, ref) and same(out2, ref) and same(taps["down_acc"], t_ref["down_acc"])
            ok = ok and same(taps["y"], t_ref["y"])
            res["checks"].append(dict(check=f"M={M} {v}", ok=bool(ok)))
            print(f"check M={M} {v} == {base}: {'ok' if ok else 'FAIL'} ({time.time() - t0:.0f} s)", flush=True)
    prep0, w, sets = _prepare(model="deepseek-v3", M=1, weights=w)
    acts = [nvfp4_gate_up(xx, ii, w) for (xx, ii, _, _) in sets]
    dn_us = {}
    for v, dn in TUNE_DN_EARLY.items():
        dn_us[v] = 1e6 * time_graph(
            lambda i, dn=dn: nvfp4_down(
                acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
            ),
            CALLS,
        )
        print(f"dn {v:32s} {dn_us[v]:.1f} us ({time.time() - t0:.0f} s)", flush=True)
    names = list(TUNE_DN_EARLY)
    pair = {v: [] for v in names}
    gu_us = 1e6 * time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w), CALLS)
    for rnd in range(3):
        order = names[rnd:] + names[:rnd] if rnd != 1 else names[::-1]
        for v in order:
            prep, _, _ = _prepare(model="deepseek-v3", M=1, dn=TUNE_DN_EARLY[v], weights=w)
            pair[v].append(1e6 * time_graph(prep.fn, prep.rotations))
        print(f"round {rnd}: " + ", ".join(f"{v} {pair[v][-1]:.1f}" for v in names), flush=True)
    nbytes = prep0.bytes_moved
    for v in names:
        med = statistics.median(pair[v])
        res["times"].append(dict(model="deepseek-v3", variant=v, dn_us=dn_us[v], pair_us=pair[v], median=med,
                                 frac=nbytes / (med * 1e-6) / bw))  # fmt: skip
    w = None  # frees the weights before the diagnostic
    torch.cuda.empty_cache()
    diag = []
    for mname in ("qwen3-30b-a3b", "gpt-oss-120b"):
        m = MODELS[mname]
        d0 = dn_default(m["H"], m["I"])
        ww = None
        for tag, dn in (("own down", d0), ("own down + EARLY 1", {**d0, "EARLY": 1})):
            try:
                prep, ww, _ = _prepare(model=mname, M=1, dn=dn, weights=ww)
                t = [1e6 * time_graph(prep.fn, prep.rotations) for _ in range(2)]
                diag.append(f"| {mname} | {tag} | {t[0]:.1f}, {t[1]:.1f} |")
            except Exception as exc:  # diagnostic only
                diag.append(f"| {mname} | {tag} | error {type(exc).__name__}: {exc} |")
            print(diag[-1], flush=True)
        del ww
        torch.cuda.empty_cache()
    n_bad = sum(not c["ok"] for c in res["checks"])
    med = {v: statistics.median(pair[v]) for v in names}
    best = min(med, key=med.get)
    wins = best != base and all(a < b for a, b in zip(pair[best], pair[base], strict=True))
    res["choice"] = dict(down=best, median=med[best], base_median=med[base], wins_every_round=wins)
    text = tuned_down_text(best, med[best], med[base], bw)
    with open(os.path.join(out_dir, "tuned_down.py"), "w") as f:
        f.write(text)
    written = bool(write_tuned and n_bad == 0 and wins)
    if written:
        with open(write_tuned, "w") as f:
            f.write(text)
    lines = [
        f"copy {bw / 1e12:.3f} TB/s; checks {len(res['checks'])}, failures {n_bad}; gate/up alone {gu_us:.1f} us; "
        f"choice {res['choice']}; written {written}",
        "",
        "| down (DeepSeek-V3 M=1) | dn us | pair us (3 rounds) | median | % copy |",
        "|---|---|---|---|---|",
    ]
    for r in res["times"]:
        lines.append(
            f"| {r['variant']} | {r['dn_us']:.1f} | {', '.join(f'{t:.1f}' for t in r['pair_us'])} | "
            f"{r['median']:.1f} | {100 * r['frac']:.1f} |"
        )
    lines += ["", "| model | down | pair us (2 runs) |", "|---|---|---|", *diag]
    with open(os.path.join(out_dir, "down_early.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "down_early.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("\n".join(lines), flush=True)
    return 1 if n_bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/bench-nvfp4"))
    ap.add_argument("--tune", action="store_true", help="checks, timings and the choice of the defaults")
    ap.add_argument("--down-early", action="store_true", help="down candidates (EARLY, MAXNREG, FENCE)")
    ap.add_argument("--write-tuned", default=None, help="path of nvfp4/tuned.py to (over)write")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.down_early:
        return tune_down_early(args.out, args.write_tuned)
    if args.tune:
        return tune(args.out, args.write_tuned)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
