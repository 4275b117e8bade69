"""Verify the tensor-core accumulation model (flint_moe.reference.mma) against the H200, and capture probe vectors.

``python -m flint_moe.tools.mma verify [--report FILE] [--count N] [--seed S] [--variants] [--dump NPZ]``
    Draws about N (default 1,200,000) random instruction inputs over the random distributions plus the
    hand-made adversarial classes (``CLASSES``), runs each through ``mma.sync.m16n8k16`` and the wgmma k16
    step (flint_moe.kernels.audit.mma_probes) and through ``reference.mma.mma_bf16_f32`` on the GPU, and
    counts bit mismatches (NaN compared as NaN-ness) per class and instruction; also the two-step chain of a
    K = 32 ``tl.dot`` against the model applied twice, the permutation classes' hardware invariance, and the
    one-hot fragment check. Prints the first mismatches; writes the report; exit code 1 on any mismatch.
    ``--variants`` also counts the mismatches of the model's alternative constants (fitting aid); ``--dump``
    saves mismatching vectors.
``python -m flint_moe.tools.mma probe --out FILE.npz [--per-class N] [--seed S]``
    Saves N vectors per class and instruction with the hardware's outputs (the CPU tests' data):
    ``acc`` uint32 [V], ``a``, ``b`` uint16 [V, 16], ``d`` uint32 [V], ``instruction`` and ``klass`` int8 [V],
    ``instructions`` and ``classes`` (names), and a JSON ``meta`` string (device, versions, date, command).

Both need a CUDA device. ``--simulate`` (both commands) runs the plumbing on the CPU with the model standing
in for the hardware: it proves nothing about the GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys
import time

import numpy as np
import torch

from flint_moe.reference.mma import MMA_INSTRUCTIONS, _fused_dot, mma_bf16_f32

RANDOM_CLASSES = (
    "uniform_bits",
    "gaussian",
    "mixed_exp",
    "cancel",
    "subnormal",
    "underflow",
    "near_max",
    "zeros",
    "special",
)
ADVERSARIAL_CLASSES = ("align_shift", "ties", "carry", "kperm", "zero_exponent", "tiny", "hand")
CLASSES = RANDOM_CLASSES + ADVERSARIAL_CLASSES

#: Alternatives to the fitted constants (``--variants``).
VARIANTS = {
    "F=24": {"frac_bits": 24},
    "F=26": {"frac_bits": 26},
    "floor": {"term_round": "floor"},
    "rne": {"final": "rne"},
    "overflow_max": {"overflow": "max"},
    "zero_exp_on": {"zero_exponent": True},
    "zero_ieee": {"zero_sign": "all_negative_zero"},
    "no_floor": {"align_floor": None},
    "floor-132": {"align_floor": -132},
    "floor-134": {"align_floor": -134},
}

# ------------------------------------------------------------------------------------------------------------
# bit-level constructors


def _bf16(sign: torch.Tensor, ef: torch.Tensor, mf: torch.Tensor) -> torch.Tensor:
    bits = (sign.to(torch.int32) << 15) | (ef.to(torch.int32) << 7) | mf.to(torch.int32)
    bits = bits - ((bits >> 15) << 16)
    return bits.to(torch.int16).view(torch.bfloat16)


def _f32(sign: torch.Tensor, ef: torch.Tensor, mf: torch.Tensor) -> torch.Tensor:
    bits = (sign.to(torch.int64) << 31) | (ef.to(torch.int64) << 23) | mf.to(torch.int64)
    bits = bits - ((bits >> 31) << 32)
    return bits.to(torch.int32).view(torch.float32)


class _Gen:
    def __init__(self, seed: int, device: str):
        self.g = torch.Generator(device=device).manual_seed(seed)
        self.dev = device

    def ri(self, lo: int, hi: int, shape) -> torch.Tensor:  # uniform ints in [lo, hi]
        return torch.randint(lo, hi + 1, tuple(shape), generator=self.g, device=self.dev, dtype=torch.int64)

    def u(self, shape) -> torch.Tensor:
        return torch.rand(tuple(shape), generator=self.g, device=self.dev, dtype=torch.float64)

    def randn(self, shape) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.g, device=self.dev, dtype=torch.float32)

    def bf(self, shape, elo: int, ehi: int) -> torch.Tensor:
        """bf16 with random sign, mantissa, unbiased exponent in [elo, ehi] (normal range)."""
        return _bf16(self.ri(0, 1, shape), self.ri(elo, ehi, shape) + 127, self.ri(0, 127, shape))

    def f32(self, shape, elo: int, ehi: int) -> torch.Tensor:
        return _f32(self.ri(0, 1, shape), self.ri(elo, ehi, shape) + 127, self.ri(0, (1 << 23) - 1, shape))


def _exact_sum(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double()).sum(-1) + acc.double()


def _pow2_bf16(e: torch.Tensor) -> torch.Tensor:
    return _bf16(torch.zeros_like(e), e + 127, torch.zeros_like(e))


def generate(name: str, n: int, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n vectors of class ``name``: acc fp32 [n], a, b bf16 [n, 16] on ``device``."""
    G = _Gen(seed * 1000 + CLASSES.index(name), device)
    K = 16
    if name == "uniform_bits":

        def bits16(shape):
            ef = torch.where(G.u(shape[:1] + (1,)) < 0.5, G.ri(0, 254, shape), G.ri(64, 190, shape))
            return _bf16(G.ri(0, 1, shape), ef, G.ri(0, 127, shape))

        a, b = bits16((n, K)), bits16((n, K))
        acc = _f32(G.ri(0, 1, (n,)), G.ri(0, 254, (n,)), G.ri(0, (1 << 23) - 1, (n,)))
    elif name == "gaussian":
        s = torch.pow(2.0, G.ri(-10, 10, (n, 1)).float())
        a = (G.randn((n, K)) * s).bfloat16()
        b = G.randn((n, K)).bfloat16()
        acc = G.randn((n,)) * s[:, 0] * 4
    elif name == "mixed_exp":
        a, b = G.bf((n, K), -40, 40), G.bf((n, K), -40, 40)
        acc = G.f32((n,), -80, 80)
    elif name == "cancel":
        a, b = G.bf((n, K), -8, 8), G.bf((n, K), -8, 8)
        ex = _exact_sum(torch.zeros(n, device=device), a, b)
        acc = (-ex).float()
        sel = G.u((n,)) < 0.3  # a few ulps off the exact negation
        nudged = (acc.view(torch.int32) + G.ri(-4, 4, (n,)).to(torch.int32)).view(torch.float32)
        acc = torch.where(sel & torch.isfinite(nudged), nudged, acc)
        # every other vector: products cancel in pairs (k, k + 8) up to one term
        half = G.u((n,)) < 0.5
        a2 = torch.cat([a[:, :8], a[:, :8]], 1)
        b2 = torch.cat([b[:, :8], -b[:, :8]], 1)
        b2[:, 15] = b[:, 15]
        a = torch.where(half[:, None], a2, a)
        b = torch.where(half[:, None], b2, b)
        acc = torch.where(half, G.f32((n,), -30, 10), acc)
    elif name == "subnormal":
        ef_sub = torch.where(
            G.u((n, K)) < 0.6, torch.zeros(n, K, dtype=torch.int64, device=device), G.ri(1, 40, (n, K))
        )
        x = _bf16(G.ri(0, 1, (n, K)), ef_sub, G.ri(0, 127, (n, K)))
        y = G.bf((n, K), 60, 127)
        sw = G.u((n, K)) < 0.5
        a, b = torch.where(sw, x, y), torch.where(sw, y, x)
        both = G.u((n, 1)) < 0.2  # both operands subnormal / tiny
        a = torch.where(both, x, a)
        b = torch.where(
            both,
            _bf16(G.ri(0, 1, (n, K)), torch.zeros(n, K, dtype=torch.int64, device=device), G.ri(0, 127, (n, K))),
            b,
        )
        sub_acc = _f32(G.ri(0, 1, (n,)), torch.zeros(n, dtype=torch.int64, device=device), G.ri(0, (1 << 23) - 1, (n,)))
        acc = torch.where(G.u((n,)) < 0.5, sub_acc, G.f32((n,), -70, 5))
    elif name == "underflow":
        ea = G.ri(-90, -50, (n, K))
        narrow = G.u((n, 1)) < 0.5
        eb = torch.where(narrow, G.ri(-152, -140, (n, K)), G.ri(-160, -110, (n, K))) - ea
        eb = torch.clamp(eb, -126, 127)
        a = _bf16(G.ri(0, 1, (n, K)), ea + 127, G.ri(0, 127, (n, K)))
        b = _bf16(G.ri(0, 1, (n, K)), eb + 127, G.ri(0, 127, (n, K)))
        r = G.u((n,))
        z = torch.zeros(n, dtype=torch.int64, device=device)
        sub_acc = _f32(G.ri(0, 1, (n,)), z, G.ri(0, (1 << 23) - 1, (n,)))
        acc = torch.where(r < 0.3, _f32(G.ri(0, 1, (n,)), z, z), torch.where(r < 0.7, sub_acc, G.f32((n,), -126, -110)))
    elif name == "near_max":
        a, b = G.bf((n, K), 56, 64), G.bf((n, K), 58, 63)
        acc = _f32(G.ri(0, 1, (n,)), G.ri(250, 254, (n,)), G.ri(0, (1 << 23) - 1, (n,)))
        same = G.u((n, 1)) < 0.5  # all products of the accumulator's sign: sums overflow
        sa = (acc.view(torch.int32) < 0)[:, None]
        a = torch.where(same, torch.where(sa, -a.abs(), a.abs()), a)
        b = torch.where(same, b.abs(), b)
    elif name == "zeros":
        base_a, base_b = G.randn((n, K)).bfloat16(), G.randn((n, K)).bfloat16()
        za = _bf16(
            G.ri(0, 1, (n, K)),
            torch.zeros(n, K, dtype=torch.int64, device=device),
            torch.zeros(n, K, dtype=torch.int64, device=device),
        )
        zb = _bf16(
            G.ri(0, 1, (n, K)),
            torch.zeros(n, K, dtype=torch.int64, device=device),
            torch.zeros(n, K, dtype=torch.int64, device=device),
        )
        allz = G.u((n, 1)) < 0.3
        a = torch.where((G.u((n, K)) < 0.7) | allz, za, base_a)
        b = torch.where(G.u((n, K)) < 0.5, zb, base_b)
        z = torch.zeros(n, dtype=torch.int64, device=device)
        acc = torch.where(G.u((n,)) < 0.6, _f32(G.ri(0, 1, (n,)), z, z), G.randn((n,)))
        # exact cancellation to zero: acc = -(single product)
        canc = G.u((n,)) < 0.15
        a_c = a.clone()
        a_c[:, 1:] = za[:, 1:]
        a_c[:, 0] = base_a[:, 0]
        b_c = b.clone()
        b_c[:, 0] = base_b[:, 0]
        acc_c = -(a_c[:, 0].float() * b_c[:, 0].float())
        a = torch.where(canc[:, None], a_c, a)
        b = torch.where(canc[:, None], b_c, b)
        acc = torch.where(canc, acc_c, acc)
    elif name == "special":
        a, b = G.randn((n, K)).bfloat16(), G.randn((n, K)).bfloat16()
        acc = G.randn((n,))
        specials = torch.tensor([float("inf"), float("-inf"), float("nan")], device=device)
        for t in (a, b):
            m = G.u((n, K)) < 0.04
            t[m] = specials[G.ri(0, 2, (int(m.sum()),))].bfloat16()
            zm = G.u((n, K)) < 0.1
            t[zm] = 0.0
        m = G.u((n,)) < 0.15
        acc[m] = specials[G.ri(0, 2, (int(m.sum()),))]
    elif name == "align_shift":
        # accumulator or one product as the largest term; the others at an exact shift s = 20..32 below it
        s = G.ri(20, 32, (n, 1))
        a = G.bf((n, K), 0, 0)
        b = G.bf((n, K), 0, 0)
        kk = G.ri(0, K - 1, (n, 1))
        ar = torch.arange(K, device=device)[None, :]
        small_e = -s + G.ri(-1, 0, (n, K))
        b_small = _bf16(G.ri(0, 1, (n, K)), small_e + 127, G.ri(0, 127, (n, K)))
        lead_prod = G.u((n, 1)) < 0.4
        # non-leading products: shifted
        b = torch.where(lead_prod & (ar == kk), b, b_small)
        nz = G.u((n, K)) < 0.5
        b = torch.where(nz | (ar == kk), b, torch.zeros_like(b))
        acc_lead = G.f32((n,), 0, 1)
        acc_small = _f32(G.ri(0, 1, (n,)), (-s[:, 0] + 127), G.ri(0, (1 << 23) - 1, (n,)))
        acc = torch.where(lead_prod[:, 0], acc_small, acc_lead)
    elif name == "ties":
        # acc = 1.x (or a power-of-two binade 2^e) and products summing to odd multiples of half an ulp
        e = G.ri(-20, 20, (n,))
        accm = G.ri(0, (1 << 23) - 1, (n,))
        sgn = G.ri(0, 1, (n,))
        acc = _f32(sgn, e + 127, accm)
        # q products of 2^(e - 24) (half an ulp of acc), q odd, or 3 quarter ulps
        q = G.ri(1, 16, (n,))
        ar = torch.arange(K, device=device)[None, :]
        pe = (e - 24)[:, None].expand(n, K)
        quarter = G.u((n, 1)) < 0.3
        pe = torch.where(quarter & (ar % 2 == 1), pe - 1, pe)
        a = _bf16(torch.zeros_like(pe), (pe // 2) + 127, torch.zeros_like(pe))
        b = _bf16(
            (sgn[:, None] ^ (G.u((n, 1)) < 0.5).to(torch.int64)).expand(n, K),
            (pe - pe // 2) + 127,
            torch.zeros_like(pe),
        )
        b = torch.where(ar < q[:, None], b, torch.zeros_like(b))
    elif name == "carry":
        # acc just below (or at) a power of two, products pushing it across; borrow from a power of two
        e = G.ri(-30, 30, (n,))
        kind = G.ri(0, 2, (n,))
        sgn = G.ri(0, 1, (n,))
        k_ulp = G.ri(1, 40, (n,))
        full = (1 << 23) - 1
        acc_below = _f32(sgn, e + 127, full - (k_ulp - 1).clamp(max=full))
        acc_pow = _f32(sgn, e + 127, torch.zeros_like(e))
        acc = torch.where(kind == 0, acc_below, acc_pow)
        pe = e[:, None] - G.ri(21, 27, (n, K))
        pm = G.ri(0, 127, (n, K))
        ps = torch.where(kind[:, None] == 1, sgn[:, None].expand(n, K), 1 - sgn[:, None].expand(n, K))
        ps = torch.where(kind[:, None] == 0, sgn[:, None].expand(n, K), ps)
        a = _bf16(torch.zeros_like(pe), torch.full_like(pe, 127), pm)
        b = _bf16(ps, pe + 127, torch.zeros_like(pe))
    elif name == "kperm":
        # base vectors whose terms straddle the truncation point, each in 8 orders of k
        nb = max(1, n // 8)
        ebase = G.ri(-4, 4, (nb, K))
        spread = G.ri(0, 40, (nb, K))
        pe = torch.where(G.u((nb, K)) < 0.5, ebase, ebase - spread)
        a0 = _bf16(G.ri(0, 1, (nb, K)), torch.full_like(pe, 127), G.ri(0, 127, (nb, K)))
        b0 = _bf16(G.ri(0, 1, (nb, K)), pe + 127, G.ri(0, 127, (nb, K)))
        acc0 = torch.where(G.u((nb,)) < 0.5, G.f32((nb,), -6, 6), G.f32((nb,), -40, -20))
        perms = [
            torch.arange(K, device=device),
            torch.arange(K - 1, -1, -1, device=device),
            torch.cat([torch.arange(8, 16, device=device), torch.arange(0, 8, device=device)]),
            torch.arange(K, device=device).view(8, 2).flip(1).reshape(-1),
        ]
        perms += [torch.randperm(K, generator=G.g, device=device) for _ in range(4)]
        a = torch.stack([a0[:, p] for p in perms], 1).reshape(nb * 8, K)
        b = torch.stack([b0[:, p] for p in perms], 1).reshape(nb * 8, K)
        acc = acc0.repeat_interleave(8)
    elif name == "zero_exponent":
        # a zero operand paired with a large partner next to small non-zero products
        ar = torch.arange(K, device=device)[None, :]
        big = G.ri(96, 127, (n, 1))
        kk = G.ri(0, K - 1, (n, 1))
        a = G.bf((n, K), -20, -8)
        b = G.bf((n, K), -20, -8)
        zsign = G.ri(0, 1, (n, K))
        zero = _bf16(zsign, torch.zeros_like(zsign), torch.zeros_like(zsign))
        bigv = _bf16(G.ri(0, 1, (n, K)), (big + 127).expand(n, K), G.ri(0, 127, (n, K)))
        a = torch.where(ar == kk, zero, a)
        b = torch.where(ar == kk, bigv, b)
        z = torch.zeros(n, dtype=torch.int64, device=device)
        acc = torch.where(G.u((n,)) < 0.5, _f32(G.ri(0, 1, (n,)), z, z), G.f32((n,), -40, -16))
    elif name == "tiny":
        # zero accumulator, every product below 2^-126 (the alignment floor), mixed signs
        z = torch.zeros(n, dtype=torch.int64, device=device)
        acc = torch.where(
            G.u((n,)) < 0.85, _f32(G.ri(0, 1, (n,)), z, z), _f32(G.ri(0, 1, (n,)), z, G.ri(1, 4095, (n,)))
        )
        top = G.ri(-165, -122, (n, 1))
        ep = top - G.ri(0, 24, (n, K))
        ea = G.ri(-80, -40, (n, K))
        eb = torch.clamp(ep - ea, -126, 127)
        a = _bf16(G.ri(0, 1, (n, K)), ea + 127, G.ri(0, 127, (n, K)))
        b = _bf16(G.ri(0, 1, (n, K)), eb + 127, G.ri(0, 127, (n, K)))
        b = torch.where(G.u((n, K)) < 0.1, torch.zeros_like(b), b)
        # half: one product on the 2^-149 grid, one of the other sign at 2^-161..2^-155 (the floor)
        two = G.u((n, 1)) < 0.5
        sg = G.ri(0, 1, (n,))
        ea0, ep1, t = G.ri(-80, -60, (n,)), G.ri(-142, -130, (n,)), G.ri(-161, -155, (n,))
        a2 = torch.zeros_like(a)
        b2 = torch.zeros_like(b)
        a2[:, 0] = _bf16(sg, ea0 + 127, z)
        b2[:, 0] = _bf16(z, ep1 - ea0 + 127, G.ri(0, 127, (n,)))
        a2[:, 1] = _bf16(1 - sg, z + 127 - 80, G.ri(0, 127, (n,)))
        b2[:, 1] = _bf16(z, t + 80 + 127, z)
        a = torch.where(two, a2, a)
        b = torch.where(two, b2, b)
    elif name == "hand":
        acc, a, b = _hand_cases(device)
        reps = max(1, math.ceil(n / acc.shape[0]))
        acc, a, b = acc.repeat(reps)[:n], a.repeat(reps, 1)[:n], b.repeat(reps, 1)[:n]
    else:
        raise ValueError(f"class: {name!r} (one of {CLASSES})")
    return acc.contiguous(), a.contiguous(), b.contiguous()


def _hand_cases(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = []
    one = [1.0] * 16

    def add(c, av, bv):
        rows.append((c, av, bv))

    for p in range(-3, 2):  # 2^24 + 16 products of 2^p
        add(2.0**24, one, [2.0**p] * 16)
    add(1.0, one, [2.0**-30] * 16)
    add(-1.0, one, [2.0**-30] * 16)
    add(1.0, one, [2.0**-24] + [0.0] * 15)
    add(1.0, one, [2.0**-25] * 2 + [0.0] * 14)
    add(1.0, one, [-(2.0**-25)] + [0.0] * 15)
    add(-0.0, one, [-0.0] * 16)
    add(0.0, one, [-0.0] * 16)
    add(-0.0, [-0.0] * 16, [-0.0] * 16)
    add(-0.0, [0.0] * 16, [-1.0] * 16)
    add(1.0, [1.0] + [0.0] * 15, [-1.0] * 16)
    add(-1.0, [1.0] + [0.0] * 15, [1.0] * 16)
    add(3.0e38, [2.0**63] * 16, [2.0**63] * 16)
    add(-3.0e38, [2.0**63] * 16, [-(2.0**63)] * 16)
    add(3.4028234663852886e38, [2.0**-100] + [0.0] * 15, [1.0] * 16)
    add(2.0**-149, [2.0**-70] * 16, [2.0**-70] * 16)
    add(0.0, [2.0**-126] * 16, [2.0**-24] * 16)
    add(0.0, [2.0**-133] * 16, [1.0] * 16)
    add(2.0**-149, [-(2.0**-75)] + [0.0] * 15, [2.0**-75] * 16)
    add(1.0, [2.0**120] + [0.0] * 15, [2.0**7] * 16)
    add(0.0, [0.0] + [1.0] * 15, [2.0**100] + [2.0**-28] * 15)
    add(0.0, [0.0] + [1.0] * 15, [2.0**20] + [1.0] * 15)
    acc = torch.tensor([r[0] for r in rows], dtype=torch.float32, device=device)
    a = torch.tensor([r[1] for r in rows], dtype=torch.float32, device=device).bfloat16()
    b = torch.tensor([r[2] for r in rows], dtype=torch.float32, device=device).bfloat16()
    return acc, a, b


# ------------------------------------------------------------------------------------------------------------
# comparison


def same_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal fp32 bit patterns, or both NaN."""
    return (x.view(torch.int32) == y.view(torch.int32)) | (torch.isnan(x) & torch.isnan(y))


def _fmt_vec(acc, a, b, hw, md) -> str:
    av = " ".join(f"{int(v) & 0xFFFF:04x}" for v in a.view(torch.int16).tolist())
    bv = " ".join(f"{int(v) & 0xFFFF:04x}" for v in b.view(torch.int16).tolist())

    def hx(x):
        return f"{int(x.view(torch.int32)) & 0xFFFFFFFF:08x} ({float(x):.9g})"

    return f"    acc={hx(acc)} hw={hx(hw)} model={hx(md)}\n      a=[{av}]\n      b=[{bv}]"


def environment() -> dict:
    import triton

    env = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "command": " ".join(["python -m flint_moe.tools.mma"] + sys.argv[1:]),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        env["capability"] = f"sm_{major}{minor}"
    return env


def _class_counts(count: int) -> dict[str, int]:
    m = min(40000, max(8, count // 25))
    adv = {"align_shift": m, "ties": m, "carry": m, "kperm": m, "zero_exponent": m // 2, "tiny": m, "hand": 0}
    rest = max(count - sum(adv.values()), len(RANDOM_CLASSES))
    out = {c: rest // len(RANDOM_CLASSES) for c in RANDOM_CLASSES}
    out.update(adv)
    out["hand"] = len(_hand_cases("cpu")[0])
    return out


def _simulated_probes():
    """CPU stand-ins for the hardware probes (``--simulate``): the model itself; proves nothing about hardware."""

    def fake(iname):
        return lambda acc, a, b: mma_bf16_f32(acc, a, b, instruction=iname)

    def fake_k32(acc, a, b):
        mid = mma_bf16_f32(acc, a[:, :16], b[:, :16])
        return mma_bf16_f32(mid, a[:, 16:], b[:, 16:])

    return {i: fake(i) for i in MMA_INSTRUCTIONS}, (lambda dev: []), fake_k32


def _probes(simulate: bool):
    if simulate:
        return _simulated_probes()
    from flint_moe.kernels.audit.mma_probes import MMA_PROBES, mma_layout_check, wgmma_k32_hw

    return MMA_PROBES, mma_layout_check, wgmma_k32_hw


def cmd_verify(args: argparse.Namespace) -> int:
    MMA_PROBES, mma_layout_check, wgmma_k32_hw = _probes(args.simulate)
    dev = "cpu" if args.simulate else "cuda"
    t0 = time.time()
    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    env = environment()
    out("flint-moe tensor-core accumulation model vs hardware (python -m flint_moe.tools.mma verify)")
    out(json.dumps(env, sort_keys=True))
    if args.simulate:
        out("SIMULATED: the model stands in for the hardware; this run proves nothing about the GPU")
    problems = mma_layout_check(dev)
    out(f"one-hot fragment check: {'OK' if not problems else '; '.join(problems)}")
    counts = _class_counts(args.count)
    total_bad = len(problems)
    total = 0
    dump: dict[str, list] = {"acc": [], "a": [], "b": [], "d": [], "instruction": [], "klass": []}
    variant_bad = {v: 0 for v in VARIANTS}
    out(
        f"{'class':<14} {'instruction':<20} {'vectors':>9} {'mismatches':>10}"
        + ("  variants: " + " ".join(VARIANTS) if args.variants else "")
    )
    mma_eq_wgmma = 0
    for cname in CLASSES:
        acc, a, b = generate(cname, counts[cname], args.seed, dev)
        hws = {}
        for iname in MMA_INSTRUCTIONS:
            hw = MMA_PROBES[iname](acc, a, b)
            hws[iname] = hw
            md = mma_bf16_f32(acc, a, b, instruction=iname)
            ok = same_bits(hw, md)
            nbad = int((~ok).sum())
            total += acc.shape[0]
            total_bad += nbad
            extra = ""
            if args.variants:
                vb = []
                for vname, kw in VARIANTS.items():
                    c = int((~same_bits(hw, _fused_dot(acc, a, b, **kw))).sum())
                    variant_bad[vname] += c
                    vb.append(str(c))
                extra = "  " + " ".join(vb)
            out(f"{cname:<14} {iname:<20} {acc.shape[0]:>9} {nbad:>10}{extra}")
            if nbad:
                idx = (~ok).nonzero().flatten()
                for i in idx[: args.show].tolist():
                    out(_fmt_vec(acc[i], a[i], b[i], hw[i], md[i]))
                if args.dump:
                    j = idx[: args.dump_max]
                    dump["acc"].append(acc[j].view(torch.int32).cpu().numpy())
                    dump["a"].append(a[j].view(torch.int16).cpu().numpy())
                    dump["b"].append(b[j].view(torch.int16).cpu().numpy())
                    dump["d"].append(hw[j].view(torch.int32).cpu().numpy())
                    dump["instruction"].append(np.full(j.numel(), MMA_INSTRUCTIONS.index(iname), np.int8))
                    dump["klass"].append(np.full(j.numel(), CLASSES.index(cname), np.int8))
        mma_eq_wgmma += int((~same_bits(hws[MMA_INSTRUCTIONS[0]], hws[MMA_INSTRUCTIONS[1]])).sum())
        if cname == "kperm":
            for iname, hw in hws.items():
                grp = hw.view(torch.int32).view(-1, 8)
                nan = torch.isnan(hw).view(-1, 8)
                inv = ((grp == grp[:, :1]) | (nan & nan[:, :1])).all(1)
                out(
                    f"  kperm {iname}: hardware result independent of the k order in {int(inv.sum())}"
                    f" of {grp.shape[0]} groups of 8 orders"
                )
        del acc, a, b
    out(f"mma.sync vs wgmma hardware: {mma_eq_wgmma} differing vectors over all classes")
    # K = 32 chains: two k16 steps in k order
    chain_bad = 0
    chain_n = 0
    for cname in ("gaussian", "mixed_exp", "cancel", "align_shift", "ties", "carry"):
        acc, a1, b1 = generate(cname, args.chain_count, args.seed + 1, dev)
        _, a2, b2 = generate(cname, args.chain_count, args.seed + 2, dev)
        a, b = torch.cat([a1, a2], 1), torch.cat([b1, b2], 1)
        hw = wgmma_k32_hw(acc, a, b)
        md = mma_bf16_f32(mma_bf16_f32(acc, a1, b1, instruction="wgmma.m64nNk16"), a2, b2, instruction="wgmma.m64nNk16")
        ok = same_bits(hw, md)
        chain_bad += int((~ok).sum())
        chain_n += acc.shape[0]
        if not bool(ok.all()):
            i = int((~ok).nonzero()[0])
            out(f"  chain mismatch ({cname}): acc={float(acc[i])!r} hw={float(hw[i])!r} model={float(md[i])!r}")
    out(f"{'k32_chain':<14} {'wgmma (tl.dot K=32)':<20} {chain_n:>9} {chain_bad:>10}")
    total_bad += chain_bad
    if args.variants:
        out("variant totals: " + ", ".join(f"{k}={v}" for k, v in variant_bad.items()))
    out(
        f"TOTAL: {total} instruction vectors (+{chain_n} K=32 chains), {total_bad} mismatches, {time.time() - t0:.1f} s"
    )
    if args.report:
        from pathlib import Path

        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text("\n".join(lines) + "\n")
    if args.dump and dump["acc"]:
        np.savez_compressed(args.dump, **{k: np.concatenate(v) for k, v in dump.items()})
    return 1 if total_bad else 0


def cmd_probe(args: argparse.Namespace) -> int:
    MMA_PROBES = _probes(args.simulate)[0]
    dev = "cpu" if args.simulate else "cuda"
    data: dict[str, list] = {"acc": [], "a": [], "b": [], "d": [], "instruction": [], "klass": []}
    for cname in CLASSES:
        n = args.per_class if cname != "hand" else len(_hand_cases("cpu")[0])
        acc, a, b = generate(cname, n, args.seed, dev)
        for iname in MMA_INSTRUCTIONS:
            hw = MMA_PROBES[iname](acc, a, b)
            data["acc"].append(acc.view(torch.int32).cpu().numpy().view(np.uint32))
            data["a"].append(a.view(torch.int16).cpu().numpy().view(np.uint16))
            data["b"].append(b.view(torch.int16).cpu().numpy().view(np.uint16))
            data["d"].append(hw.view(torch.int32).cpu().numpy().view(np.uint32))
            data["instruction"].append(np.full(acc.shape[0], MMA_INSTRUCTIONS.index(iname), np.int8))
            data["klass"].append(np.full(acc.shape[0], CLASSES.index(cname), np.int8))
    arrays = {k: np.concatenate(v) for k, v in data.items()}
    np.savez_compressed(
        args.out,
        **arrays,
        instructions=np.array(MMA_INSTRUCTIONS),
        classes=np.array(CLASSES),
        meta=np.array(json.dumps(environment(), sort_keys=True)),
    )
    print(f"wrote {args.out}: {arrays['acc'].shape[0]} vectors")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flint_moe.tools.mma", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="model vs hardware on random and adversarial inputs")
    v.add_argument("--report", default=None)
    v.add_argument("--count", type=int, default=1_200_000)
    v.add_argument("--seed", type=int, default=1)
    v.add_argument("--show", type=int, default=3)
    v.add_argument("--variants", action="store_true")
    v.add_argument("--dump", default=None)
    v.add_argument("--dump-max", type=int, default=3000)
    v.add_argument("--chain-count", type=int, default=20000)
    q = sub.add_parser("probe", help="save vectors with the hardware's outputs")
    q.add_argument("--out", required=True)
    q.add_argument("--per-class", type=int, default=150)
    q.add_argument("--seed", type=int, default=7)
    for sp in (v, q):
        sp.add_argument(
            "--simulate", action="store_true", help="CPU plumbing check: the model stands in for the hardware"
        )
    args = p.parse_args(argv)
    if not args.simulate and not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    return cmd_verify(args) if args.cmd == "verify" else cmd_probe(args)


if __name__ == "__main__":
    sys.exit(main())
