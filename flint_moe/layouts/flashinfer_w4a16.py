"""ModelOpt NVFP4 experts -> FlashInfer's CuTe-DSL W4A16 layout (``FlintMoEWeights``).

Layout (shared/notes/layouts.md, "FlashInfer CuTe-DSL W4A16 layout"):

- ``w1`` uint8 [E, 2Ip, H/2]: [up; gate] interleaved by 64 rows (``rows.w13_rows_cutedsl``); FlashInfer
  ``reorder_w13_to_w31`` + ``fused_moe.prepare.interleave_cute_dsl_moe_weights`` (64-row groups).
- ``w1_sf_swizzled`` float8_e4m3fn [E, roundup(2Ip, 128), roundup(H/16, 4)]: the same rows, 128x4 swizzle
  (``swizzle.swizzle_block_scales``); ``w1_sf`` its 6-D MMA view (``cute_dsl.utils.convert_sf_to_mma_layout``).
- ``w1_alpha`` fp32 [E]: the per-expert gate/up global scale (ModelOpt ``weight_scale_2``).
- ``w2`` uint8 [E, H, Ip/2], ``w2_sf_swizzled`` [E, roundup(H, 128), roundup(Ip/16, 4)], ``w2_sf``, ``w2_alpha``.

Ip is the (optionally padded) intermediate size; each half of w13 is padded on its own, w2 along K.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from flint_moe.layouts._core import (
    DEFAULT_SCRATCH_BYTES,
    check_codes,
    check_global_scales,
    check_no_nan_e4m3,
    check_nvfp4_rest,
    gather_rows,
    gather_rows_inplace,
    has_data,
)
from flint_moe.layouts.padding import pad_columns, padded_intermediate
from flint_moe.layouts.rows import w13_rows_cutedsl
from flint_moe.layouts.swizzle import mma_view, swizzle_block_scales, swizzled_scale_shape
from flint_moe.reference._checks import check_tensor

__all__ = ["FlintMoEWeights", "INTERLEAVE_ROWS", "TENSOR_FIELDS", "merge_gate_up_global_scales"]

#: Rows per gate/up group of the CuTe-DSL interleave (FlashInfer's default, swap_ab=False).
INTERLEAVE_ROWS = 64

GlobalScales = torch.Tensor | Sequence[torch.Tensor]


def _check_global(name: str, t: object, num_experts: int) -> torch.Tensor:
    t = check_tensor(name, t, dtype=torch.float32, shape=(num_experts,))
    check_global_scales(name, t)
    return t


def merge_gate_up_global_scales(
    w13_scale_2: GlobalScales, num_experts: int, name: str = "w13_scale_2"
) -> torch.Tensor:
    """One fp32 [E] gate/up global scale from ModelOpt's per-projection ``weight_scale_2``.

    Accepts fp32 [E] (already shared), fp32 [E, 2] (column 0 = gate, column 1 = up, vLLM's parameter), or a
    pair ``(gate [E], up [E])``. Raises ValueError if gate and up differ for any expert (the Flint rule has a
    single global scale per expert; the message names the experts), if a scale is NaN/inf/negative (-0.0
    included), or on a wrong shape; TypeError on a non-fp32 dtype.
    """
    if isinstance(w13_scale_2, (tuple, list)):
        if len(w13_scale_2) != 2:
            raise ValueError(
                f"{name}: expected a (gate, up) pair of [E] tensors, got {len(w13_scale_2)} items"
            )
        gate = _check_global(f"{name}[gate]", w13_scale_2[0], num_experts)
        up = _check_global(f"{name}[up]", w13_scale_2[1], num_experts)
    else:
        t = check_tensor(name, w13_scale_2, dtype=torch.float32)
        if t.dim() == 1:
            return _check_global(name, t, num_experts).clone()
        check_tensor(name, t, shape=(num_experts, 2))
        gate = _check_global(f"{name}[:, 0] (gate)", t[:, 0], num_experts)
        up = _check_global(f"{name}[:, 1] (up)", t[:, 1], num_experts)
    differ = gate.view(torch.int32) != up.view(torch.int32)
    if bool(differ.any()):
        ids = differ.nonzero().flatten()[:8].tolist()
        e = ids[0]
        raise ValueError(
            f"{name}: gate and up global scales differ for experts {ids}"
            f"{' ...' if int(differ.sum()) > 8 else ''} (expert {e}: gate {float(gate[e])!r}, up {float(up[e])!r});"
            " the Flint rule needs one global scale per expert"
        )
    return gate.clone()


#: FlintMoEWeights' tensor fields, in constructor order.
TENSOR_FIELDS = ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha")


@dataclass(frozen=True, eq=False)
class FlintMoEWeights:
    """Routed-expert NVFP4 weights in FlashInfer's CuTe-DSL W4A16 layout (see module docstring for shapes).

    ``w1_sf`` / ``w2_sf`` are the 6-D MMA views over ``w1_sf_swizzled`` / ``w2_sf_swizzled`` (shared storage:
    updating the swizzled tensors in place is visible through the views). ``valid_intermediate`` is the
    checkpoint's intermediate size before padding.

    Immutable: assigning a field raises ``dataclasses.FrozenInstanceError``; to change a tensor, build a new
    instance (``dataclasses.replace(w, w2=...)`` runs every check again) or copy new values into the existing
    storage with :meth:`refresh_` (checked first, like the constructor). Equality is identity.

    The constructor checks (TypeError for a dtype, ValueError otherwise, naming the field): dtypes, shapes
    consistent with ``w1`` [E, 2Ip, H/2] (2Ip a multiple of 128, H of 16), one device, contiguity,
    ``0 < valid_intermediate <= Ip``; and the values: ``w1_alpha`` / ``w2_alpha`` finite and >= +0.0 (NaN,
    infinities and negative values, -0.0 included, rejected), no E4M3 NaN byte (0x7F / 0xFF) in
    ``w1_sf_swizzled`` / ``w2_sf_swizzled`` (the checks of the checkpoint loaders and ``from_modelopt``). The
    value checks read the tensors (a device synchronisation); tensors without data (meta / fake tensors)
    skip them. The tensors themselves stay mutable (in-place writes, ``.data =``, ``resize_``), so every op
    taking FlintMoEWeights repeats the metadata part at entry (:meth:`check_metadata`: host-side, no
    synchronisation, nothing cached).
    """

    w1: torch.Tensor
    w1_sf_swizzled: torch.Tensor
    w1_alpha: torch.Tensor
    w2: torch.Tensor
    w2_sf_swizzled: torch.Tensor
    w2_alpha: torch.Tensor
    valid_intermediate: int
    w1_sf: torch.Tensor = field(init=False, repr=False)
    w2_sf: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._check_tensors("")
        object.__setattr__(self, "w1_sf", mma_view(self.w1_sf_swizzled, name="w1_sf_swizzled"))
        object.__setattr__(self, "w2_sf", mma_view(self.w2_sf_swizzled, name="w2_sf_swizzled"))
        if has_data(self.w1):
            check_global_scales("w1_alpha", self.w1_alpha)
            check_global_scales("w2_alpha", self.w2_alpha)
            for n in ("w1_sf_swizzled", "w2_sf_swizzled"):
                check_no_nan_e4m3(n, getattr(self, n), self.scale_data_mask(n))

    def scale_data_mask(self, name: str) -> torch.Tensor:
        """bool [1, rows, cols] of ``name`` (``"w1_sf_swizzled"`` / ``"w2_sf_swizzled"``): True at the bytes
        that hold a block scale of the checkpoint, False at padding (rows to 128, scale columns to 4, the
        padded intermediate rows / columns), which the kernels never use and which may hold any byte. Built by
        swizzling a one-expert probe with the layout's own functions. ValueError for another name."""
        H, Ip, I = self.hidden_size, self.intermediate_size, self.valid_intermediate  # noqa: E741
        dev = self.w1.device
        if name == "w1_sf_swizzled":
            probe = torch.ones((1, 2 * I, H // 16), dtype=torch.uint8, device=dev)
            rows = w13_rows_cutedsl(I, Ip, INTERLEAVE_ROWS, device=dev)
            out = swizzle_block_scales(probe, rows=rows, name=name)
        elif name == "w2_sf_swizzled":
            probe = torch.ones((1, H, I // 16), dtype=torch.uint8, device=dev)
            out = swizzle_block_scales(probe, cols=Ip // 16, name=name)
        else:
            raise ValueError(f"scale_data_mask: name must be w1_sf_swizzled or w2_sf_swizzled, got {name!r}")
        return out.view(torch.uint8) != 0

    def check_metadata(self, name: str = "weights") -> None:
        """Check every tensor's dtype, shape (against ``w1``'s E, Ip, H), device and contiguity, and that
        ``w1_sf`` / ``w2_sf`` still view the swizzled tensors: host-side only (no synchronisation, no value
        read, nothing cached). TypeError (dtype) / ValueError naming ``{name}.<field>``. Every op taking
        FlintMoEWeights calls it at entry: a tensor changed in place (``.data =``, ``resize_``, ``set_``)
        after construction is refused before any kernel reads it."""
        p = f"{name}." if name else ""
        if not self._metadata_ok():
            self._check_tensors(p)  # raises, naming the field and the constraint
        for view in ("w1_sf", "w2_sf"):
            v, base = getattr(self, view), getattr(self, view + "_swizzled")
            e, mp, kp = base.shape
            want = ((32, 4, mp // 128, 4, kp // 4, e), (16, 4, kp // 4 * 512, 1, 512, mp * kp))
            # plain tensors only: a fake tensor (shape propagation) has no data pointer
            moved = type(v) is torch.Tensor and v.data_ptr() != base.data_ptr()
            if moved or (tuple(v.shape), v.stride()) != want:
                raise ValueError(
                    f"{p}{view}: no longer the MMA view of {p}{view}_swizzled (a tensor was replaced in place); "
                    "build a new FlintMoEWeights"
                )

    def _metadata_ok(self) -> bool:
        """Fast path of :meth:`check_metadata`: every dtype / shape / device / contiguity as expected."""
        w1 = self.w1
        if not isinstance(w1, torch.Tensor) or w1.dim() != 3:
            return False
        E, two_ip, h2 = w1.shape
        ip, hidden, vi = two_ip // 2, 2 * h2, self.valid_intermediate
        if not (E > 0 and h2 > 0 and two_ip > 0 and two_ip % (2 * INTERLEAVE_ROWS) == 0 and hidden % 16 == 0
                and type(vi) is int and 0 < vi <= ip):  # fmt: skip
            return False
        u8, fp8, f32 = torch.uint8, torch.float8_e4m3fn, torch.float32
        dev = w1.device
        for t, dtype, shape in (
            (self.w1_sf_swizzled, fp8, (E, -(-two_ip // 128) * 128, -(-hidden // 64) * 4)),  # swizzled (2Ip, H/16)
            (self.w1_alpha, f32, (E,)),
            (self.w2, u8, (E, hidden, ip // 2)),
            (self.w2_sf_swizzled, fp8, (E, -(-hidden // 128) * 128, -(-ip // 64) * 4)),  # swizzled (H, Ip/16)
            (self.w2_alpha, f32, (E,)),
        ):
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.shape != shape or t.device != dev:
                return False
            if not t.is_contiguous():
                return False
        return w1.dtype == u8 and w1.is_contiguous()

    def _check_tensors(self, p: str) -> None:
        w1 = check_codes(p + "w1", self.w1, (None, None, None))
        E, two_ip, h2 = w1.shape
        if E <= 0 or h2 <= 0 or two_ip <= 0 or two_ip % (2 * INTERLEAVE_ROWS):
            raise ValueError(
                f"{p}w1: expected [E >= 1, 2Ip, H/2] with 2Ip a positive multiple of {2 * INTERLEAVE_ROWS}, got "
                f"shape {tuple(w1.shape)}"
            )
        ip, hidden = two_ip // 2, 2 * h2
        if hidden % 16:
            raise ValueError(f"{p}w1: hidden size H = 2 * {h2} = {hidden} must be a multiple of 16 (NVFP4 block)")
        fp8 = torch.float8_e4m3fn
        check_codes(p + "w2", self.w2, (E, hidden, ip // 2))
        check_tensor(p + "w1_sf_swizzled", self.w1_sf_swizzled, dtype=fp8,
                     shape=(E, *swizzled_scale_shape(two_ip, hidden // 16)))  # fmt: skip
        check_tensor(p + "w2_sf_swizzled", self.w2_sf_swizzled, dtype=fp8,
                     shape=(E, *swizzled_scale_shape(hidden, ip // 16)))  # fmt: skip
        check_tensor(p + "w1_alpha", self.w1_alpha, dtype=torch.float32, shape=(E,))
        check_tensor(p + "w2_alpha", self.w2_alpha, dtype=torch.float32, shape=(E,))
        vi = self.valid_intermediate
        if isinstance(vi, bool) or not isinstance(vi, int) or not 0 < vi <= ip:
            raise ValueError(f"{p}valid_intermediate: {vi!r} must be an int in (0, {ip}]")
        dev = w1.device
        for n in TENSOR_FIELDS:
            t = getattr(self, n)
            if t.device != dev:
                raise ValueError(f"{p}{n}: on {t.device}, but {p}w1 is on {dev}")
            if not t.is_contiguous():
                raise ValueError(f"{p}{n}: must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")

    def refresh_(self, **tensors: torch.Tensor) -> FlintMoEWeights:
        """Copy new values into this instance's own tensors, in place (their storage, and so every CUDA graph
        captured over them, stays valid), and return ``self``.

        ``tensors``: keyword arguments named after :data:`TENSOR_FIELDS` (any subset), each a tensor of exactly
        the field's dtype and shape on the field's device (contiguity not required: values are copied). All
        of them are checked before anything is written, the values as the constructor checks them (alphas
        finite and >= +0.0, no E4M3 NaN scale byte), so a refused refresh changes nothing. The arguments are
        only read. Raises TypeError (unknown field, not a tensor, dtype) or ValueError (shape, device, values)
        naming the field."""
        unknown = sorted(set(tensors) - set(TENSOR_FIELDS))
        if unknown:
            raise TypeError(f"refresh_: unknown field(s) {', '.join(unknown)} (known: {', '.join(TENSOR_FIELDS)})")
        for n, new in tensors.items():
            old = getattr(self, n)
            if not isinstance(new, torch.Tensor):
                raise TypeError(f"{n}: expected a torch.Tensor, got {type(new).__name__}")
            if new.dtype != old.dtype:
                raise TypeError(f"{n}: expected dtype {old.dtype}, got {new.dtype}")
            if new.shape != old.shape:
                raise ValueError(f"{n}: expected shape {tuple(old.shape)}, got {tuple(new.shape)}")
            if new.device != old.device:
                raise ValueError(f"{n}: on {new.device}, but the weights are on {old.device}")
            if n.endswith("_alpha"):
                check_global_scales(n, new)
            elif n.endswith("_sf_swizzled"):
                check_no_nan_e4m3(n, new, self.scale_data_mask(n))
        for n, new in tensors.items():
            getattr(self, n).copy_(new)
        return self

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w1.shape[2] * 2

    @property
    def intermediate_size(self) -> int:
        """Stored (padded) intermediate size Ip."""
        return self.w2.shape[2] * 2

    @classmethod
    def from_modelopt(
        cls,
        w13: torch.Tensor,
        w13_scale: torch.Tensor,
        w13_scale_2: GlobalScales,
        w2: torch.Tensor,
        w2_scale: torch.Tensor,
        w2_scale_2: torch.Tensor,
        *,
        pad_intermediate_to: int | None = None,
        inplace: bool = False,
        scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    ) -> FlintMoEWeights:
        """Convert ModelOpt NVFP4 experts (checkpoint layout) to the CuTe-DSL W4A16 layout.

        Args:
            w13: uint8 [E, 2I, H/2], rows [gate; up], two E2M1 codes per byte (low nibble = even element).
            w13_scale: uint8 | float8_e4m3fn [E, 2I, H/16], E4M3 block scales, row-major (not swizzled).
            w13_scale_2: fp32 global scales of gate/up: [E] (shared), [E, 2] (gate, up) or (gate [E], up [E]).
            w2: uint8 [E, H, I/2]; w2_scale [E, H, I/16]; w2_scale_2 fp32 [E].
            pad_intermediate_to: pad I per half to a multiple of this (a multiple of 64). Required when
                I % 64 != 0 (the 64-row interleave needs whole groups per half).
            inplace: write ``w1`` into ``w13``'s storage (``w13`` is modified and becomes ``w1``; ``w2`` is
                returned as is, aliased). Peak extra memory: the scales plus ``scratch_bytes``. Not with padding.
            scratch_bytes: bound on the temporary buffers (experts are processed in groups).

        Returns:
            FlintMoEWeights; out of place, no returned tensor aliases an input.

        Raises:
            TypeError: wrong dtype (names the tensor). ValueError: shapes inconsistent, H % 16 or I % 16 != 0,
            I % 64 != 0 without padding, E4M3 NaN scale bytes, gate/up global scales that differ, non-finite or
            negative global scales, devices differ, inplace with padding or a non-contiguous w13.
        """
        check_codes("w13", w13, (None, None, None))
        E, two_i, h2 = w13.shape
        if E <= 0 or two_i <= 0 or h2 <= 0:
            raise ValueError(f"w13: empty shape {tuple(w13.shape)}")
        if two_i % 2:
            raise ValueError(f"w13: dimension 1 (2I) must be even, got {two_i}")
        inter, hidden = two_i // 2, 2 * h2
        if hidden % 16:
            raise ValueError(
                f"w13: hidden size H = 2 * {h2} = {hidden} must be a multiple of 16 (NVFP4 block)"
            )
        if inter % 16:
            raise ValueError(f"w13: intermediate size I = {inter} must be a multiple of 16 (NVFP4 block)")
        check_nvfp4_rest(w13, w13_scale, w2, w2_scale, hidden)
        alpha1 = merge_gate_up_global_scales(w13_scale_2, E).to(w13.device)
        alpha2 = _check_global("w2_scale_2", w2_scale_2, E).clone().to(w13.device)
        if pad_intermediate_to is None:
            if inter % INTERLEAVE_ROWS:
                raise ValueError(
                    f"w13: intermediate size I = {inter} must be a multiple of {INTERLEAVE_ROWS} for the 64-row "
                    f"gate/up interleave; pass pad_intermediate_to={INTERLEAVE_ROWS} to pad each half"
                )
            ip = inter
        else:
            if pad_intermediate_to <= 0 or pad_intermediate_to % INTERLEAVE_ROWS:
                raise ValueError(
                    f"pad_intermediate_to: {pad_intermediate_to} must be a positive multiple of 64"
                )
            ip = padded_intermediate(inter, pad_intermediate_to)
        rows = w13_rows_cutedsl(inter, ip, INTERLEAVE_ROWS, device=w13.device)
        if inplace:
            if ip != inter:
                raise ValueError(
                    "inplace: not supported together with intermediate padding (the shape changes)"
                )
            if not w13.is_contiguous():
                raise ValueError("w13: must be contiguous for inplace=True")
            gather_rows_inplace(w13, rows, scratch_bytes)
            w1, w2_out = w13, w2
        else:
            w1 = gather_rows(w13, rows)
            w2_out = pad_columns(w2, ip // 2)
        w1_sf = swizzle_block_scales(w13_scale, rows=rows, name="w13_scale", scratch_bytes=scratch_bytes)
        w2_sf = swizzle_block_scales(w2_scale, cols=ip // 16, name="w2_scale", scratch_bytes=scratch_bytes)
        return cls(
            w1,
            w1_sf.view(torch.float8_e4m3fn),
            alpha1,
            w2_out,
            w2_sf.view(torch.float8_e4m3fn),
            alpha2,
            inter,
        )
