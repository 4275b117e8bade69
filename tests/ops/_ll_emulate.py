"""A CPU model of the decode block's CuTe expert kernels (flint_moe/kernels/cute/ll_gate_up.py ``partial`` /
``finish``, ll_down.py ``combine``), written from their source: it takes the very arguments the launchers pass
to the compiled host functions (recorded in place of ``ll_launch._run``) and writes the same outputs, reading
the flat weight views through the kernels' own addressing functions. Every fp32 operation is one IEEE
binary32 operation (``fma`` exact, ``ex2`` / ``rcp`` the golden model's bit-exact emulations), vectorised over
rows and lanes. It lets the op's host side (views, taps, argument order) run end to end on the CPU; it says
nothing about the DSL's code generation (that is the GPU test's job)."""

from __future__ import annotations

import torch

from flint_moe.kernels.cute.ll_gate_up import (
    codes_row_word,
    decode_e2m1,
    decode_e4m3,
    gate_up_rows,
    scale_block_byte,
    scale_block_shape,
    scale_row_byte,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.orders import _fma32

SWIGLU_C = torch.tensor(-1.44269502162933349609375, dtype=torch.float32)


def _as_f32(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)  # int32 bit patterns (shifts into bit 31 wrap)


def _mul(a, b) -> torch.Tensor:
    return torch.as_tensor(a, dtype=torch.float32) * torch.as_tensor(b, dtype=torch.float32)


def _bf16_bits(v: torch.Tensor) -> torch.Tensor:
    return to_bf16(v).view(torch.int16)


def partial(x, ids, w, sf, ws, top_k, K, N, KV, S, routed, x_by_pair, pairs) -> None:  # noqa: N803
    """``_partial_kernel`` over the grid (N / 4, S, pairs): ``ws[(q * S + s) * N + row]``."""
    rows = torch.arange(N)
    lanes = torch.arange(32)
    bps = -(-(K // 16) // S)  # blocks per split, the last split may hold fewer
    mp, kp = scale_block_shape(N, K)
    sf32 = sf.view(torch.int8).to(torch.int32)  # the kernel's sign-extended byte read
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
                blk = torch.where(valid[0], blk, 0)  # the kernel reads nothing there: any in-range address
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
    H, IP, S, routed, tap = constexprs  # noqa: N806
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
    """Stands in for ``ll_launch._run``."""
    if kind == "gate_up_stream":  # the streaming build: the same values, one more constexpr (top_k)
        kind, constexprs = "gate_up", constexprs[:-1]
    (gate_up if kind.startswith("gate_up") else down)(tensors, ints, constexprs)
