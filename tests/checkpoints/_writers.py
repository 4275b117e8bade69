"""Checkpoint fixtures for the tests: nvidia-modelopt's quantizer, the product's ModelOpt writer
(``flint_moe.checkpoints.write_modelopt_tensors``) and, for GGUF, gguf-py's own ``GGUFWriter``.

- ``modelopt_experts``: bf16 experts -> ModelOpt NVFP4 per-expert tensors with ``NVFP4QTensor.quantize``
  (gate and up of an expert quantized as one fused [2I, H] matrix, so they share one ``weight_scale_2``, as fused
  exports have; or separately, which gives differing scales).
- ``write_modelopt_dir``: layers of per-expert tensors under their full names, written as given (malformed ones
  included) through ``flint_moe.checkpoints.write_modelopt_tensors``.
- ``write_gguf_modelopt``: convention (a), ModelOpt tensors as I8 / F32 / BF16 GGUF tensors under HF names.
- ``write_gguf_nvfp4``: convention (b), llama.cpp's ``convert_hf_to_gguf.py`` NVFP4 repack restated here:
  per 16-value block the code nibbles are re-paired (value j low, j + 8 high), the E4M3 scale bytes keep their
  bits with the sign bit cleared, 4 scales + 32 code bytes per 64-value block, experts stacked per projection,
  ``.scale`` / ``.input_scale`` F32 [E] written unless all within 1e-6 of 1.0.
- ``random_experts``: ModelOpt-layout per-expert tensors of random bytes (no quantizer: fast), for rejections.
- ``patch_gguf``: edit a written GGUF file in place through gguf-py's own reader (mode ``r+``).
- ``rejection`` and ``NOT_CANONICAL``: the message of the ``CheckpointError`` a reader raises, and the wording
  of an expert index that is not canonical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flint_moe.checkpoints import CheckpointError

FP8 = torch.float8_e4m3fn
#: How a reader words an expert index that is not canonical (after ``expert index '<index>' ``).
NOT_CANONICAL = (
    "is not a canonical decimal integer (ASCII digits 0-9 without sign, leading zero, whitespace or underscore)"
)
PROJ_GGUF = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def modelopt_experts(w13: torch.Tensor, w2: torch.Tensor, *, shared_gate_up: bool = True) -> dict[str, torch.Tensor]:
    """``{e}.{proj}.{kind}`` -> tensor, quantized by nvidia-modelopt 0.47.0 (bf16 w13 [E, 2I, H] rows
    [gate; up], w2 [E, H, I])."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    E, two_i, _ = w13.shape
    inter = two_i // 2
    out: dict[str, torch.Tensor] = {}

    def put(e: int, proj: str, q, s, g) -> None:
        out[f"{e}.{proj}.weight"] = q._quantized_data.clone()
        out[f"{e}.{proj}.weight_scale"] = s.clone()
        out[f"{e}.{proj}.weight_scale_2"] = g.float().reshape(()).clone()
        out[f"{e}.{proj}.input_scale"] = torch.tensor(1.0 + e / 8.0)  # W4A4 only: ignored by W4A16

    for e in range(E):
        if shared_gate_up:
            q, s, g = NVFP4QTensor.quantize(w13[e].clone(), 16)
            data, sc = q._quantized_data, s
            for j, proj in enumerate(("gate_proj", "up_proj")):
                rows = slice(j * inter, (j + 1) * inter)
                out[f"{e}.{proj}.weight"] = data[rows].clone()
                out[f"{e}.{proj}.weight_scale"] = sc[rows].clone()
                out[f"{e}.{proj}.weight_scale_2"] = g.float().reshape(()).clone()
                out[f"{e}.{proj}.input_scale"] = torch.tensor(0.5)
        else:
            put(e, "gate_proj", *NVFP4QTensor.quantize(w13[e, :inter].clone(), 16))
            put(e, "up_proj", *NVFP4QTensor.quantize(w13[e, inter:].clone(), 16))
        put(e, "down_proj", *NVFP4QTensor.quantize(w2[e].clone(), 16))
    return out


def write_modelopt_dir(
    d: Path, layers: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]], *, top_k: int, shards: int = 2
) -> Path:
    """``model.layers.{L}.mlp.experts.{name}`` + ``model.layers.{L}.mlp.gate.weight`` of every layer, and a
    ``model.embed_tokens.weight`` the readers must pass over, written as given (malformed tensors included) by
    the product's writer, ``flint_moe.checkpoints.write_modelopt_tensors``, with ``num_experts_per_tok``."""
    from flint_moe.checkpoints import write_modelopt_tensors

    tensors: dict[str, torch.Tensor] = {}
    for L, (experts, router) in layers.items():
        for n, t in experts.items():
            tensors[f"model.layers.{L}.mlp.experts.{n}"] = t
        tensors[f"model.layers.{L}.mlp.gate.weight"] = router
    tensors["model.embed_tokens.weight"] = torch.zeros(4, 16, dtype=torch.bfloat16)
    config = {"model_type": "qwen3_moe", "num_experts_per_tok": top_k}
    return write_modelopt_tensors(d, tensors, config=config, shards=shards)


def random_experts(E: int, H: int, I: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:  # noqa: E741
    """``{e}.{proj}.{kind}`` -> tensor for E experts of H x I (random code bytes, E4M3 scale bytes 0x30..0x3F,
    fp32 0-d global scales, gate = up), and a bf16 router [E, H]."""
    g = torch.Generator().manual_seed(seed)
    named: dict[str, torch.Tensor] = {}
    for e in range(E):
        for proj, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            named[f"{e}.{proj}.weight"] = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
            named[f"{e}.{proj}.weight_scale"] = torch.randint(0x30, 0x40, (n, k // 16), generator=g).to(torch.uint8)
            named[f"{e}.{proj}.weight_scale"] = named[f"{e}.{proj}.weight_scale"].view(FP8)
        gs = torch.rand((), generator=g) * 2.0**-5 + 2.0**-7
        named[f"{e}.gate_proj.weight_scale_2"] = gs
        named[f"{e}.up_proj.weight_scale_2"] = gs.clone()
        named[f"{e}.down_proj.weight_scale_2"] = torch.rand((), generator=g) * 2.0**-5 + 2.0**-7
    return named, (torch.randn(E, H, generator=g) * 0.2).bfloat16()


def patch_gguf(path: Path, edit) -> None:
    """``edit(reader)`` on ``gguf.GGUFReader(path, "r+")`` (its fields' and tensors' ``parts`` are writable views
    of the file), then flushed to disk."""
    import gguf

    r = gguf.GGUFReader(str(path), "r+")
    edit(r)
    r.data.flush()
    del r


def _writer(path: Path, top_k: int):
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_expert_used_count(top_k)
    return w


def _finish(w, edit_writer=None) -> None:
    if edit_writer is not None:
        edit_writer(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _bf16_router(w, name: str, router: torch.Tensor) -> None:
    import gguf

    raw = router.contiguous().view(torch.int16).numpy().view(np.uint8)  # [E, 2H] bytes
    w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)


def write_gguf_modelopt(
    path: Path,
    layers: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]],
    *,
    top_k: int,
    edit_writer=None,
) -> Path:
    """Convention (a): ModelOpt tensors as plain GGUF tensors (codes / scale bytes as I8, scales F32 [1],
    router BF16; a float32 router as F32). ``edit_writer(w)`` may add metadata to the ``GGUFWriter``."""
    w = _writer(path, top_k)
    for L, (experts, router) in layers.items():
        for n, t in experts.items():
            name = f"model.layers.{L}.mlp.experts.{n}"
            if t.dtype in (torch.uint8, FP8):
                w.add_tensor(name, t.contiguous().view(torch.uint8).numpy().view(np.int8))
            else:
                w.add_tensor(name, t.float().reshape(1).numpy())
        if router.dtype == torch.float32:
            w.add_tensor(f"model.layers.{L}.mlp.gate.weight", router.numpy())
        else:
            _bf16_router(w, f"model.layers.{L}.mlp.gate.weight", router)
    _finish(w, edit_writer)
    return path


def nvfp4_pack(weight: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """One ModelOpt matrix (uint8 [N, K/2], E4M3 [N, K/16]) -> NVFP4 type-40 bytes [N, K/64 * 36] (llama.cpp's
    repack: nibbles re-paired per 16-value block, scale bits with bit 7 cleared)."""
    n, nblk = scale.shape
    w = weight.numpy().reshape(n, nblk, 8)
    vals = np.stack([w & 0x0F, w >> 4], axis=-1).reshape(n, nblk, 16)  # value order
    qs = (vals[:, :, :8] | (vals[:, :, 8:] << 4)).astype(np.uint8)
    d = scale.view(torch.uint8).numpy() & 0x7F
    nsup = nblk // 4
    raw = np.concatenate([d.reshape(n, nsup, 4), qs.reshape(n, nsup, 32)], axis=-1)
    return np.ascontiguousarray(raw.reshape(n, nsup * 36))


def write_gguf_nvfp4(
    path: Path,
    layers: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]],
    *,
    top_k: int,
    edit=None,
    edit_writer=None,
) -> Path:
    """Convention (b): llama.cpp NVFP4 merged experts (``blk.{L}.ffn_*_exps.weight`` type 40, ``.scale`` F32
    [E]), router ``blk.{L}.ffn_gate_inp.weight`` F32. ``edit(name, merged)`` may change the bytes in place,
    ``edit_writer(w)`` add metadata."""
    import gguf

    w = _writer(path, top_k)
    for L, (experts, router) in layers.items():
        E = router.shape[0]
        for proj, g in PROJ_GGUF.items():
            merged = np.stack([nvfp4_pack(experts[f"{e}.{proj}.weight"], experts[f"{e}.{proj}.weight_scale"])
                               for e in range(E)])  # fmt: skip
            name = f"blk.{L}.{g}.weight"
            if edit is not None:
                edit(name, merged)
            w.add_tensor(name, merged, raw_dtype=gguf.GGMLQuantizationType.NVFP4)
            for kind, suffix in (("weight_scale_2", "scale"), ("input_scale", "input_scale")):
                vals = [float(experts.get(f"{e}.{proj}.{kind}", torch.tensor(1.0))) for e in range(E)]
                if not np.allclose(vals, 1.0, atol=1e-6):
                    w.add_tensor(f"blk.{L}.{g}.{suffix}", np.array(vals, dtype=np.float32))
        w.add_tensor(f"blk.{L}.ffn_gate_inp.weight", router.float().numpy())
    _finish(w, edit_writer)
    return path


def layer_fixture(E: int, H: int, I: int, seed: int):  # noqa: E741
    """A module-scoped pytest fixture returning ``random_experts(E, H, I, seed=seed)`` (assign it to ``layer``)."""

    @pytest.fixture(scope="module")
    def layer() -> tuple[dict, torch.Tensor]:
        return random_experts(E, H, I, seed=seed)

    return layer


def layer0_rejection(read):
    """``path -> rejection(read, path, 0)``: the message a reader's ``CheckpointError`` gives for layer 0."""
    return lambda path: rejection(read, path, 0)


def rejection(read, *args) -> str:
    """The message of the ``CheckpointError`` that ``read(*args)`` raises (the test fails if it raises none)."""
    with pytest.raises(CheckpointError) as exc:
        read(*args)
    return str(exc.value)


def stored_tensors(d: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files, read by safetensors itself."""
    from safetensors import safe_open

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})  # noqa: SIM118
    return out
