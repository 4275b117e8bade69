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
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from flint_moe.checkpoints.experts import ExpertStack, ModelOptExperts
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


def _reader(path: str | Path):
    from gguf import GGUFReader

    return GGUFReader(str(path), "r")


def _field(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _top_k(reader) -> int | None:
    arch = _field(reader, "general.architecture")
    if arch is None:
        return None
    k = _field(reader, f"{arch}.expert_used_count")
    return int(k) if k is not None else None


def _torch(t, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A GGUF tensor's data as a (copied, writable) torch tensor; BF16 (type 30) from its raw bytes."""
    from gguf import GGMLQuantizationType as Q

    a = np.array(t.data, copy=True)
    if t.tensor_type == Q.BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def gguf_moe_layers(path: str | Path) -> list[int]:
    """Layer indices with routed experts in either convention."""
    pat = re.compile(r"^(?:blk\.(\d+)\.ffn_gate_exps\.weight|model\.layers\.(\d+)\.mlp\.experts\.\d+\.)")
    out = set()
    for t in _reader(path).tensors:
        if m := pat.match(t.name):
            out.add(int(m[1] or m[2]))
    return sorted(out)


def read_gguf_layer(path: str | Path, layer: int, *, device: torch.device | str | None = "cpu") -> CheckpointLayer:
    """Read layer ``layer``'s routed experts (converted to the ModelOpt layout) and router from a GGUF file.

    Returns ``CheckpointLayer`` with source ``"gguf-modelopt"`` or ``"gguf-nvfp4"`` (module docstring), top_k
    from ``<arch>.expert_used_count`` when present.

    Raises:
        ValueError: the layer has no experts in either convention (the message lists the layers present),
        fused ``ffn_gate_up_exps`` tensors (not supported), wrong tensor types or shapes, N/K inconsistent,
        gate/up global scales that differ (when the stack is repacked), 0xFF scale bytes (convention b), NaN
        scale bytes (convention a), a router that is not bf16-valued.
    """
    reader = _reader(path)
    tensors = {t.name: t for t in reader.tensors}
    top_k = _top_k(reader)
    blk = f"blk.{layer}."
    if blk + "ffn_gate_up_exps.weight" in tensors:
        raise ValueError(f"{blk}ffn_gate_up_exps.weight: fused gate/up expert tensors are not supported")
    if blk + "ffn_gate_exps.weight" in tensors:
        experts, names = _read_merged(tensors, blk, device)
        rname = blk + "ffn_gate_inp.weight"
        source = "gguf-nvfp4"
    else:
        base = HF_PREFIX.format(layer=layer)
        ex = base + ".experts."
        keys = sorted((k for k in tensors if k.startswith(ex)), key=_natural)
        if not keys:
            raise ValueError(
                f"layer {layer}: neither {blk}ffn_gate_exps.weight nor {ex}<e>.* in {path} "
                f"(MoE layers present: {gguf_moe_layers(path)})"
            )
        experts = _read_per_expert(tensors, ex, keys, device)
        names = keys
        rname = base + ".gate.weight"
        source = "gguf-modelopt"
    if rname not in tensors:
        raise ValueError(f"{rname}: router weight missing from {path}")
    router = router_to_bf16(rname, _torch(tensors[rname]), experts.num_experts, experts.hidden_size).to(device)
    return CheckpointLayer(layer, experts, router, top_k, source, str(path), [*names, rname])


def _read_per_expert(tensors: dict, ex: str, keys: list[str], device) -> ModelOptExperts:
    pat = re.compile(re.escape(ex) + r"(\d+)\.")
    E = max(int(pat.match(k)[1]) for k in keys) + 1
    g0, d0 = ex + "0.gate_proj.weight", ex + "0.down_proj.weight"
    for n in (g0, d0):
        if n not in tensors:
            raise ValueError(f"{n}: missing")
    gs, ds = tensors[g0].data.shape, tensors[d0].data.shape
    if len(gs) != 2 or len(ds) != 2:
        raise ValueError(f"{g0}: expected 2-D expert weights, got {tuple(gs)} and {tuple(ds)}")
    stack = ExpertStack(E, 2 * int(gs[1]), int(gs[0]), device=device, prefix=ex)
    for k in keys:
        stack.add(k[len(ex) :], _torch(tensors[k]))
    return stack.finish()


def _read_merged(tensors: dict, blk: str, device) -> tuple[ModelOptExperts, list[str]]:
    from gguf import GGMLQuantizationType as Q

    raws, names, scales = {}, [], {}
    for proj, g in _PROJ.items():
        n = f"{blk}{g}.weight"
        if n not in tensors:
            raise ValueError(f"{n}: missing (llama.cpp NVFP4 merged experts need gate, up and down)")
        t = tensors[n]
        if t.tensor_type != Q.NVFP4:
            raise ValueError(f"{n}: tensor type {t.tensor_type.name}, expected NVFP4 (40)")
        if t.data.ndim != 3:
            raise ValueError(f"{n}: expected merged experts [E, N, K] (3 dimensions), got {t.data.ndim}")
        raws[proj] = t.data  # uint8 [E, N, K/64 * 36], memory-mapped: converted one expert at a time below
        names.append(n)
        E = t.data.shape[0]
        sn = f"{blk}{g}.scale"
        if sn in tensors:
            s = _torch(tensors[sn])
            check_tensor(sn, s, dtype=torch.float32)
            if s.numel() != E:
                raise ValueError(f"{sn}: expected {E} per-expert global scales, got shape {tuple(s.shape)}")
            scales[proj] = s.reshape(E)
            names.append(sn)
        else:  # llama.cpp omits scales that are all (within 1e-6 of) 1.0
            scales[proj] = torch.ones(E, dtype=torch.float32)
    E, inter, gbytes = raws["gate_proj"].shape
    hidden = gbytes // NVFP4_BLOCK_BYTES * NVFP4_BLOCK_VALUES
    want = {"up_proj": (E, inter, gbytes), "down_proj": (E, hidden, inter // NVFP4_BLOCK_VALUES * NVFP4_BLOCK_BYTES)}
    for proj, shape in want.items():
        if tuple(raws[proj].shape) != shape or inter % NVFP4_BLOCK_VALUES:
            raise ValueError(
                f"{blk}{_PROJ[proj]}.weight: byte shape {tuple(raws[proj].shape)}, expected {shape} for "
                f"E = {E}, H = {hidden}, I = {inter} (gate's)"
            )
    stack = ExpertStack(E, hidden, inter, device=device, prefix=blk)
    for proj, raw in raws.items():
        n = f"{blk}{_PROJ[proj]}.weight"
        for e in range(E):
            c, s = nvfp4_gguf_to_modelopt(torch.from_numpy(np.array(raw[e], copy=True)), f"{n}[{e}]")
            stack.add(f"{e}.{proj}.weight", c)
            stack.add(f"{e}.{proj}.weight_scale", s)
            stack.add(f"{e}.{proj}.weight_scale_2", scales[proj][e])
    return stack.finish(), names


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
