"""Read one MoE layer of a GGUF file (``gguf`` package, gguf-py 0.19) into the ModelOpt layout.

Two conventions, detected from the tensor names of the layer:

(a) ``gguf-modelopt``: the ModelOpt tensors stored as plain typed GGUF tensors under their HF names
    ``model.layers.{L}.mlp.experts.{e}.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2,input_scale}``:
    ``weight`` and ``weight_scale`` as I8 (the uint8 code bytes / E4M3 scale bytes reinterpreted; GGUF has no
    U8 or F8 type), ``weight_scale_2`` / ``input_scale`` as F32 [1]; router ``model.layers.{L}.mlp.gate.weight``
    BF16 or F32. Bytes are taken as they are (same validation as the safetensors path).

(b) ``gguf-nvfp4``: llama.cpp's converter output (``convert_hf_to_gguf.py`` ``_nvfp4_pack`` /
    ``_flush_nvfp4_experts``): ``blk.{L}.ffn_{gate,up,down}_exps.weight`` of type NVFP4 (40), experts merged
    into one [E, N, K] tensor; ``<name>.scale`` F32 [E] holds the per-expert ``weight_scale_2`` (the converter
    omits it when every scale is within 1e-6 of 1.0: then 1.0 is read), ``<name>.input_scale`` is ignored;
    router ``blk.{L}.ffn_gate_inp.weight`` F32 (or BF16). ``<arch>.expert_used_count`` gives top_k.

NVFP4 type 40 (ggml ``block_nvfp4``, gguf-py ``quants.NVFP4``): each row is K/64 blocks of 36 bytes, 4 UE4M3
scale bytes ``d[0..3]`` (one per 16 values) then 32 code bytes; sub-block s uses code bytes 8s..8s+7, the low
nibble of byte 8s+j is value 16s+j and the high nibble value 16s+j+8 (ModelOpt: low nibble of byte 8s+j is
value 16s+2j, high nibble 16s+2j+1). Values are ``kvalues[nibble] * ue4m3(d) * 0.5`` with ``kvalues`` the
doubled E2M1 table (the same nibble codes as ModelOpt's E2M1) and ``ue4m3(x)`` = E4M3 of ``x`` with bit 7
ignored, 0 for 0x00 and 0x7F (ggml ``ggml_ue4m3_to_fp32``, gguf-py ``NVFP4.ue4m3_to_fp32``). So
``2 * e2m1 * 0.5 * scale`` = ModelOpt's ``e2m1 * scale``: the conversion keeps every nibble, reorders them
and maps each scale byte x to the E4M3 byte of the same value: ``x & 0x7F``, except 0x7F -> 0x00 (gguf reads it
as 0) and 0xFF, which gguf reads as 480 > 448 (no E4M3 byte): rejected (ValueError). llama.cpp's converter
writes ``scale & 0x7F``, so a ModelOpt NaN byte (0x7F / 0xFF) silently becomes a zero scale there; a file
holding 0x7F therefore loads with that block zeroed, exactly as gguf decodes it.

The file is parsed by gguf-py's ``GGUFReader`` with every read bounds-checked against the file size and every
tensor's data range checked (inside the file, no two tensors sharing a byte) before any tensor is used; E is
``<arch>.expert_count`` when the file records it, otherwise the contiguous index range present (convention a)
or the merged tensors' first dimension (convention b). Every error is a ``CheckpointError`` (a ValueError)
naming the file and, where there is one, the tensor or key: a truncated or garbled file (the message says
where it ends or what gguf-py could not parse), overlapping data, and the rejections listed under
``read_gguf_layer``.
"""

from __future__ import annotations

import re
from functools import cache
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch

from flint_moe.checkpoints.errors import CheckpointError, reraise_in
from flint_moe.checkpoints.experts import INDEX, ExpertStack, ModelOptExperts, check_stack_fits, expert_count
from flint_moe.checkpoints.layer import CheckpointLayer, router_to_bf16
from flint_moe.reference._checks import check_tensor

__all__ = [
    "NVFP4_BLOCK_BYTES",
    "NVFP4_BLOCK_VALUES",
    "NVFP4_TYPE",
    "gguf_moe_layers",
    "nvfp4_gguf_to_modelopt",
    "read_gguf_layer",
]

NVFP4_TYPE = 40  #: GGMLQuantizationType.NVFP4
NVFP4_BLOCK_VALUES = 64
NVFP4_BLOCK_BYTES = 36
HF_PREFIX = "model.layers.{layer}.mlp"
_PROJ = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def nvfp4_gguf_to_modelopt(raw: torch.Tensor, name: str = "raw") -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 type-40 blocks -> ModelOpt (codes, E4M3 block scales), exactly (module docstring).

    Args:
        raw: uint8 [..., N, K/64 * 36] (a GGUF NVFP4 tensor's bytes as gguf's reader returns them).
    Returns:
        (codes uint8 [..., N, K/2] (low nibble = even element), scales float8_e4m3fn [..., N, K/16]) on
        ``raw``'s device; decoded values equal gguf's ``dequantize(raw, NVFP4)`` element for element (code 8
        decodes to -0.0 in ModelOpt, +0 in gguf).
    Raises:
        TypeError (dtype) / ValueError (row bytes not a multiple of 36; a 0xFF scale byte, naming its index).
    """
    check_tensor(name, raw, dtype=torch.uint8)
    if raw.dim() < 1 or raw.shape[-1] == 0 or raw.shape[-1] % NVFP4_BLOCK_BYTES:
        raise ValueError(f"{name}: row length {tuple(raw.shape)[-1:]} bytes must be a positive multiple of 36")
    lead = raw.shape[:-1]
    nb = raw.shape[-1] // NVFP4_BLOCK_BYTES
    blocks = raw.reshape(*lead, nb, NVFP4_BLOCK_BYTES)
    d = blocks[..., :4]
    bad = d == 0xFF
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name}: UE4M3 scale byte 0xFF at block index {idx}: gguf decodes it as 480, which no E4M3 byte "
            "holds (max 448)"
        )
    scales = torch.where(d == 0x7F, torch.zeros_like(d), d & 0x7F).reshape(*lead, nb * 4)
    qs = blocks[..., 4:].reshape(*lead, nb, 4, 8)
    vals = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [..., nb, 4, 16] in value order
    pairs = vals.reshape(*lead, nb, 4, 8, 2)
    codes = (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(*lead, nb * 32)
    return codes.contiguous(), scales.contiguous().view(torch.float8_e4m3fn)


@cache
def _bounded_reader():
    """``GGUFReader`` with every read of the file bounds-checked and each tensor's data range checked before
    gguf-py builds its view (gguf-py slices its memory map without checks: a short file gives empty arrays,
    then IndexError or numpy reshape errors, and a garbled array length can loop for as long as it says)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    class BoundedReader(GGUFReader):
        def __init__(self, path: str) -> None:
            self.path = path
            super().__init__(path, "r")

        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + int(count) * np.dtype(dtype).itemsize
            if end > self.data.size:
                raise CheckpointError(self.path, None, f"truncated or garbled: reading bytes [{int(offset)}, {end}) "
                                      f"but the file ends at byte {self.data.size}")  # fmt: skip
            return super()._get(offset, dtype, count, override_order)

        def _build_tensors(self, start_offs, fields) -> None:
            for f in fields:  # parts: name length, name, n_dims, dims, type, offset (gguf-py's tensor info)
                name = bytes(f.parts[1]).decode("utf-8", "replace")
                dims, raw = [int(x) for x in f.parts[3]], int(f.parts[4][0])
                try:
                    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(raw)]
                except (ValueError, KeyError):
                    raise CheckpointError(self.path, name, f"unknown GGML tensor type {raw}") from None
                if dims and dims[0] % block:
                    raise CheckpointError(self.path, name, f"row of {dims[0]} values is not a multiple of the "
                                          f"type's {block}-value block")  # fmt: skip
                start = int(start_offs) + int(f.parts[5][0])
                end = start + int(np.prod(dims, dtype=object)) * size // block
                if end > self.data.size:
                    raise CheckpointError(self.path, name, f"data bytes [{start}, {end}) run past the end of the file "
                                          f"({self.data.size} bytes): truncated or garbled")  # fmt: skip
            super()._build_tensors(start_offs, fields)

    return BoundedReader


def _reader(path: str | Path):
    """The file parsed (module docstring); OSError if it cannot be opened, CheckpointError for anything else."""
    try:
        reader = _bounded_reader()(str(path))
    except (OSError, CheckpointError):
        raise
    except Exception as exc:  # gguf-py has no error contract: whatever it raises here is a malformed file
        raise CheckpointError(path, None, f"not a readable GGUF file: {type(exc).__name__}: {exc}") from exc
    spans = sorted((t.data_offset, t.data_offset + t.n_bytes, t.name) for t in reader.tensors if t.n_bytes)
    for (s0, e0, n0), (s1, e1, n1) in pairwise(spans):
        if s1 < e0:
            raise CheckpointError(path, n1, f"data bytes [{s1}, {e1}) overlap those of {n0} [{s0}, {e0})")
    return reader


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception as exc:  # gguf-py decodes on access (UTF-8, array parts)
        raise CheckpointError(reader.path, key, f"unreadable metadata value: {exc}") from exc


def _int_field(reader, key: str) -> int | None:
    """``<arch>.<key>`` as a positive int, None if the file lacks it or the architecture."""
    arch = _field(reader, "general.architecture")
    if arch is None:
        return None
    k = _field(reader, f"{arch}.{key}")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise CheckpointError(reader.path, f"{arch}.{key}", f"expected a positive integer, got {k!r}")
    return k


def _torch(t, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A GGUF tensor's data as a (copied, writable) torch tensor; BF16 (type 30) from its raw bytes."""
    from gguf import GGMLQuantizationType as Q

    a = np.array(t.data, copy=True)
    if t.tensor_type == Q.BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def gguf_moe_layers(path: str | Path) -> list[int]:
    """Layer indices with routed experts in either convention."""
    return _moe_layers(_reader(path))


def _moe_layers(reader) -> list[int]:
    pat = re.compile(rf"^(?:blk\.({INDEX})\.ffn_gate_exps\.weight|model\.layers\.({INDEX})\.mlp\.experts\.)")
    return sorted({int(m[1] or m[2]) for t in reader.tensors if (m := pat.match(t.name))})


def read_gguf_layer(path: str | Path, layer: int, *, device: torch.device | str | None = "cpu") -> CheckpointLayer:
    """Read layer ``layer``'s routed experts (converted to the ModelOpt layout) and router from a GGUF file.

    Returns ``CheckpointLayer`` with source ``"gguf-modelopt"`` or ``"gguf-nvfp4"`` (module docstring), top_k
    from ``<arch>.expert_used_count`` when present.

    Raises:
        OSError: the file cannot be opened. CheckpointError (a ValueError naming the file and the tensor or
        key): a truncated or garbled file, overlapping tensor data, the layer has no experts in either
        convention (the message lists the layers present), fused ``ffn_gate_up_exps`` tensors (not
        supported), non-canonical, out-of-range or missing expert indices, an E that differs from
        ``<arch>.expert_count``, wrong tensor types or shapes, N/K inconsistent, 0xFF scale bytes (convention
        b), NaN scale bytes (convention a), non-finite or negative global scales, a router that is not
        bf16-valued or not finite. Gate/up global scales that differ are rejected when the stack is repacked.
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: must be an int >= 0, got {layer!r}")
    reader = _reader(path)
    tensors = {t.name: t for t in reader.tensors}
    top_k = _int_field(reader, "expert_used_count")
    count = _int_field(reader, "expert_count")
    blk = f"blk.{layer}."
    if blk + "ffn_gate_up_exps.weight" in tensors:
        raise CheckpointError(path, f"{blk}ffn_gate_up_exps.weight", "fused gate/up expert tensors are not supported")
    if blk + "ffn_gate_exps.weight" in tensors:
        experts, names = _read_merged(path, tensors, blk, count, device)
        rname = blk + "ffn_gate_inp.weight"
        source = "gguf-nvfp4"
    else:
        base = HF_PREFIX.format(layer=layer)
        ex = base + ".experts."
        keys = sorted((k for k in tensors if k.startswith(ex)), key=_natural)
        if not keys:
            raise CheckpointError(path, None, f"layer {layer}: neither {blk}ffn_gate_exps.weight nor {ex}<e>.* "
                                  f"(MoE layers present: {_moe_layers(reader)})")  # fmt: skip
        experts = _read_per_expert(path, tensors, ex, keys, count, device)
        names = keys
        rname = base + ".gate.weight"
        source = "gguf-modelopt"
    if rname not in tensors:
        raise CheckpointError(path, rname, "router weight missing")
    with reraise_in(path, rname):
        router = router_to_bf16(rname, _torch(tensors[rname]), experts.num_experts, experts.hidden_size)
    return CheckpointLayer(layer, experts, router.to(device), top_k, source, str(path), [*names, rname])


def _count_source(count: int | None) -> str:
    return "" if count is None else f"the file's expert_count = {count}"


def _read_per_expert(path, tensors: dict, ex: str, keys: list[str], count: int | None, device) -> ModelOptExperts:
    rel = [k[len(ex) :] for k in keys]
    with reraise_in(path):
        E = expert_count(rel, ex, count, _count_source(count))
    g0, d0 = ex + "0.gate_proj.weight", ex + "0.down_proj.weight"
    gs, ds = tensors[g0].data.shape, tensors[d0].data.shape
    if len(gs) != 2 or len(ds) != 2:
        raise CheckpointError(path, g0, f"expected 2-D expert weights, got {tuple(gs)} and {d0} {tuple(ds)}")
    with reraise_in(path, f"{ex}<e>.*"):
        check_stack_fits(E, 2 * int(gs[1]), int(gs[0]), _data_bytes(tensors), "the file")
    with reraise_in(path, g0):
        stack = ExpertStack(E, 2 * int(gs[1]), int(gs[0]), device=device, prefix=ex)
    for k, r in zip(keys, rel, strict=True):
        with reraise_in(path, k):
            stack.add(r, _torch(tensors[k]))
    with reraise_in(path):
        return stack.finish()


def _data_bytes(tensors: dict) -> int:
    """Bytes of tensor data in the file (the sum over its tensors, which do not overlap)."""
    return sum(int(t.n_bytes) for t in tensors.values())


def _read_merged(path, tensors: dict, blk: str, count: int | None, device) -> tuple[ModelOptExperts, list[str]]:
    from gguf import GGMLQuantizationType as Q

    raws, names, scales = {}, [], {}
    for proj, g in _PROJ.items():
        n = f"{blk}{g}.weight"
        if n not in tensors:
            raise CheckpointError(path, n, "missing (llama.cpp NVFP4 merged experts need gate, up and down)")
        t = tensors[n]
        if t.tensor_type != Q.NVFP4:
            raise CheckpointError(path, n, f"tensor type {t.tensor_type.name}, expected NVFP4 (40)")
        if t.data.ndim != 3:
            raise CheckpointError(path, n, f"expected merged experts [E, N, K] (3 dimensions), got {t.data.ndim}")
        raws[proj] = t.data  # uint8 [E, N, K/64 * 36], memory-mapped: converted one expert at a time below
        names.append(n)
        E = t.data.shape[0]
        if count is not None and E != count:
            raise CheckpointError(path, n, f"{E} experts, but the file's expert_count is {count}")
        sn = f"{blk}{g}.scale"
        if sn in tensors:
            s = _torch(tensors[sn])
            with reraise_in(path, sn):
                check_tensor(sn, s, dtype=torch.float32)
            if s.numel() != E:
                raise CheckpointError(path, sn, f"expected {E} per-expert global scales, got shape {tuple(s.shape)}")
            scales[proj] = s.reshape(E)
            names.append(sn)
        else:  # llama.cpp omits scales that are all (within 1e-6 of) 1.0
            scales[proj] = torch.ones(E, dtype=torch.float32)
    E, inter, gbytes = raws["gate_proj"].shape
    hidden = gbytes // NVFP4_BLOCK_BYTES * NVFP4_BLOCK_VALUES
    want = {"up_proj": (E, inter, gbytes), "down_proj": (E, hidden, inter // NVFP4_BLOCK_VALUES * NVFP4_BLOCK_BYTES)}
    for proj, shape in want.items():
        if tuple(raws[proj].shape) != shape or inter % NVFP4_BLOCK_VALUES:
            raise CheckpointError(path, f"{blk}{_PROJ[proj]}.weight", f"byte shape {tuple(raws[proj].shape)}, "
                                  f"expected {shape} for E = {E}, H = {hidden}, I = {inter} (gate's)")  # fmt: skip
    with reraise_in(path, f"{blk}ffn_gate_exps.weight"):
        stack = ExpertStack(E, hidden, inter, device=device)
    for proj, raw in raws.items():
        n = f"{blk}{_PROJ[proj]}.weight"
        for e in range(E):
            with reraise_in(path, f"{n}[{e}]"):
                c, s = nvfp4_gguf_to_modelopt(torch.from_numpy(np.array(raw[e], copy=True)), f"{n}[{e}]")
                stack.add(f"{e}.{proj}.weight", c)
                stack.add(f"{e}.{proj}.weight_scale", s)
            with reraise_in(path, f"{blk}{_PROJ[proj]}.scale[{e}]", f"{e}.{proj}.weight_scale_2"):
                stack.add(f"{e}.{proj}.weight_scale_2", scales[proj][e])
    with reraise_in(path):
        return stack.finish(), names


def _natural(name: str) -> tuple:
    return tuple((0, int(p), p) if p.isdigit() else (1, 0, p) for p in re.split(r"([0-9]+)", name))
