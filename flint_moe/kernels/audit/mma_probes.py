"""Triton probes running single sm_90 tensor-core instructions on independent test vectors (for reference.mma).

- ``mma_sync_hw(acc, a, b)``: one ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` (inline PTX) per 8
  vectors. Vector ``j`` of a tile is A row ``j`` (and its copy, row ``j + 8``), B column ``j`` and C[j, j]
  (and C[j + 8, j]); D[j, j] is the result (D[j + 8, j] must equal it: checked, RuntimeError otherwise).
- ``wgmma_hw(acc, a, b)``: one ``tl.dot`` of a [64, 16] bf16 tile by a [16, 64] bf16 tile into a [64, 64] fp32
  accumulator loaded from memory, which Triton lowers on sm_90 to exactly one
  ``wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16`` (``probe_ptx("wgmma")``); vector ``i`` of a tile is
  A row ``i``, B column ``i``, C[i, i] (the diagonal; the other outputs are not used).
- ``wgmma_k32_hw(acc, a, b)``: the same with K = 32 (a, b [N, 32]): Triton chains two k16 wgmmas.

Fragments of m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"): lane
``l = 4 g + t``; A registers a0..a3 hold (row g, cols 2t, 2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..), the
lower k in the low half; B registers b0, b1 hold (k 2t, 2t+1; col g), (k 2t+8, 2t+9; col g); C / D c0..c3 are
(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). The host packs the registers per lane; the kernel passes one lane's
registers to the inline PTX as one element of a [32 * num_warps] tensor and also returns ``%laneid``, which
the launcher checks (RuntimeError if element ``i`` did not run on lane ``i % 32``).
``mma_layout_check()`` multiplies one-hot A rows by a B whose entries are distinct, proving the mapping.

Inputs: acc fp32 [N], a and b bf16 [N, 16] (CUDA); returns fp32 [N]. TypeError / ValueError on wrong
dtypes, shapes or devices. Every launch pins ``enable_fp_fusion=True``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["mma_sync_hw", "wgmma_hw", "wgmma_k32_hw", "mma_layout_check", "probe_ptx", "MMA_PROBES"]

_WARPS = 4
_LANES = 32 * _WARPS

_MMA_ASM = tl.constexpr(
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, {$5, $6, $7, $8}, {$9, $10}, "
    "{$11, $12, $13, $14};\n\tmov.u32 $4, %laneid;"
)


@triton.jit
def _mma_sync_kernel(areg_ptr, breg_ptr, creg_ptr, dreg_ptr, lane_ptr, BLOCK: tl.constexpr):
    # one element per lane; 4 A words, 2 B words, 4 C floats per lane, stored [lanes, 4] / [lanes, 2]
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    a0 = tl.load(areg_ptr + 4 * offs)
    a1 = tl.load(areg_ptr + 4 * offs + 1)
    a2 = tl.load(areg_ptr + 4 * offs + 2)
    a3 = tl.load(areg_ptr + 4 * offs + 3)
    b0 = tl.load(breg_ptr + 2 * offs)
    b1 = tl.load(breg_ptr + 2 * offs + 1)
    c0 = tl.load(creg_ptr + 4 * offs)
    c1 = tl.load(creg_ptr + 4 * offs + 1)
    c2 = tl.load(creg_ptr + 4 * offs + 2)
    c3 = tl.load(creg_ptr + 4 * offs + 3)
    d0, d1, d2, d3, lane = tl.inline_asm_elementwise(
        _MMA_ASM,
        "=f,=f,=f,=f,=r,r,r,r,r,r,r,f,f,f,f",
        [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.int32),
        is_pure=False,
        pack=1,
    )
    tl.store(dreg_ptr + 4 * offs, d0)
    tl.store(dreg_ptr + 4 * offs + 1, d1)
    tl.store(dreg_ptr + 4 * offs + 2, d2)
    tl.store(dreg_ptr + 4 * offs + 3, d3)
    tl.store(lane_ptr + offs, lane)


@triton.jit
def _wgmma_kernel(a_ptr, b_ptr, c_ptr, d_ptr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    # tile t: A [BM, K] row-major at a_ptr + t*BM*K, B [K, BN] row-major, C / D [BM, BN] row-major
    t = tl.program_id(0).to(tl.int64)
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + t * BM * K + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + t * K * BN + rk[:, None] * BN + rn[None, :])
    c = tl.load(c_ptr + t * BM * BN + rm[:, None] * BN + rn[None, :])
    d = tl.dot(a, b, c, out_dtype=tl.float32)
    tl.store(d_ptr + t * BM * BN + rm[:, None] * BN + rn[None, :], d)


def _check(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, k: int) -> int:
    for name, t, dt in (("acc", acc, torch.float32), ("a", a, torch.bfloat16), ("b", b, torch.bfloat16)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dt:
            raise TypeError(f"{name}: dtype must be {dt}, got {t.dtype}")
        if t.device.type != "cuda":
            raise ValueError(f"{name}: the tensor-core probes run on a CUDA device, got {t.device}")
    n = acc.shape[0] if acc.dim() == 1 else -1
    if n < 0 or a.shape != (n, k) or b.shape != (n, k):
        raise ValueError(
            f"acc [N], a [N, {k}], b [N, {k}] expected, got {tuple(acc.shape)}, {tuple(a.shape)}, {tuple(b.shape)}"
        )
    return n


def _words(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., 2j] -> int32 [..., j]: pairs (lo, hi) packed with the lower index in the low half."""
    u = x.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return u[..., 0::2] | (u[..., 1::2] << 16)


def mma_sync_hw(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hardware ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` per vector (module docstring)."""
    n = _check(acc, a, b, 16)
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=acc.device)
    tiles = triton.cdiv(n, 8)
    tiles = triton.cdiv(tiles, _WARPS) * _WARPS
    pad = tiles * 8 - n
    dev = acc.device
    A8 = torch.cat([a, a.new_zeros(pad, 16)]).view(tiles, 8, 16)
    B8 = torch.cat([b, b.new_zeros(pad, 16)]).view(tiles, 8, 16)  # [tile, col j, k]
    C8 = torch.cat([acc, acc.new_zeros(pad)]).view(tiles, 8)
    A = torch.cat([A8, A8], dim=1)  # [tile, 16 rows, 16 k]
    C = torch.zeros(tiles, 16, 8, dtype=torch.float32, device=dev)
    idx = torch.arange(8, device=dev)
    C[:, idx, idx] = C8
    C[:, idx + 8, idx] = C8
    lane = torch.arange(32, device=dev)
    g, t = lane // 4, lane % 4
    Aw = _words(A)  # [tile, 16, 8 words]: word w = k (2w, 2w+1)
    Bw = _words(B8)  # [tile, 8 cols, 8 words]
    areg = torch.stack([Aw[:, g, t], Aw[:, g + 8, t], Aw[:, g, t + 4], Aw[:, g + 8, t + 4]], dim=-1)
    breg = torch.stack([Bw[:, g, t], Bw[:, g, t + 4]], dim=-1)
    creg = torch.stack([C[:, g, 2 * t], C[:, g, 2 * t + 1], C[:, g + 8, 2 * t], C[:, g + 8, 2 * t + 1]], dim=-1)
    areg, breg, creg = areg.contiguous(), breg.contiguous(), creg.contiguous()
    dreg = torch.empty_like(creg)
    lanes = torch.empty(tiles * 32, dtype=torch.int32, device=dev)
    grid = (tiles * 32 // _LANES,)
    _mma_sync_kernel[grid](areg, breg, creg, dreg, lanes, BLOCK=_LANES, num_warps=_WARPS, enable_fp_fusion=True)
    if not torch.equal(lanes.view(tiles, 32), lane.to(torch.int32).expand(tiles, 32)):
        raise RuntimeError("mma_sync_hw: element i of the probe did not run on lane i % 32")
    D = torch.empty(tiles, 16, 8, dtype=torch.float32, device=dev)
    D[:, g, 2 * t] = dreg[..., 0]
    D[:, g, 2 * t + 1] = dreg[..., 1]
    D[:, g + 8, 2 * t] = dreg[..., 2]
    D[:, g + 8, 2 * t + 1] = dreg[..., 3]
    d = D[:, idx, idx]
    d2 = D[:, idx + 8, idx]
    bits, bits2 = d.view(torch.int32), d2.view(torch.int32)
    if not bool(((bits == bits2) | (torch.isnan(d) & torch.isnan(d2))).all()):
        raise RuntimeError("mma_sync_hw: rows j and j + 8 of one tile gave different results for the same vector")
    return d.reshape(-1)[:n].contiguous()


def _wgmma(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    n = _check(acc, a, b, k)
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=acc.device)
    bm = 64
    tiles = triton.cdiv(n, bm)
    pad = tiles * bm - n
    dev = acc.device
    A = torch.cat([a, a.new_zeros(pad, k)]).view(tiles, bm, k).contiguous()
    B = torch.cat([b, b.new_zeros(pad, k)]).view(tiles, bm, k).transpose(1, 2).contiguous()  # [tile, k, col]
    C = torch.zeros(tiles, bm, bm, dtype=torch.float32, device=dev)
    idx = torch.arange(bm, device=dev)
    C[:, idx, idx] = torch.cat([acc, acc.new_zeros(pad)]).view(tiles, bm)
    D = torch.empty_like(C)
    _wgmma_kernel[(tiles,)](A, B, C, D, K=k, BM=bm, BN=bm, num_warps=4, enable_fp_fusion=True)
    return D[:, idx, idx].reshape(-1)[:n].contiguous()


def wgmma_hw(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hardware wgmma k16 step (``tl.dot`` [64, 16] x [16, 64] + acc) per vector (module docstring)."""
    return _wgmma(acc, a, b, 16)


def wgmma_k32_hw(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hardware ``tl.dot`` with K = 32 (two chained wgmma k16 steps) per vector; a, b bf16 [N, 32]."""
    return _wgmma(acc, a, b, 32)


MMA_PROBES = {"mma.sync.m16n8k16": mma_sync_hw, "wgmma.m64nNk16": wgmma_hw}


def mma_layout_check(device: str = "cuda") -> list[str]:
    """One-hot probe of the m16n8k16 fragment mapping: returns the list of problems (empty = mapping right).

    Vector v has a = e_k (one-hot at k = v % 16), b[k'] = k' + 1 + 16 * (v % 7), acc = 0: the result must be
    b[k] exactly (small integers, exact in every model).
    """
    n = 16 * 7 * 8
    v = torch.arange(n, device=device)
    a = torch.zeros(n, 16, device=device)
    a[v, v % 16] = 1.0
    b = (torch.arange(16, device=device)[None, :] + 1 + 16 * (v % 7)[:, None]).float()
    acc = torch.zeros(n, device=device)
    out = {}
    for name, fn in MMA_PROBES.items():
        out[name] = fn(acc, a.bfloat16(), b.bfloat16())
    want = b[v, v % 16]
    problems = []
    for name, d in out.items():
        bad = (d != want).nonzero().flatten()
        if bad.numel():
            i = int(bad[0])
            problems.append(
                f"{name}: {bad.numel()} one-hot vectors wrong, e.g. v={i}: got {float(d[i])}, want {float(want[i])}"
            )
    return problems


def probe_ptx(name: str, arch: int = 90) -> str:
    """PTX of probe ``name`` ("mma.sync", "wgmma", "wgmma_k32") compiled for sm_``arch`` (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if name == "mma.sync":
        src = ASTSource(
            fn=_mma_sync_kernel,
            signature={
                "areg_ptr": "*i32",
                "breg_ptr": "*i32",
                "creg_ptr": "*fp32",
                "dreg_ptr": "*fp32",
                "lane_ptr": "*i32",
                "BLOCK": "constexpr",
            },
            constexprs={"BLOCK": _LANES},
        )
    elif name in ("wgmma", "wgmma_k32"):
        k = 16 if name == "wgmma" else 32
        src = ASTSource(
            fn=_wgmma_kernel,
            signature={
                "a_ptr": "*bf16",
                "b_ptr": "*bf16",
                "c_ptr": "*fp32",
                "d_ptr": "*fp32",
                "K": "constexpr",
                "BM": "constexpr",
                "BN": "constexpr",
            },
            constexprs={"K": k, "BM": 64, "BN": 64},
        )
    else:
        raise ValueError(f"name: must be 'mma.sync', 'wgmma' or 'wgmma_k32', got {name!r}")
    compiled = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": True, "num_warps": 4}
    )
    return compiled.asm["ptx"]
