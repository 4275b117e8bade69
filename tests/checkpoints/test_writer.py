"""``flint_moe.checkpoints.write_modelopt_layer`` / ``write_modelopt_tensors``: a written layer reads back bitwise
(through ``read_modelopt_layer`` and through safetensors' own reader), from per-expert tensors, from a read
``ModelOptExperts`` and from nvidia-modelopt's quantizer; bad input is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flint_moe.checkpoints import (
    CheckpointError,
    read_layer,
    read_modelopt_layer,
    write_modelopt_layer,
    write_modelopt_tensors,
)
from tests.checkpoints._writers import FP8, random_experts, stored_tensors

E, H, I, K = 4, 64, 32, 2  # noqa: E741


@pytest.fixture(scope="module")
def layer() -> tuple[dict, torch.Tensor]:
    return random_experts(E, H, I, seed=5)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def test_layer_round_trip(tmp_path: Path, layer) -> None:
    named, router = layer
    d = write_modelopt_layer(tmp_path / "ck", named, router, layer=3, top_k=K, shards=2)
    assert sorted(p.name for p in d.iterdir()) == [
        "config.json", "hf_quant_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]  # fmt: skip
    q = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    assert (q["quant_algo"], q["group_size"]) == ("NVFP4", 16)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg == {"model_type": "qwen3_moe", "num_experts": E, "hidden_size": H, "moe_intermediate_size": I,
                   "num_experts_per_tok": K, "quantization_config": {
                       "config_groups": {"group_0": {
                           "input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
                           "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
                           "targets": ["Linear"]}},
                       "ignore": ["lm_head", "model.layers.*.mlp.gate"], "quant_algo": "NVFP4",
                       "producer": {"name": "flint_moe", "version": "0.1"}, "quant_method": "modelopt"}}  # fmt: skip
    assert cfg["quantization_config"]["ignore"] == q["exclude_modules"]
    stored = stored_tensors(d)
    prefix = "model.layers.3.mlp."
    assert set(stored) == {prefix + "experts." + n for n in named} | {prefix + "gate.weight"}
    for n, t in named.items():
        s = stored[prefix + "experts." + n]
        want = t.reshape(()) if n.endswith("weight_scale_2") else t
        assert _same(s, want), n  # uint8 codes, float8_e4m3fn scales, fp32 0-d global scales, as given
    assert _same(stored[prefix + "gate.weight"], router)
    weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(weight_map) == set(stored)
    back = read_modelopt_layer(d, 3)
    assert (back.num_experts, back.hidden_size, back.intermediate_size, back.top_k) == (E, H, I, K)
    assert _same(back.router_weight, router)
    got = dict(back.experts.named_tensors())
    assert all(_same(got[n].reshape(t.shape), t.view(FP8) if t.dtype == torch.uint8 and "scale" in n else t)
               for n, t in named.items())  # fmt: skip
    assert read_layer(d, 3).experts.equal(back.experts)


def test_read_experts_write_back_identically(tmp_path: Path, layer) -> None:
    named, router = layer
    first = write_modelopt_layer(tmp_path / "a", named, router, top_k=K)
    read = read_modelopt_layer(first, 0)
    second = write_modelopt_layer(tmp_path / "b", read.experts, read.router_weight, top_k=read.top_k)
    for f in ("model.safetensors", "config.json", "hf_quant_config.json"):
        assert (first / f).read_bytes() == (second / f).read_bytes(), f
    assert not (second / "model.safetensors.index.json").exists()  # one shard: no index


def test_modelopt_quantizer_output_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("modelopt", reason="the oracle extra (nvidia-modelopt) is not installed")
    from tests.checkpoints._writers import modelopt_experts

    g = torch.Generator().manual_seed(3)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) * 0.05).bfloat16()
    router = (torch.randn(E, H, generator=g) * 0.2).bfloat16()
    named = modelopt_experts(w13, w2)  # with input_scale tensors, as ModelOpt's export has
    d = write_modelopt_layer(tmp_path / "mo", named, router, top_k=K)
    stored = stored_tensors(d)
    assert all(_same(stored["model.layers.0.mlp.experts." + n], t) for n, t in named.items())
    back = read_modelopt_layer(d, 0)
    got = dict(back.experts.named_tensors())
    assert all(_same(got[n].reshape(t.shape), t) for n, t in named.items() if not n.endswith("input_scale"))


def test_overwrite_replaces_the_shards(tmp_path: Path, layer) -> None:
    named, router = layer
    d = write_modelopt_layer(tmp_path / "ck", named, router, shards=3)
    (d / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^path: directory .* is not empty \(pass overwrite=True to write into it\)$"):
        write_modelopt_layer(d, named, router)
    write_modelopt_layer(d, named, router, top_k=1, overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "hf_quant_config.json", "model.safetensors",
                                                   "tokenizer.json"]  # fmt: skip
    assert read_modelopt_layer(d, 0).top_k == 1


def _refused(tmp_path: Path, exc, match: str, named, router, **kw) -> None:
    d = tmp_path / "refused"
    with pytest.raises(exc, match=match):
        write_modelopt_layer(d, named, router, **kw)
    assert not d.exists()  # nothing written


def test_bad_experts_are_refused_before_writing(tmp_path: Path, layer) -> None:
    named, router = layer
    nan = dict(named)
    s = named["1.down_proj.weight_scale"].clone()
    s.view(torch.uint8)[2, 1] = 0x7F
    nan["1.down_proj.weight_scale"] = s
    _refused(tmp_path, ValueError, r"^1\.down_proj\.weight_scale: E4M3 NaN scale byte 0x7F at index \(2, 1\)", nan,
             router)  # fmt: skip
    missing = {n: t for n, t in named.items() if n != "2.up_proj.weight_scale_2"}
    _refused(tmp_path, CheckpointError, r"^2\.up_proj\.weight_scale_2: missing", missing, router)
    neg = {**named, "0.gate_proj.weight_scale_2": torch.tensor(-1.0)}
    _refused(tmp_path, ValueError, r"^0\.gate_proj\.weight_scale_2: global scale must be finite and >= \+0\.0", neg,
             router)  # fmt: skip
    odd = {**named, "00.gate_proj.weight": named["0.gate_proj.weight"]}
    _refused(tmp_path, CheckpointError, r"^00\.gate_proj\.weight: expert index '00' is not a canonical", odd, router)
    wide = {**named, "3.down_proj.weight": torch.zeros(H, I, dtype=torch.uint8)}
    _refused(tmp_path, ValueError, r"^3\.down_proj\.weight: ", wide, router)
    _refused(tmp_path, TypeError, r"^experts: expected ModelOptExperts or a mapping", [1, 2], router)


def test_bad_router_and_arguments_are_refused(tmp_path: Path, layer) -> None:
    named, router = layer
    r32 = router.float()
    r32[0, 0] = 1.0 + 2.0**-10  # not a bf16 value
    _refused(tmp_path, ValueError, r"^router_weight: torch\.float32 value .* is not a bf16 value", named, r32)
    _refused(tmp_path, ValueError, r"^router_weight: dimension 1 must be 64, got 32", named, router[:, :32])
    _refused(tmp_path, ValueError, r"^top_k: must be an int in \[1, 4\]", named, router, top_k=5)
    _refused(tmp_path, ValueError, r"^top_k: must be an int in \[1, 4\]", named, router, top_k=0)
    _refused(tmp_path, ValueError, r"^layer: must be an int >= 0, got -1$", named, router, layer=-1)
    _refused(tmp_path, ValueError, r"^prefix: must be a str with a '\{layer\}' placeholder", named, router,
             prefix="model.mlp")  # fmt: skip
    _refused(tmp_path, ValueError, r"^shards: must be an int in \[1, ", named, router, shards=0)


def test_write_tensors_checks_its_arguments(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"is not a directory$"):
        write_modelopt_tensors(f, {"a": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"^tensors: no tensors to write$"):
        write_modelopt_tensors(tmp_path / "e", {})
    with pytest.raises(TypeError, match=r"^tensors: entry 'a' must map a str to a torch\.Tensor, got list$"):
        write_modelopt_tensors(tmp_path / "e", {"a": [1]})
    with pytest.raises(ValueError, match=r"^shards: must be an int in \[1, 1\]"):
        write_modelopt_tensors(tmp_path / "e", {"a": torch.zeros(1)}, shards=2)
    t = torch.arange(6, dtype=torch.float32)
    d = write_modelopt_tensors(tmp_path / "v", {"a": t[:3], "b": t[3:], "c": t}, config={"x": 1})  # shared memory
    stored = stored_tensors(d)
    assert [stored[k].tolist() for k in "abc"] == [[0, 1, 2], [3, 4, 5], [0, 1, 2, 3, 4, 5]]
    assert json.loads((d / "config.json").read_text()) == {"x": 1}
