"""Summation-order declarations and their replay (rule "Accumulation", made exact for one kernel).

A kernel that accumulates a long dot product ``sum_k w[k] * x[k]`` declares the exact order of its fp32
operations as data (a JSON-serialisable dict, built next to the kernel from its launch configuration and the
reduction length). :func:`replay_dot` evaluates that order on the golden side, one IEEE binary32 operation
where the kernel performs one, so a kernel's accumulator can be compared with the replay bit for bit (the
any-order bound of :mod:`.exact` stays the second check). Pure torch; runs on the operands' device,
vectorised over rows and over independent lanes (a Python loop runs over the sequential levels only).

Declaration (``format`` = :data:`FORMAT`)
-----------------------------------------
``length``: K, the logical reduction length. ``parts``: ``[[start, stop], ...]``, a contiguous cover of
``[0, K)`` (one entry without split-K); each part is zero-padded to ``part_length`` elements (the padding is
``+0 * +0`` products and ``+0`` block scales: what a kernel's masked loads give; the kernel runs those
operations too, so they are replayed). ``axes``: ``[[name, size], ...]``, the mixed-radix decomposition of an
element's index inside its part, slowest axis first (the sizes multiply to ``part_length``). ``operands``:
``{"w_scale_log2": s, "w_dtype": "fp32" | "bf16"}``: the weights enter the products as ``w * 2^s`` (exact;
``bf16``: they must then be bf16 values, checked). ``program``: a list of stages applied in order; each
reduces the named axes of the current state (the axis ``part`` exists when there are several parts) and the
program must reduce every axis exactly once. The state starts as the per-element products (pairs ``(w, x)``);
a product stage turns it into fp32 values.

Stages (every fp32 operation is one IEEE-754 binary32 round-to-nearest-even with subnormals kept):

- ``{"op": "fma_chain", "axis": a, "init": "zero" | "first"}`` (products): along ``a`` in increasing index,
  ``acc = fma(w, x, acc)``; ``zero`` starts from ``+0``, ``first`` from ``RN(w_0 * x_0)``. ``a`` may also be
  a list of axis names, slowest first: one chain over those axes in row-major order (e.g. a lane that chains
  the 16 elements of each of its blocks, block after block: ``["j", "e"]``).
- ``{"op": "scale_fma_chain", "axis": a}`` (values; NVFP4 block regrouping): ``acc = fma(v, scale_b, acc)``
  from ``+0`` in increasing index, ``scale_b`` the E4M3 block scale of the value's block. Needs the block
  scales (:func:`replay_dot` ``block_scales``); the stages before it must have reduced exactly the innermost
  axes spanning one ``block`` (16) elements, and the parts must start on block boundaries.
- ``{"op": "add_chain", "axis": a, "init": "zero" | "first"}`` (values): ``acc = RN(acc + v)`` in increasing
  index.
- ``{"op": "tree", "axis": a, "shape": "adjacent" | "halves"}`` (values, size a power of two): ``adjacent``
  adds neighbours first (``v_{2i} + v_{2i+1}``, repeated: a pairwise tree); ``halves`` adds the two halves
  first (``v_i + v_{i+n/2}``, repeated: a ``shfl.bfly`` xor n/2, ..., 2, 1 butterfly).
- ``{"op": "mma_chain", "chain": [axes], "slots": [axes], "instruction": name}`` (products): the ``slots``
  axes (slowest first) number the 16 k positions of one tensor-core step, the ``chain`` axes (slowest first)
  the steps, applied in that order from an ``+0`` accumulator: ``acc = mma(acc, a = w * 2^s as bf16,
  b = x as bf16)`` (``instruction`` one of :data:`MMA_INSTRUCTIONS`; the step's function is injectable).
- ``{"op": "add_zero"}`` (values, elementwise): ``RN(v + 0)`` (turns -0 into +0; e.g. a reduction over lanes
  that hold zeros).
- ``{"op": "scale", "log2": n}`` (values, elementwise): ``RN(v * 2^n)``.

A declaration may also be ``None``-valued in a kernel's table (an order that cannot be declared, e.g. a
library GEMM); :func:`check_order` rejects ``None``.

The tensor-core step is ``flint_moe.reference.mma.mma_bf16_f32(acc, a, b, *, instruction)`` (imported when
first needed) unless a callable is passed as ``mma``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import torch

from ._fused import fused

__all__ = [
    "FORMAT",
    "MMA_INSTRUCTIONS",
    "OrderError",
    "check_order",
    "replay_dot",
    "replay_matmul",
    "order_summary",
]

FORMAT = "flint-order/1"
MMA_INSTRUCTIONS = ("mma.sync.m16n8k16", "wgmma.m64nNk16")
#: Elements of one NVFP4 block (one E4M3 scale).
BLOCK = 16
_MMA_K = 16
_OPS = ("fma_chain", "scale_fma_chain", "add_chain", "tree", "mma_chain", "add_zero", "scale")
_PRODUCT_OPS = ("fma_chain", "mma_chain")
#: Elements per evaluation chunk (rows x padded length) on the CPU / on a GPU: bounds the float64 temporaries.
_CHUNK_ELEMENTS = 1 << 25
_CHUNK_ELEMENTS_CUDA = 1 << 26

MmaStep = Callable[..., torch.Tensor]


class OrderError(ValueError):
    """A summation-order declaration that is malformed or does not fit the operands."""


# ---------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------


def _int(v, what: str, lo: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise OrderError(f"order: {what} must be an int >= {lo}, got {v!r}")
    return v


def _signed_int(v, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or abs(v) > 126:
        raise OrderError(f"order: {what} must be an int in [-126, 126], got {v!r}")
    return v


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_order(order: dict) -> dict:
    """Validate a declaration (module docstring); returns it unchanged.

    Raises :class:`OrderError` (a ValueError) naming the offending field: wrong ``format``, parts that do not
    cover ``[0, length)`` contiguously or exceed ``part_length``, axes whose sizes do not multiply to
    ``part_length`` or repeat a name, an unknown stage, a stage on a missing or already reduced axis, a stage
    on the wrong state (products vs values), a tree over a size that is not a power of two, MMA slots that are
    not 16, an unknown instruction, a block stage whose reduced axes do not span one block, axes left
    unreduced, or a declaration that is not JSON-serialisable.
    """
    if order is None:
        raise OrderError("order: None (the kernel's order is not declared; use the any-order bound)")
    if not isinstance(order, dict):
        raise OrderError(f"order: expected a dict, got {type(order).__name__}")
    if order.get("format") != FORMAT:
        raise OrderError(f"order: format must be {FORMAT!r}, got {order.get('format')!r}")
    try:
        json.dumps(order)
    except (TypeError, ValueError) as exc:
        raise OrderError(f"order: not JSON-serialisable ({exc})") from None
    k = _int(order.get("length"), "length", 1)
    plen = _int(order.get("part_length"), "part_length", 1)
    parts = order.get("parts")
    if not isinstance(parts, list) or not parts:
        raise OrderError(f"order: parts must be a non-empty list of [start, stop], got {parts!r}")
    pos = 0
    for i, p in enumerate(parts):
        if not (isinstance(p, list) and len(p) == 2):
            raise OrderError(f"order: parts[{i}] must be [start, stop], got {p!r}")
        a, b = _int(p[0], f"parts[{i}][0]"), _int(p[1], f"parts[{i}][1]")
        if a != pos or b <= a:
            raise OrderError(f"order: parts[{i}] = {p} must start at {pos} and be non-empty (contiguous cover)")
        if b - a > plen:
            raise OrderError(f"order: parts[{i}] = {p} is longer than part_length = {plen}")
        pos = b
    if pos != k:
        raise OrderError(f"order: parts end at {pos}, not at length = {k}")
    ops = order.get("operands", {})
    if not isinstance(ops, dict) or set(ops) - {"w_scale_log2", "w_dtype"}:
        raise OrderError(f"order: operands must be a dict with keys w_scale_log2, w_dtype, got {ops!r}")
    _signed_int(ops.get("w_scale_log2", 0), "operands.w_scale_log2")
    if ops.get("w_dtype", "fp32") not in ("fp32", "bf16"):
        raise OrderError(f"order: operands.w_dtype must be 'fp32' or 'bf16', got {ops.get('w_dtype')!r}")
    axes = order.get("axes")
    if not isinstance(axes, list) or not axes:
        raise OrderError(f"order: axes must be a non-empty list of [name, size], got {axes!r}")
    sizes: dict[str, int] = {}
    for i, ax in enumerate(axes):
        if not (isinstance(ax, list) and len(ax) == 2 and isinstance(ax[0], str)):
            raise OrderError(f"order: axes[{i}] must be [name, size], got {ax!r}")
        if ax[0] in sizes or ax[0] == "part":
            raise OrderError(f"order: axes[{i}]: name {ax[0]!r} repeated or reserved")
        sizes[ax[0]] = _int(ax[1], f"axes[{i}] size", 1)
    if math.prod(sizes.values()) != plen:
        raise OrderError(f"order: axis sizes {list(sizes.values())} multiply to {math.prod(sizes.values())}, "
                         f"not part_length = {plen}")  # fmt: skip
    names = [a[0] for a in axes]
    live = dict(sizes)
    if len(parts) > 1:
        live["part"] = len(parts)
    state = "products"
    reduced: list[str] = []  # element axes reduced so far (for the block check)
    program = order.get("program")
    if not isinstance(program, list) or not program:
        raise OrderError("order: program must be a non-empty list of stages")

    def take(i: int, name, what: str) -> int:
        if name not in live:
            raise OrderError(f"order: program[{i}] ({what}): axis {name!r} is not a live axis (live: {sorted(live)})")
        n = live.pop(name)
        if name != "part":
            reduced.append(name)
        return n

    for i, st in enumerate(program):
        if not isinstance(st, dict) or st.get("op") not in _OPS:
            raise OrderError(f"order: program[{i}]: unknown stage {st!r} (known ops: {', '.join(_OPS)})")
        op = st["op"]
        if op in _PRODUCT_OPS and state != "products":
            raise OrderError(f"order: program[{i}] ({op}) needs the products; they were already reduced")
        if op not in _PRODUCT_OPS and state != "values":
            raise OrderError(f"order: program[{i}] ({op}) needs fp32 values; reduce the products first")
        if op in ("fma_chain", "add_chain"):
            if st.get("init") not in ("zero", "first"):
                raise OrderError(f"order: program[{i}] ({op}): init must be 'zero' or 'first', got {st.get('init')!r}")
            ax = st.get("axis")
            if op == "fma_chain" and isinstance(ax, list):
                if not ax or len(set(map(str, ax))) != len(ax) or "part" in ax:
                    raise OrderError(f"order: program[{i}] (fma_chain): axis list {ax!r} empty, repeated or 'part'")
                for a in ax:
                    take(i, a, op)
            else:
                take(i, ax, op)
        elif op == "scale_fma_chain":
            inner = names[len(names) - len(reduced) :] if reduced else []
            if sorted(inner) != sorted(reduced) or math.prod(sizes[a] for a in reduced) != BLOCK:
                raise OrderError(
                    f"order: program[{i}] (scale_fma_chain): the axes reduced before it {reduced} must be the "
                    f"innermost axes spanning one block of {BLOCK} elements"
                )
            if any(p[0] % BLOCK for p in parts) or plen % BLOCK:
                raise OrderError(
                    f"order: program[{i}] (scale_fma_chain): parts and part_length must be multiples of {BLOCK}"
                )
            take(i, st.get("axis"), op)
        elif op == "tree":
            if st.get("shape") not in ("adjacent", "halves"):
                raise OrderError(
                    f"order: program[{i}] (tree): shape must be 'adjacent' or 'halves', got {st.get('shape')!r}"
                )
            n = take(i, st.get("axis"), op)
            if not _pow2(n):
                raise OrderError(
                    f"order: program[{i}] (tree): axis {st.get('axis')!r} has size {n}, not a power of two"
                )
        elif op == "mma_chain":
            if st.get("instruction") not in MMA_INSTRUCTIONS:
                raise OrderError(f"order: program[{i}] (mma_chain): instruction must be one of {MMA_INSTRUCTIONS}, "
                                 f"got {st.get('instruction')!r}")  # fmt: skip
            chain, slots = st.get("chain"), st.get("slots")
            if not isinstance(chain, list) or not isinstance(slots, list) or not slots:
                raise OrderError(f"order: program[{i}] (mma_chain): chain and slots must be lists of axis names")
            if len(set(chain + slots)) != len(chain + slots) or "part" in chain + slots:
                raise OrderError(f"order: program[{i}] (mma_chain): chain / slot axes repeated or 'part'")
            nslot = math.prod(take(i, a, op) for a in slots)
            for a in chain:
                take(i, a, op)
            if nslot != _MMA_K:
                raise OrderError(f"order: program[{i}] (mma_chain): the slot axes span {nslot} positions, not {_MMA_K}")
        elif op == "scale":
            _signed_int(st.get("log2"), f"program[{i}] (scale) log2")
        if op in _PRODUCT_OPS:
            state = "values"
    if state != "values" or live:
        raise OrderError(f"order: the program leaves axes unreduced: {sorted(live) or 'the products'}")
    return order


def _field(v) -> str:
    return "+".join(map(str, v)) if isinstance(v, list) else str(v)


def order_summary(order: dict) -> str:
    """One line describing a declaration (for reports and failure messages)."""
    check_order(order)
    st = " -> ".join(
        s["op"] + "(" + ",".join(_field(s[k]) for k in ("axis", "shape", "init", "log2") if k in s) + ")"
        for s in order["program"]
    )
    axes = "x".join(f"{n}{s}" for n, s in order["axes"])
    return f"K={order['length']} parts={len(order['parts'])}x{order['part_length']} axes={axes}: {st}"


# ---------------------------------------------------------------------------------------------------------
# exact binary32 operations
# ---------------------------------------------------------------------------------------------------------


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``RN(a * b + c)``, one rounding. a, b, c fp32 of one shape (broadcastable).

    ``a * b`` is exact in float64 (48 significant bits, exponent >= -298); the float64 sum is made
    round-to-odd (TwoSum error, then the last bit set toward the exact value), and RN to binary32 of a
    53-bit round-to-odd value equals RN of the exact value (53 >= 24 + 2), subnormals included.
    """
    p = a.double() * b.double()
    c64 = c.double()
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    fin = torch.isfinite(s)
    bits = s.view(torch.int64)
    fix = fin & (err != 0) & ((bits & 1) == 0)
    # moving one ulp toward the exact value (err's side) makes the last bit odd
    toward = torch.where((err > 0) == (s > 0), bits + 1, bits - 1)
    s = torch.where(fix, toward.view(torch.float64), s)
    return s.float()


def _fma32_on(t: torch.Tensor):
    """:func:`_fma32` for operands on ``t``'s device: on CUDA one fused kernel (``_fused.fused``: the float64
    operations fused are the same IEEE operations, and a contraction of ``a * b`` into an fma leaves every
    value unchanged because the float64 product is exact), eager elsewhere."""
    return _fma32_fused if t.is_cuda else _fma32


def _tree(v: torch.Tensor, shape: str) -> torch.Tensor:
    """Pairwise tree over the last dim (a power of two)."""
    while v.shape[-1] > 1:
        n = v.shape[-1]
        if shape == "adjacent":
            v = v[..., 0::2] + v[..., 1::2]
        else:
            v = v[..., : n // 2] + v[..., n // 2 :]
    return v[..., 0]


def _default_mma() -> MmaStep:
    try:
        from .mma import mma_bf16_f32
    except ImportError as exc:  # pragma: no cover - depends on the installed tree
        raise RuntimeError(
            "replay: this order has tensor-core steps and needs flint_moe.reference.mma.mma_bf16_f32 "
            f"(not importable: {exc}); pass mma= explicitly"
        ) from None
    return mma_bf16_f32


# ---------------------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------------------


class _State:
    """Per-row tensors [R, *live axis sizes] with their axis names."""

    def __init__(self, names: list[str], w, x, s):
        self.names, self.w, self.x, self.s, self.v = names, w, x, s, None

    def move_last(self, t: torch.Tensor, axes: list[str]) -> torch.Tensor:
        """``t`` with ``axes`` moved to the end (in that order)."""
        keep = [i for i, n in enumerate(self.names) if n not in axes]
        idx = [self.names.index(a) for a in axes]
        return t.permute(0, *[i + 1 for i in keep], *[i + 1 for i in idx])

    def drop(self, axes: list[str]) -> None:
        self.names = [n for n in self.names if n not in axes]


def _split_parts(t: torch.Tensor, parts: list, plen: int, fill: float = 0.0) -> torch.Tensor:
    """[R, K] -> [R, nparts, plen]: part i = t[:, start:stop] padded with ``fill``."""
    r = t.shape[0]
    out = torch.full((r, len(parts), plen), fill, dtype=t.dtype, device=t.device)
    for i, (a, b) in enumerate(parts):
        out[:, i, : b - a] = t[:, a:b]
    return out


def _run(order: dict, w: torch.Tensor, x: torch.Tensor, sc: torch.Tensor | None, mma: MmaStep | None):
    """Replay on rows: w, x fp32 [R, K], sc fp32 [R, K / 16] or None -> fp32 [R]."""
    parts, plen = order["parts"], order["part_length"]
    axes = order["axes"]
    names = ["part"] + [a[0] for a in axes]
    shape = [w.shape[0], len(parts)] + [a[1] for a in axes]
    wp = _split_parts(w, parts, plen).reshape(shape)
    xp = _split_parts(x, parts, plen).reshape(shape)
    sp = None
    if sc is not None:
        sp = _split_parts(sc.repeat_interleave(BLOCK, dim=1), parts, plen).reshape(shape)
    stt = _State(names, wp, xp, sp)
    if len(parts) == 1:  # a single part: no part axis to reduce
        stt.names = names[1:]
        stt.w, stt.x = wp[:, 0], xp[:, 0]
        stt.s = None if sp is None else sp[:, 0]
    for st in order["program"]:
        op = st["op"]
        if op == "fma_chain":
            chain = st["axis"] if isinstance(st["axis"], list) else [st["axis"]]
            wv, xv = stt.move_last(stt.w, chain), stt.move_last(stt.x, chain)
            wv = wv.reshape(*wv.shape[: wv.dim() - len(chain)], -1)  # the chain axes in row-major order
            xv = xv.reshape(*xv.shape[: xv.dim() - len(chain)], -1)
            n = wv.shape[-1]
            if st["init"] == "zero":
                acc, start = torch.zeros(wv.shape[:-1], dtype=torch.float32, device=w.device), 0
            else:
                acc, start = wv[..., 0] * xv[..., 0], 1
            fma = _fma32_on(acc)
            for i in range(start, n):
                acc = fma(wv[..., i], xv[..., i], acc)
            if stt.s is not None:
                sv = stt.move_last(stt.s, chain)
                stt.s = sv.reshape(*sv.shape[: sv.dim() - len(chain)], -1)[..., 0]
            stt.drop(chain)
            stt.v, stt.w, stt.x = acc, None, None
        elif op == "mma_chain":
            step = mma or _default_mma()
            chain, slots = st["chain"], st["slots"]
            wv = stt.move_last(stt.w, chain + slots)
            xv = stt.move_last(stt.x, chain + slots)
            lead = wv.shape[: wv.dim() - len(chain) - len(slots)]
            wv = wv.reshape(*lead, -1, _MMA_K).to(torch.bfloat16)
            xv = xv.reshape(*lead, -1, _MMA_K).to(torch.bfloat16)
            acc = torch.zeros(lead, dtype=torch.float32, device=w.device)
            for i in range(wv.shape[-2]):
                acc = step(acc, wv[..., i, :], xv[..., i, :], instruction=st["instruction"])
            stt.drop(chain + slots)
            stt.v, stt.w, stt.x, stt.s = acc, None, None, None
        elif op == "scale_fma_chain":
            a = st["axis"]
            vv, sv = stt.move_last(stt.v, [a]), stt.move_last(stt.s, [a])
            acc = torch.zeros(vv.shape[:-1], dtype=torch.float32, device=w.device)
            fma = _fma32_on(acc)
            for i in range(vv.shape[-1]):
                acc = fma(vv[..., i], sv[..., i], acc)
            stt.drop([a])
            stt.v, stt.s = acc, None
        elif op == "add_chain":
            a = st["axis"]
            vv = stt.move_last(stt.v, [a])
            if st["init"] == "zero":
                acc, start = torch.zeros(vv.shape[:-1], dtype=torch.float32, device=w.device), 0
            else:
                acc, start = vv[..., 0], 1
            for i in range(start, vv.shape[-1]):
                acc = acc + vv[..., i]
            if stt.s is not None:
                stt.s = stt.move_last(stt.s, [a])[..., 0]
            stt.drop([a])
            stt.v = acc
        elif op == "tree":
            a = st["axis"]
            stt.v = _tree(stt.move_last(stt.v, [a]), st["shape"])
            if stt.s is not None:
                stt.s = stt.move_last(stt.s, [a])[..., 0]
            stt.drop([a])
        elif op == "add_zero":
            stt.v = stt.v + 0.0
        elif op == "scale":
            stt.v = stt.v * (2.0 ** st["log2"])
    return stt.v.reshape(w.shape[0])


def _operands(order: dict, w: torch.Tensor, x: torch.Tensor, block_scales: torch.Tensor | None):
    """Checked fp32 operands [R, K] (w already times 2^s and, without a block stage, times its scales)."""
    k = order["length"]
    for name, t in (("w", w), ("x", x)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() < 1 or t.shape[-1] != k:
            raise OrderError(
                f"{name}: last dimension {tuple(t.shape)[-1:] or ()} does not match the order's length {k}"
            )
    if w.device != x.device:
        raise ValueError(f"w, x: on different devices ({w.device}, {x.device})")
    uses_blocks = any(s["op"] == "scale_fma_chain" for s in order["program"])
    if block_scales is None and uses_blocks:
        raise OrderError("block_scales: required by this order (it multiplies block partials by their scales)")
    if block_scales is not None:
        if not block_scales.is_floating_point() or block_scales.shape[-1] * BLOCK != k:
            raise OrderError(f"block_scales: expected a float tensor [..., {k // BLOCK}], got {block_scales.dtype} "
                             f"{tuple(block_scales.shape)}")  # fmt: skip
        if block_scales.device != w.device:
            raise ValueError(f"block_scales: on {block_scales.device}, w on {w.device}")
    return uses_blocks


def _check_exact(name: str, t: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    fin = torch.isfinite(t)
    if not torch.equal(torch.where(fin, t.to(dtype).float(), 0.0), torch.where(fin, t, 0.0)):
        raise OrderError(f"{name}: not exactly representable in {dtype} ({what})")


def replay_dot(
    order: dict,
    w: torch.Tensor,
    x: torch.Tensor,
    *,
    block_scales: torch.Tensor | None = None,
    mma: MmaStep | None = None,
) -> torch.Tensor:
    """fp32 value of ``sum_k w[..., k] * x[..., k]`` evaluated in the declared order (module docstring).

    Args:
        order: a declaration (:func:`check_order`).
        w: float [..., K], K = ``order["length"]``: the weights as exact values in the kernel's logical K
            order (dequantised NVFP4 weights, or with ``block_scales`` the unscaled E2M1 values).
        x: float [..., K] (broadcastable with ``w``'s leading dims): the activations (bf16 values).
        block_scales: float [..., K / 16] or None: the E4M3 block scales; required by an order with a
            ``scale_fma_chain`` stage, otherwise (if given) multiplied into ``w`` (exact for NVFP4).
        mma: the tensor-core step ``mma(acc fp32 [...], a bf16 [..., 16], b bf16 [..., 16], *, instruction)``;
            default ``flint_moe.reference.mma.mma_bf16_f32``.
    Returns: fp32 of the broadcast leading shape, on the operands' device.
    Raises: OrderError / ValueError (bad declaration, length or scale shape mismatch, operands that are not
    exact bf16 values where the order needs them), TypeError (non-float operands), RuntimeError (an MMA order
    without a tensor-core model).
    """
    check_order(order)
    uses_blocks = _operands(order, w, x, block_scales)
    k = order["length"]
    lead = torch.broadcast_shapes(w.shape[:-1], x.shape[:-1])
    if block_scales is not None:
        lead = torch.broadcast_shapes(lead, block_scales.shape[:-1])
    wf = w.float().expand(*lead, k).reshape(-1, k)
    xf = x.float().expand(*lead, k).reshape(-1, k)
    sf = None if block_scales is None else block_scales.float().expand(*lead, k // BLOCK).reshape(-1, k // BLOCK)
    has_mma = any(s["op"] == "mma_chain" for s in order["program"])
    if has_mma:
        _check_exact("x", xf, torch.bfloat16, "tensor-core operand")
    out = torch.empty(wf.shape[0], dtype=torch.float32, device=wf.device)
    chunk = _CHUNK_ELEMENTS_CUDA if wf.device.type == "cuda" else _CHUNK_ELEMENTS
    rows = max(1, chunk // max(order["part_length"] * len(order["parts"]), 1))
    ws = 2.0 ** order.get("operands", {}).get("w_scale_log2", 0)
    wbf = order.get("operands", {}).get("w_dtype", "fp32") == "bf16" or has_mma
    for r0 in range(0, wf.shape[0], rows):
        wc, xc = wf[r0 : r0 + rows], xf[r0 : r0 + rows]
        sc = None if sf is None else sf[r0 : r0 + rows]
        if sc is not None and not uses_blocks:
            wc, sc = wc * sc.repeat_interleave(BLOCK, dim=1), None
        if ws != 1.0:
            wc = wc * ws
        if wbf:
            _check_exact("w", wc, torch.bfloat16, "scaled weights entering a bf16 product")
        out[r0 : r0 + rows] = _run(order, wc, xc, sc, mma)
    return out.reshape(lead)


def replay_matmul(
    order: dict, x: torch.Tensor, w: torch.Tensor, *,
    block_scales: torch.Tensor | None = None, mma: MmaStep | None = None,
) -> torch.Tensor:
    """fp32 [M, N]: ``replay_dot`` of every (token row of ``x`` [M, K], weight row of ``w`` [N, K]) pair,
    ``block_scales`` [N, K / 16] or None; evaluated a slice of weight rows at a time. Errors as
    :func:`replay_dot`."""
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise OrderError(f"{name}: expected a 2-d tensor, got {getattr(t, 'shape', type(t).__name__)}")
    m, n = x.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=torch.float32, device=w.device)
    chunk = _CHUNK_ELEMENTS_CUDA if w.device.type == "cuda" else _CHUNK_ELEMENTS
    step = max(1, chunk // max(m * w.shape[1], 1))
    for j in range(0, n, step):
        sc = None if block_scales is None else block_scales[j : j + step][None]
        out[:, j : j + step] = replay_dot(order, w[j : j + step][None], x[:, None], block_scales=sc, mma=mma)
    return out


_fma32_fused = fused(_fma32)
