"""Real input round trip: a bf16 expert stack quantized by nvidia-modelopt 0.47.0,
written as a sharded ModelOpt safetensors directory and as GGUF in both conventions with the libraries' writers
(tests/checkpoints/_writers.py), read back by ``flint_moe.checkpoints`` -> bitwise identical ModelOpt tensors,
router and FlintMoEWeights, equal to the golden model's own quantizer + ``FlintMoEWeights.from_modelopt``.
Plus the rejections: differing gate/up global scales, NaN scale bytes, a missing layer, bad configs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from flint_moe.checkpoints import CheckpointError, read_gguf_layer, read_layer, read_modelopt_layer
from flint_moe.checkpoints.gguf import gguf_moe_layers
from flint_moe.checkpoints.modelopt import modelopt_moe_layers
from flint_moe.layouts import FlintMoEWeights
from flint_moe.reference.quantize import quantize_experts
from tests.checkpoints._writers import (
    modelopt_experts,
    write_gguf_modelopt,
    write_gguf_nvfp4,
    write_modelopt_dir,
)

pytestmark = pytest.mark.oracle
E, H, I, K = 4, 128, 64, 2  # noqa: E741  (H, I multiples of 64: the GGUF NVFP4 block)
LAYERS = (1, 3)
FORMATS = ("modelopt", "gguf-modelopt", "gguf-nvfp4")


def _bf16_layer(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gate = torch.randn(E, I, H, generator=g) * 0.05 + 0.01
    up = torch.randn(E, I, H, generator=g) * torch.linspace(0.1, 0.4, E).reshape(E, 1, 1)  # up holds the amax
    w2 = torch.randn(E, H, I, generator=g) * torch.exp2(torch.arange(E) - 4.0).reshape(E, 1, 1)
    router = torch.randn(E, H, generator=g) * 0.1
    return torch.cat([gate, up], 1).bfloat16(), w2.bfloat16(), router.bfloat16()


def _write_all(d: Path, layers: dict) -> dict[str, Path]:
    return {
        "modelopt": write_modelopt_dir(d / "modelopt", layers, top_k=K, shards=2),
        "gguf-modelopt": write_gguf_modelopt(d / "a.gguf", layers, top_k=K),
        "gguf-nvfp4": write_gguf_nvfp4(d / "b.gguf", layers, top_k=K),
    }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    pytest.importorskip("modelopt")  # the oracle extra (CI installs it), as in tests/reference/test_quantize.py
    g = torch.Generator().manual_seed(3)
    bf16 = {L: _bf16_layer(g) for L in LAYERS}
    layers = {L: (modelopt_experts(w13, w2), router) for L, (w13, w2, router) in bf16.items()}
    paths = _write_all(tmp_path_factory.mktemp("ckpt"), layers)
    return bf16, layers, paths


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)


def _same_flint(a: FlintMoEWeights, b: FlintMoEWeights) -> None:
    for f in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.shape == y.shape and x.dtype == y.dtype, f
        assert torch.equal(_bits(x), _bits(y)), f
    assert a.valid_intermediate == b.valid_intermediate


def test_every_format_loads_bitwise_identical(ckpt) -> None:
    bf16, layers, paths = ckpt
    for L in LAYERS:
        w13, w2, router = bf16[L]
        # independent: the golden model's ModelOpt recipe (bit-exact to ModelOpt, tests/reference/test_quantize.py)
        ref = quantize_experts(w13, w2)
        want = FlintMoEWeights.from_modelopt(ref.w13, ref.w13_scale, ref.w13_gs, ref.w2, ref.w2_scale, ref.w2_gs)
        for fmt in FORMATS:
            layer = read_layer(paths[fmt], L)
            assert layer.source == fmt and layer.layer == L and layer.top_k == K
            assert (layer.num_experts, layer.hidden_size, layer.intermediate_size) == (E, H, I)
            assert torch.equal(layer.router_weight.view(torch.int16), router.view(torch.int16)), fmt
            ex = layer.experts
            assert torch.equal(ex.w13, ref.w13), fmt
            assert torch.equal(ex.w13_scale.view(torch.uint8), ref.w13_scale.view(torch.uint8)), fmt
            assert torch.equal(ex.w2, ref.w2), fmt
            assert torch.equal(ex.w2_scale.view(torch.uint8), ref.w2_scale.view(torch.uint8)), fmt
            assert torch.equal(_bits(ex.w13_scale_2[:, 0]), _bits(ref.w13_gs)), fmt
            assert torch.equal(_bits(ex.w13_scale_2[:, 1]), _bits(ref.w13_gs)), fmt
            assert torch.equal(_bits(ex.w2_scale_2), _bits(ref.w2_gs)), fmt
            module = layer.build_module()  # through FlintNvfp4Experts.load_weights
            assert module.loaded and module.top_k == K
            _same_flint(module.weights, want)


def test_layers_listed_and_missing_layer(ckpt) -> None:
    _, _, paths = ckpt
    assert modelopt_moe_layers(paths["modelopt"]) == list(LAYERS)
    assert gguf_moe_layers(paths["gguf-modelopt"]) == list(LAYERS)
    assert gguf_moe_layers(paths["gguf-nvfp4"]) == list(LAYERS)
    d = paths["modelopt"]
    with pytest.raises(
        CheckpointError, match=rf"^{re.escape(str(d))}: layer 2: no tensors named .* \(MoE layers present: \[1, 3\]\)"
    ):
        read_modelopt_layer(d, 2)
    for fmt in ("gguf-modelopt", "gguf-nvfp4"):
        with pytest.raises(
            CheckpointError,
            match=rf"^{re.escape(str(paths[fmt]))}: layer 0: neither blk.0.ffn_gate_exps.weight .*present: \[1, 3\]",
        ):
            read_gguf_layer(paths[fmt], 0)
    with pytest.raises(FileNotFoundError, match=r"no such checkpoint"):
        read_layer(paths["modelopt"] / "nope", 1)


def test_differing_gate_up_global_scales_rejected(tmp_path: Path) -> None:
    pytest.importorskip("modelopt")
    g = torch.Generator().manual_seed(4)
    w13, w2, router = _bf16_layer(g)
    experts = modelopt_experts(w13, w2, shared_gate_up=False)  # gate and up quantized apart: own amax each
    assert all(experts[f"{e}.gate_proj.weight_scale_2"] != experts[f"{e}.up_proj.weight_scale_2"] for e in range(E))
    paths = _write_all(tmp_path, {0: (experts, router)})
    for fmt in FORMATS:
        layer = read_layer(paths[fmt], 0)  # reading keeps both scales ...
        with pytest.raises(ValueError, match=r"gate and up global scales differ for experts \[0, 1, 2, 3\]"):
            layer.build_module()  # ... the repack rejects them
        with pytest.raises(ValueError, match=r"gate and up global scales differ"):
            layer.experts.to_logical()


def test_nan_scale_bytes_rejected(tmp_path: Path, ckpt) -> None:
    _, layers, _ = ckpt
    experts, router = layers[1]
    for byte in (0x7F, 0xFF):
        bad = dict(experts)
        s = experts["2.up_proj.weight_scale"].clone()
        s.view(torch.uint8)[5, 3] = byte
        bad["2.up_proj.weight_scale"] = s
        d = write_modelopt_dir(tmp_path / f"nan{byte:x}", {1: (bad, router)}, top_k=K, shards=1)
        with pytest.raises(
            CheckpointError,
            match=rf"^model.layers.1.mlp.experts.2.up_proj.weight_scale in {re.escape(str(d))}/model.safetensors: "
            rf"E4M3 NaN scale byte 0x{byte:02X} at index \(5, 3\)",
        ):
            read_modelopt_layer(d, 1)
        a = write_gguf_modelopt(tmp_path / f"nan{byte:x}.gguf", {1: (bad, router)}, top_k=K)
        with pytest.raises(
            CheckpointError, match=rf"up_proj.weight_scale in {re.escape(str(a))}: E4M3 NaN scale byte 0x{byte:02X}"
        ):
            read_gguf_layer(a, 1)
        # llama.cpp's converter clears bit 7: both NaN bytes become 0x7F, which gguf decodes as 0 -> E4M3 0x00
        b = read_gguf_layer(write_gguf_nvfp4(tmp_path / f"nan{byte:x}b.gguf", {1: (bad, router)}, top_k=K), 1)
        assert b.experts.w13_scale.view(torch.uint8)[2, I + 5, 3].item() == 0x00


def test_bad_directory(tmp_path: Path, ckpt) -> None:
    _, layers, _ = ckpt
    d = write_modelopt_dir(tmp_path / "m", {1: layers[1]}, top_k=K, shards=1)
    (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(
        CheckpointError, match=r"^quantization.quant_algo in .*hf_quant_config.json: quant_algo is 'FP8'"
    ):
        read_modelopt_layer(d, 1)
    (d / "hf_quant_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"not a ModelOpt checkpoint"):
        read_modelopt_layer(d, 1)
    # a router that is not bf16-valued is refused, not rounded
    experts, router = layers[1]
    r32 = router.float()
    r32[2, 7] += 2.0**-20
    d2 = write_modelopt_dir(tmp_path / "r", {1: (experts, r32)}, top_k=K, shards=1)
    with pytest.raises(
        CheckpointError, match=r"^model.layers.1.mlp.gate.weight in .*: torch.float32 value .* at index \(2, 7\)"
    ):
        read_modelopt_layer(d2, 1)
    # a missing expert tensor
    part = {n: t for n, t in experts.items() if n != "3.down_proj.weight_scale_2"}
    d3 = write_modelopt_dir(tmp_path / "p", {1: (part, router)}, top_k=K, shards=1)
    with pytest.raises(
        CheckpointError,
        match=rf"^model.layers.1.mlp.experts.3.down_proj.weight_scale_2 in {re.escape(str(d3))}: missing \(1 of 36 "
        r"required expert tensors missing, e.g. model.layers.1.mlp.experts.3.down_proj.weight_scale_2\)$",
    ):
        read_modelopt_layer(d3, 1)


def test_unindexed_shards_and_bad_gguf_bytes(tmp_path: Path, ckpt) -> None:
    _, layers, paths = ckpt
    # shards without an index json: every file's header is scanned
    d = write_modelopt_dir(tmp_path / "noindex", {3: layers[3]}, top_k=K, shards=3)
    (d / "model.safetensors.index.json").unlink()
    assert len(list(d.glob("*.safetensors"))) == 3
    assert read_modelopt_layer(d, 3).experts.equal(read_layer(paths["modelopt"], 3).experts)

    # a 0xFF UE4M3 byte (gguf decodes it as 480, beyond E4M3) in expert 2's down projection
    def poke(name: str, merged) -> None:
        if name.endswith("ffn_down_exps.weight"):
            merged[2, 9, 1] = 0xFF

    b = write_gguf_nvfp4(tmp_path / "ff.gguf", {3: layers[3]}, top_k=K, edit=poke)
    with pytest.raises(CheckpointError, match=rf"^blk.3.ffn_down_exps.weight\[2\] in {re.escape(str(b))}: UE4M3 "
                       r"scale byte 0xFF at block index \(9, 0, 1\)"):  # fmt: skip
        read_gguf_layer(b, 3)


def test_gguf_file_decodes_as_gguf_does(ckpt) -> None:
    # the loaded experts, decoded by the golden model with their global scales, equal gguf's own decode of the
    # file's NVFP4 tensors times the file's .scale tensors (one fp32 rounding each: the products are exact in fp64)
    import gguf

    from flint_moe.reference.quantize import dequantize_nvfp4

    _, _, paths = ckpt
    reader = gguf.GGUFReader(str(paths["gguf-nvfp4"]))
    tensors = {t.name: t for t in reader.tensors}
    ex = read_gguf_layer(paths["gguf-nvfp4"], 3).experts
    views = {
        "ffn_gate_exps": (ex.w13[:, :I], ex.w13_scale[:, :I], ex.w13_scale_2[:, 0]),
        "ffn_up_exps": (ex.w13[:, I:], ex.w13_scale[:, I:], ex.w13_scale_2[:, 1]),
        "ffn_down_exps": (ex.w2, ex.w2_scale, ex.w2_scale_2),
    }
    for g, (codes, scales, gs) in views.items():
        t = tensors[f"blk.3.{g}.weight"]
        assert int(t.tensor_type) == 40
        ref = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).double()
        file_gs = torch.from_numpy(tensors[f"blk.3.{g}.scale"].data.copy()).double()
        ref = (ref * file_gs.reshape(E, 1, 1)).float()
        ours = dequantize_nvfp4(codes.contiguous(), scales.contiguous(), gs.contiguous())
        assert ours.shape == ref.shape and torch.equal(ours, ref), g
