"""A CPU model of the decode block's CuTe expert kernels (flint_moe/kernels/cute/ll_partial.py partial kernel,
ll_gate_up.py ``finish``, ll_down.py ``combine``), written from their source: it takes the very arguments the
launchers pass to the compiled host functions (recorded in place of ``ll_launch._run``) and writes the same
outputs, reading the flat weight views through the kernels' own addressing functions. The partial kernel's work
mapping (one CTA per selected expert accumulating all its pairs from one read) does not change a pair's value,
so the model computes each pair on its own in the declared lane and split order; its exact decode is
:func:`decode_e2m1` / :func:`decode_e4m3` (the value the kernel's f16x2 decode gives). Every fp32 operation is one IEEE
binary32 operation (``fma`` exact, ``ex2`` / ``rcp`` the golden model's bit-exact emulations), vectorised over
rows and lanes. It lets the op's host side (views, taps, argument order) run end to end on the CPU; it says
nothing about the DSL's code generation (that is the GPU test's job)."""

from __future__ import annotations

import torch

from flint_moe.kernels.cute.ll_gate_up import (
    codes_row_word,
    gate_up_rows,
    scale_block_byte,
    scale_block_shape,
    scale_row_byte,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.orders import _fma32

SWIGLU_C = torch.tensor(-1.44269502162933349609375, dtype=torch.float32)

#: fp32 scale factors that turn the fp32 read of a code's bits into its value (exact powers of two).
E2M1_SCALE = 2.0**126
E4M3_SCALE = 2.0**120


def decode_e2m1(c, as_f32, mul):
    """Exact fp32 value of the E2M1 nibble ``c`` (bit 3 sign, 2-bit exponent, 1-bit mantissa): its sign moved
    to bit 31 and exponent + mantissa to bits 22-24 read as an fp32 (a subnormal for exponent 0) times 2^126,
    ``mul(as_f32(bits), E2M1_SCALE)``. ``as_f32``: int bit pattern -> fp32; ``mul``: an fp32 multiply that keeps
    subnormal inputs (no flush to zero)."""
    return mul(as_f32(((c & 8) << 28) | ((c & 7) << 22)), E2M1_SCALE)


def decode_e4m3(s, as_f32, mul):
    """Exact fp32 value of the E4M3 byte ``s`` (bit 7 sign, 4-bit exponent with bias 7, 3-bit mantissa; the NaN
    bytes 0x7F / 0xFF are refused by the weights' checks): exponent + mantissa moved to bits 20-26 read as an
    fp32 times 2^120 (bias 127 - 7), subnormal bytes included. ``s`` may be sign-extended (only bits 0-7 are
    read); ``as_f32`` and ``mul`` as :func:`decode_e2m1`."""
    return mul(as_f32(((s & 0x80) << 24) | ((s & 0x7F) << 20)), E4M3_SCALE)


def _as_f32(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)  # int32 bit patterns (shifts into bit 31 wrap)


def _mul(a, b) -> torch.Tensor:
    return torch.as_tensor(a, dtype=torch.float32) * torch.as_tensor(b, dtype=torch.float32)


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    return to_bf16(v).view(torch.int16)


def partial(x, ids, w, sf, ws, top_k, K, N, KV, S, routed, x_by_pair, pairs) -> None:  # noqa: N803
    """The partial kernel's values, pair by pair: ``ws[(q * S + s) * N + row]`` for every pair q < ``pairs``."""
    rows = torch.arange(N)
    lanes = torch.arange(32)
    bps = -(-(K // 16) // S)  # blocks per split, the last split may hold fewer
    mp, kp = scale_block_shape(N, K)
    sf32 = sf.view(torch.int8).to(torch.int32)  # sign-extended bytes: only bits 0-7 are read
    for q in range(pairs):
        e = int(ids[q]) if routed else 0
        xr = q if (not routed or x_by_pair) else q // top_k
        w_row = codes_row_word(e, rows, N, K)[:, None]
        sf_row = scale_row_byte(e, rows, mp, kp)[:, None]
        for s in range(S):
            acc = torch.zeros(N, 32, dtype=torch.float32)
            for j in range(-(-bps // 32)):
                jb = j * 32 + lanes  # [32]
                blk = s * bps + jb
                valid = ((jb < bps) & (blk * 16 < KV))[None, :]
                blk = torch.where(valid[0], blk, 0)  # the kernel reads block 0 there and keeps its sum
                sc = decode_e4m3(sf32[sf_row + scale_block_byte(blk)[None, :]], _as_f32, _mul)
                for half in range(2):
                    word = w[w_row + blk[None, :] * 2 + half]
                    for n in range(8):
                        h = blk * 16 + half * 8 + n
                        wv = _mul(decode_e2m1((word >> (4 * n)) & 15, _as_f32, _mul), sc)
                        xv = x[(xr * K + h).clamp(max=x.numel() - 1)].float()[None, :].expand(N, 32)
                        acc = torch.where(valid, _fma32(xv, wv, acc), acc)
            for off in (16, 8, 4, 2, 1):
                acc = acc + acc[:, lanes ^ off]
            ws[(q * S + s) * N + rows] = acc[:, 0]


def gate_up(tensors, ints, constexprs) -> None:
    """``_gate_up_host``: partial over the 2Ip rows, then ``finish``."""
    x, ids, w, sf, gs, ws, act, g_tap, u_tap = tensors
    pairs, top_k = ints
    H, IP, S, routed, tap, topk = constexprs  # noqa: N806
    assert topk == top_k
    partial(x, ids, w, sf, ws, top_k, H, 2 * IP, H, S, routed, False, pairs)
    i = torch.arange(IP)
    g_row, u_row = gate_up_rows(i, IP, routed)
    for q in range(pairs):
        e = int(ids[q]) if routed else 0
        base = q * S * 2 * IP
        g_acc, u_acc = ws[base + g_row], ws[base + u_row]
        for s in range(1, S):
            g_acc = g_acc + ws[base + s * 2 * IP + g_row]
            u_acc = u_acc + ws[base + s * 2 * IP + u_row]
        if tap:
            g_tap[q * IP + i] = g_acc
            u_tap[q * IP + i] = u_acc
        g, u = g_acc * gs[e], u_acc * gs[e]
        r = rcp_approx_ftz(ex2_approx_ftz(g * SWIGLU_C) + 1.0)
        act[q * IP + i] = _bf16_bits(u * (g * r))


def down(tensors, ints, constexprs) -> None:
    """``_down_host``: routed and shared partials, then ``combine``."""
    act, sact, ids, tw, w2, sf2, gs2, sw2, ssf2, gs_s, ws_r, ws_s, out, acc_tap, y_tap, sacc_tap, sy_tap = tensors
    (tokens,) = ints
    H, IP, IV, SI, TOPK, S, SS, tap = constexprs  # noqa: N806
    partial(act, ids, w2, sf2, ws_r, TOPK, IP, H, IV, S, True, True, tokens * TOPK)
    partial(sact, ids, sw2, ssf2, ws_s, TOPK, SI, H, SI, SS, False, True, tokens)
    h = torch.arange(H)
    for t in range(tokens):
        acc = torch.zeros(H, dtype=torch.float32)
        for j in range(TOPK):
            q = t * TOPK + j
            ya = ws_r[q * S * H + h]
            for s in range(1, S):
                ya = ya + ws_r[q * S * H + s * H + h]
            yb = _bf16_bits(ya * gs2[int(ids[q])])
            if tap:
                acc_tap[q * H + h] = ya
                y_tap[q * H + h] = yb
            acc = _fma32(tw[q].expand(H), yb.view(torch.bfloat16).float(), acc)
        sa = ws_s[t * SS * H + h]
        for s in range(1, SS):
            sa = sa + ws_s[t * SS * H + s * H + h]
        sb = _bf16_bits(sa * gs_s[0])
        if tap:
            sacc_tap[t * H + h] = sa
            sy_tap[t * H + h] = sb
        out[t * H + h] = _bf16_bits(to_bf16(acc).float() + sb.view(torch.bfloat16).float())


def run(kind, spec, tap, device, ns, tensors, ints, constexprs) -> None:
    """Stands in for ``ll_launch._run`` (``kind`` ``"gate_up"`` or ``"down"``)."""
    {"gate_up": gate_up, "down": down}[kind](tensors, ints, constexprs)
