"""Shared-memory wavefronts of a Gluon ``local_store`` / ``local_load``, counted on the CPU (no GPU needed).

A distributed layout (``gl.BlockedLayout``, ``gl.NVMMADistributedLayout``, ``gl.DistributedLinearLayout``, ...)
says which tensor element each (register, lane, warp) holds; Triton's ``to_linear_layout`` gives it as XOR-linear
bases (the same call ``gl.to_linear_layout`` makes inside a kernel). A shared layout says at which element offset
each tensor element lives: :func:`swizzled_offsets` (``gl.SwizzledSharedLayout``) and :func:`padded_offsets` (a
row-padded layout, ``gl.PaddedSharedLayout.with_identity_for``) write them out. :func:`access` walks the
instructions a warp issues for the copy and counts, per instruction, the wavefronts the shared-memory pipe needs:

- vector width: the largest power of two ``v`` (at most 16 bytes) such that every run of ``v`` consecutive
  registers of every thread holds elements at consecutive offsets starting at a multiple of ``v`` (Triton
  vectorises a local store / load the same way, through the composition of the two layouts);
- a 4-byte access is served for all 32 lanes at once, an 8-byte one per half-warp, a 16-byte one per quarter-warp
  (the CUDA C++ Programming Guide, "Shared Memory" of compute capability 5.x and later; Hopper keeps 32 banks of
  4 bytes);
- within one such phase, each of the 32 banks serves one distinct 4-byte word per wavefront (lanes reading the same
  word share it): the phase costs as many wavefronts as the most distinct words any bank holds.

Not modelled: where Triton lowers a copy to ``ldmatrix`` / ``stmatrix`` (bf16 to or from the wgmma layouts, and the
fp32 loads of a column-major scratch, which Triton 3.6 reads as ``ldmatrix.x4`` of 8 x 16-byte rows) the count of
instructions differs from the scalar or vector accesses walked here; the bytes are the same and, where each
8-row matrix covers 32 consecutive words, so are the wavefronts. Shapes and layout parameters must be powers of
two (Triton's own layouts; other shapes abort the process inside Triton, so they are refused before it).

The ideal is one wavefront per phase; ``wavefronts - ideal`` is what Nsight Compute counts as bank conflicts
(``l1tex__data_bank_conflicts_pipe_lsu_mem_shared``). The model ignores the pipe's queueing and the ``cp.async`` /
wgmma traffic beside the copy.

``python -m benchmarks.smem_banks`` prints the grouped gate/up epilogue's scratch (``grouped_gluon._gate_up_store``:
the fp32 accumulator [128 weight rows, N pairs] stored from the wgmma layout, read back as the up and the gate
halves with one lane per intermediate column) for the kernels' column-major swizzled scratch (:data:`CURRENT`) and
the alternatives, per tile of the warp-specialised kernel; docs/kernels/nvfp4-grouped.md ("The gate/up epilogue's
scratch") reads it.
"""

from __future__ import annotations

import argparse
import dataclasses

__all__ = ["linear_bases", "element_of", "swizzled_offsets", "padded_offsets", "row_major_offsets", "access",
           "Access", "epilogue_table", "SCRATCHES", "CURRENT", "CURRENT_PARAMS"]  # fmt: skip

_BANKS, _WORD = 32, 4


def linear_bases(layout, shape) -> tuple[list, list, list]:
    """(register, lane, warp) bases of a Gluon distributed ``layout`` over ``shape``: each basis is the tensor
    coordinate that one bit of the register / lane / warp index adds (XOR-linear; Triton's linear layouts)."""
    from triton.experimental.gluon import language as gl

    if not isinstance(layout, gl.DistributedLinearLayout):
        from triton._C.libtriton import gluon_ir, ir

        ctx = ir.context()
        ir.load_dialects(ctx)
        builder = gluon_ir.GluonOpBuilder(ctx)
        layout = builder.to_linear_layout(layout._to_ir(builder), list(shape))
    return [list(b) for b in layout.reg_bases], [list(b) for b in layout.lane_bases], [list(b) for b in
                                                                                       layout.warp_bases]  # fmt: skip


def element_of(bases, index: int, rank: int = 2) -> tuple[int, ...]:
    """The coordinate (``rank`` entries) that ``index`` selects through XOR-linear ``bases`` (bit i of ``index``
    adds ``bases[i]``)."""
    coord = [0] * rank
    for i, basis in enumerate(bases):
        if index >> i & 1:
            coord = [c ^ b for c, b in zip(coord, basis, strict=True)]
    return tuple(coord)


def row_major_offsets(shape, order=(1, 0)):
    """Offsets of an unswizzled layout (``gl.SwizzledSharedLayout(1, 1, 1, order)``), ``order[0]`` the fastest
    dimension."""
    return swizzled_offsets(shape, 1, 1, 1, order)


def _pow2(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
            raise ValueError(f"{name}: expected a power of two (Triton's layouts), got {v!r}")


def swizzled_offsets(shape, vec: int, per_phase: int, max_phase: int, order=(1, 0)):
    """Offset function of ``gl.SwizzledSharedLayout(vec, per_phase, max_phase, order)`` over a 2-D ``shape``:
    with ``c`` the coordinate along the fastest dimension ``order[0]`` and ``r`` along the other, the element sits
    at ``r * shape[order[0]] + (((c // vec) ^ ((r // per_phase) % max_phase)) * vec + c % vec)``."""
    _pow2(rows=shape[0], cols=shape[1], vec=vec, per_phase=per_phase, max_phase=max_phase)
    fast, slow = order
    width = shape[fast]
    if width % vec or width // vec < max_phase:
        raise ValueError(f"swizzle: {width} elements along dimension {fast} hold {width // vec} vectors of {vec}, "
                         f"fewer than max_phase = {max_phase} (or not whole vectors)")  # fmt: skip

    def offset(coord):
        c, r = coord[fast], coord[slow]
        phase = (r // per_phase) % max_phase
        return r * width + ((c // vec) ^ phase) * vec + c % vec

    return offset


def padded_offsets(shape, interval: int, padding: int, order=(1, 0)):
    """Offset function of ``gl.PaddedSharedLayout.with_identity_for([[interval, padding]], shape, order)``: the
    unswizzled offset plus ``padding`` elements after every ``interval`` elements. Triton keeps the vector width of
    the unpadded layout, so a padding that is not a multiple of it misaligns the vectors (Triton 3.6 compiles +1
    word per fp32 row to 8-byte stores at 4-byte offsets): such a layout is not modelled, pad by the vector."""
    _pow2(interval=interval, padding=padding)
    plain = row_major_offsets(shape, order)

    def offset(coord):
        o = plain(coord)
        return o + (o // interval) * padding

    return offset


@dataclasses.dataclass(frozen=True)
class Access:
    """One local store or load: vector width in elements, instructions per warp, wavefronts and ideal wavefronts
    summed over the warps of the layout."""

    vec: int
    instructions: int
    wavefronts: int
    ideal: int

    @property
    def conflicts(self) -> int:
        return self.wavefronts - self.ideal


def _vector_bases(at, n_regs: int, n_warps: int, elem_bytes: int) -> list[int]:
    """Register-index bits of one vector: bit i of the result's k-th entry moves every thread's element by
    ``2**k`` offsets, from an offset aligned to the vector (at most 16 bytes); Triton picks the same register
    bases when it vectorises through the composed layouts."""
    chosen: list[int] = []
    threads = [(ln, w) for w in range(n_warps) for ln in range(32)]
    while (2 << len(chosen)) * elem_bytes <= 16:
        d, mask = 1 << len(chosen), sum(1 << k for k in chosen)
        pick = None
        for k in range(n_regs.bit_length() - 1):
            if k in chosen:
                continue
            bit = 1 << k
            if all(at(r | bit, ln, w) == at(r, ln, w) + d and at(r, ln, w) % (2 * d) == 0
                   for ln, w in threads for r in range(n_regs) if not r & (bit | mask)):  # fmt: skip
                pick = k
                break
        if pick is None:
            break
        chosen.append(pick)
    return chosen


def access(layout, shape, offset, elem_bytes: int = 4, origin=(0, 0)) -> Access:
    """Wavefronts of copying a tensor of ``shape`` in the distributed ``layout`` to / from shared memory whose
    element offsets are ``offset(coord)`` (coordinates of the allocation: the tensor's plus ``origin``, for a slice
    of it). ``elem_bytes``: 4 for fp32 / int32, 2 for bf16."""
    _pow2(**{f"shape[{i}]": d for i, d in enumerate(shape)})  # Triton aborts the process on other shapes
    if len(shape) != 2 or len(origin) != 2:
        raise ValueError(f"access: 2-D shapes and origins only, got {shape} and {origin}")
    reg, lane, warp = linear_bases(layout, shape)
    n_regs, n_warps = 1 << len(reg), 1 << len(warp)
    rank = len(shape)
    regs = [element_of(reg, r, rank) for r in range(n_regs)]
    lanes = [element_of(lane, ln, rank) for ln in range(32)]
    warps = [element_of(warp, w, rank) for w in range(n_warps)]

    def at(r, ln, w):
        return offset(tuple((a ^ b ^ c) + o for a, b, c, o in zip(regs[r], lanes[ln], warps[w], origin, strict=True)))

    vbits = _vector_bases(at, n_regs, n_warps, elem_bytes)
    v, vmask = 1 << len(vbits), sum(1 << k for k in vbits)
    firsts = [r for r in range(n_regs) if not r & vmask]
    words = max(1, v * elem_bytes // _WORD)
    lanes_per_phase = 32 // words
    wavefronts = ideal = 0
    for w in range(n_warps):
        for r0 in firsts:
            for p in range(0, 32, lanes_per_phase):
                banks: dict[int, set[int]] = {}
                for ln in range(p, p + lanes_per_phase):
                    first = at(r0, ln, w) * elem_bytes // _WORD
                    for word in range(first, first + words):
                        banks.setdefault(word % _BANKS, set()).add(word)
                wavefronts += max(len(s) for s in banks.values())
                ideal += 1
    return Access(v, n_regs // v, wavefronts, ideal)


#: The gate/up epilogue's scratch [R, N] (fp32) candidates: name -> offset function of (R, N).
SCRATCHES = {
    "row-major": lambda r, n: row_major_offsets((r, n)),
    "row-major, +2 words per row": lambda r, n: padded_offsets((r, n), n, 2),
    "column-major, swizzled (8, 2, 4)": lambda r, n: swizzled_offsets((r, n), 8, 2, 4, order=(0, 1)),
}
#: The candidate the kernels use (``grouped_gluon.EPILOGUE_SCRATCH``) and its parameters (vec, per_phase, max_phase,
#: order).
CURRENT, CURRENT_PARAMS = "column-major, swizzled (8, 2, 4)", (8, 2, 4, [0, 1])


def epilogue_table(block_m: int, kernel: str = "gluon_ws") -> list[dict]:
    """Per scratch layout: the store of the gate/up accumulator [R, block_m] from the wgmma layout and the two
    loads of its halves with ``grouped_gluon._gate_up_store``'s one-lane-per-column layout; ``kernel`` "gluon_ws"
    (R = 128 rows over 8 warps, ``grouped_gluon_ws.ws_layouts``) or "gluon" (R = 64 over 4 warps,
    ``grouped_gluon.gluon_layouts``)."""
    from triton.experimental.gluon import language as gl

    if kernel == "gluon_ws":
        from flint_moe.kernels.nvfp4.grouped_gluon_ws import WS_ROWS as rows, WS_WARPS as warps, ws_layouts

        mma = ws_layouts(block_m)[1]
    elif kernel == "gluon":
        from flint_moe.kernels.nvfp4.grouped_gluon import GLUON_ROWS as rows, GLUON_WARPS as warps, gluon_layouts

        mma = gluon_layouts(block_m, 128)[1]
    else:
        raise ValueError(f"kernel: expected 'gluon_ws' or 'gluon', got {kernel!r}")
    epi = gl.BlockedLayout([1, 1], [32, 1], [1, warps], [0, 1])
    out = []
    for name, make in SCRATCHES.items():
        off = make(rows, block_m)
        st = access(mma, (rows, block_m), off)
        ld = [access(epi, (rows // 2, block_m), off, origin=(h * rows // 2, 0)) for h in (0, 1)]
        out.append({"kernel": kernel, "rows": rows, "scratch": name, "store": st, "loads": ld,
                    "wavefronts": st.wavefronts + sum(a.wavefronts for a in ld),
                    "ideal": st.ideal + sum(a.ideal for a in ld)})  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-m", type=int, nargs="*", default=[128, 32, 16], help="pairs per accumulator")
    args = ap.parse_args(argv)
    print(f"{'kernel':9} {'R':>3} {'N':>4}  {'scratch':34} {'store v/instr/wf':>17} {'loads v/instr/wf':>17} "
          f"{'wavefronts':>10} {'ideal':>6}")  # fmt: skip
    for kernel, sizes in (("gluon_ws", args.block_m), ("gluon", [16])):
        for n in sizes:
            for row in epilogue_table(n, kernel):
                st, ld = row["store"], row["loads"]
                label = row["scratch"] + (" *" if row["scratch"] == CURRENT else "")
                print(f"{kernel:9} {row['rows']:>3} {n:>4}  {label:34} "
                      f"{st.vec:>3}/{st.instructions:>4}/{st.wavefronts:>7} "
                      f"{ld[0].vec:>3}/{2 * ld[0].instructions:>4}/{ld[0].wavefronts + ld[1].wavefronts:>7} "
                      f"{row['wavefronts']:>10} {row['ideal']:>6}")  # fmt: skip
    print("* the kernels' scratch (grouped_gluon.EPILOGUE_SCRATCH)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
