"""``write_modelopt_layer`` against nvidia-modelopt 0.47.0's own Hugging Face export (``export_hf_checkpoint``).

A tiny Qwen3-MoE (2 layers, E = 4, H = 64, I = 32, top-2, random bf16 weights, built from a config: no download)
is quantized with ``mtq.NVFP4_DEFAULT_CFG`` (max calibration on the CPU) and exported by ModelOpt. flint's
reader loads each MoE layer of that directory; the writer then writes the same experts and router, and the two
directories are compared tensor by tensor (names, safetensors header dtypes and shapes, bytes) and on the JSON
keys flint reads. Differences that remain by design (checked here, listed in docs/checkpoints.md):

- ``input_scale``: a ``ModelOptExperts`` read back has none (W4A16 ignores them), so writing the read experts
  gives the export's tensors less the ``input_scale`` ones; writing the export's per-expert tensors keeps them.
- ``config.json``: ModelOpt writes the whole model config (transformers 5 spells the expert count
  ``num_local_experts``, 4.57 ``num_experts``); flint writes ``num_experts`` and the layer's sizes only. Both write the
  ``quantization_config`` object (``quant_method`` ``"modelopt"``), equal but for producer and exclusions.
- ``hf_quant_config.json``: producer ``flint_moe``; ``exclude_modules`` names the routers by the pattern
  ``model.layers.*.mlp.gate`` where ModelOpt lists each router (and ``model.embed_tokens``, absent here).
"""

from __future__ import annotations

import fnmatch
import json
import struct
from pathlib import Path

import pytest
import torch

from flint_moe.checkpoints import read_layer, read_modelopt_layer, write_modelopt_layer
from flint_moe.checkpoints.modelopt import EXPERT_COUNT_KEYS
from tests.checkpoints._writers import stored_tensors

pytestmark = pytest.mark.oracle

LAYERS, E, H, I, K = 2, 4, 64, 32, 2  # noqa: E741
PROJ_SHAPES = {  # [N, K/2] codes, [N, K/16] block scales: gate/up are [I, H], down is [H, I]
    "gate_proj": ((I, H // 2), (I, H // 16)),
    "up_proj": ((I, H // 2), (I, H // 16)),
    "down_proj": ((H, I // 2), (H, I // 16)),
}
KIND_DTYPE = {"weight": "U8", "weight_scale": "F8_E4M3", "weight_scale_2": "F32", "input_scale": "F32"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """ModelOpt's NVFP4 export of the tiny Qwen3-MoE (module docstring)."""
    transformers = pytest.importorskip("transformers", reason="the oracle extra (transformers) is not installed")
    pytest.importorskip("modelopt", reason="the oracle extra (nvidia-modelopt) is not installed")
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=H, intermediate_size=2 * H, moe_intermediate_size=I, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_experts=E, num_experts_per_tok=K,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=64,
        architectures=["Qwen3MoeForCausalLM"],  # ModelOpt's export reads it (None: TypeError in is_multimodal_model)
    )  # fmt: skip
    with torch.random.fork_rng():  # the random init draws from the global generator: leave it as it was
        torch.manual_seed(11)
        model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(12))

    def calibrate(m) -> None:
        with torch.no_grad():
            m(ids)

    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, calibrate)
    out = tmp_path_factory.mktemp("modelopt_export")
    export_hf_checkpoint(model, export_dir=str(out))
    return out


def _header(d: Path) -> dict[str, dict]:
    """name -> {dtype, shape} from the safetensors headers themselves (8-byte little-endian length + JSON)."""
    out: dict[str, dict] = {}
    for f in sorted(d.glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        head = json.loads(raw[8 : 8 + n])
        head.pop("__metadata__", None)
        out.update({k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in head.items()})
    return out


def _metadata(d: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as h:
        return h.metadata()


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _moe(tensors: dict, layer: int) -> dict:
    """The tensors of layer ``layer``'s MoE block (experts and router), under their full names."""
    p = f"model.layers.{layer}.mlp."
    return {k: v for k, v in tensors.items() if k.startswith(p + "experts.") or k == p + "gate.weight"}


def _assert_same_tensors(ours: Path, theirs: Path, names: set[str]) -> None:
    """``names`` are stored in both directories with equal header dtype, shape and bytes."""
    h_ours, h_theirs = _header(ours), _header(theirs)
    t_ours, t_theirs = stored_tensors(ours), stored_tensors(theirs)
    for n in sorted(names):
        assert h_ours[n] == h_theirs[n], n
        assert t_ours[n].dtype == t_theirs[n].dtype and t_ours[n].shape == t_theirs[n].shape, n
        assert _bytes(t_ours[n]) == _bytes(t_theirs[n]), n


def test_export_has_the_layout_the_reader_expects(exported: Path) -> None:
    head = _header(exported)
    for layer in range(LAYERS):
        moe = _moe(head, layer)
        p = f"model.layers.{layer}.mlp."
        want = {p + "gate.weight": {"dtype": "BF16", "shape": [E, H]}}
        for e in range(E):
            for proj, (w_shape, s_shape) in PROJ_SHAPES.items():
                for kind, dtype in KIND_DTYPE.items():
                    shape = {"weight": list(w_shape), "weight_scale": list(s_shape)}.get(kind, [])
                    want[f"{p}experts.{e}.{proj}.{kind}"] = {"dtype": dtype, "shape": shape}
        assert moe == want
    q = json.loads((exported / "hf_quant_config.json").read_text())
    assert q["producer"]["name"] == "modelopt"
    assert (q["quantization"]["quant_algo"], q["quantization"]["group_size"]) == ("NVFP4", 16)


@pytest.mark.parametrize("layer", range(LAYERS))
def test_reader_loads_the_export_bitwise(exported: Path, layer: int) -> None:
    got = read_modelopt_layer(exported, layer)
    assert (got.num_experts, got.hidden_size, got.intermediate_size, got.top_k) == (E, H, I, K)
    stored = stored_tensors(exported)
    p = f"model.layers.{layer}.mlp."
    assert _bytes(got.router_weight) == _bytes(stored[p + "gate.weight"])
    assert got.router_weight.dtype == torch.bfloat16
    named = dict(got.experts.named_tensors())
    assert set(named) == {n[len(p + "experts.") :] for n in stored if n.startswith(p + "experts.")
                          and not n.endswith(".input_scale")}  # fmt: skip
    for n, t in named.items():
        s = stored[p + "experts." + n]
        assert t.numel() == s.numel() and _bytes(t) == _bytes(s), n
    assert read_layer(exported, layer).experts.equal(got.experts)


@pytest.mark.parametrize("layer", range(LAYERS))
def test_writing_the_read_experts_gives_the_export_tensors(tmp_path: Path, exported: Path, layer: int) -> None:
    got = read_modelopt_layer(exported, layer)
    d = write_modelopt_layer(tmp_path / "flint", got.experts, got.router_weight, layer=layer, top_k=got.top_k)
    theirs = _moe(_header(exported), layer)
    want = {n for n in theirs if not n.endswith(".input_scale")}  # the read experts carry no input_scale
    assert set(_header(d)) == want
    assert len(theirs) - len(want) == 3 * E
    _assert_same_tensors(d, exported, want)
    assert _metadata(d) == _metadata(exported) == {"format": "pt"}


@pytest.mark.parametrize("layer", range(LAYERS))
def test_writing_the_export_tensors_keeps_every_byte(tmp_path: Path, exported: Path, layer: int) -> None:
    stored = stored_tensors(exported)
    p = f"model.layers.{layer}.mlp."
    experts = {n[len(p + "experts.") :]: t for n, t in stored.items() if n.startswith(p + "experts.")}
    d = write_modelopt_layer(tmp_path / "flint", experts, stored[p + "gate.weight"], layer=layer, top_k=K)
    theirs = set(_moe(_header(exported), layer))
    assert set(_header(d)) == theirs
    _assert_same_tensors(d, exported, theirs)
    ours, back = read_modelopt_layer(d, layer), read_modelopt_layer(exported, layer)
    assert ours.experts.equal(back.experts) and torch.equal(ours.router_weight, back.router_weight)
    assert ours.top_k == back.top_k == K


def test_json_keys_flint_reads_agree(tmp_path: Path, exported: Path) -> None:
    got = read_modelopt_layer(exported, 0)
    d = write_modelopt_layer(tmp_path / "flint", got.experts, got.router_weight, top_k=got.top_k)
    q_ours = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    q_theirs = json.loads((exported / "hf_quant_config.json").read_text())["quantization"]
    for key in ("quant_algo", "group_size", "kv_cache_quant_algo"):
        assert q_ours[key] == q_theirs[key], key
    # every module ModelOpt left unquantized inside the MoE blocks (the routers) is excluded by flint's patterns,
    # and no pattern of flint's excludes a quantized expert projection
    routers = [m for m in q_theirs["exclude_modules"] if ".mlp." in m]
    assert routers == [f"model.layers.{layer}.mlp.gate" for layer in range(LAYERS)]
    assert all(any(fnmatch.fnmatchcase(m, pat) for pat in q_ours["exclude_modules"]) for m in routers)
    quantized = {n.rsplit(".", 1)[0] for n in _header(exported) if n.endswith(".weight_scale")}
    assert not any(fnmatch.fnmatchcase(m, pat) for m in quantized for pat in q_ours["exclude_modules"])
    c_ours = json.loads((d / "config.json").read_text())
    c_theirs = json.loads((exported / "config.json").read_text())
    for key in ("model_type", "hidden_size", "moe_intermediate_size", "num_experts_per_tok"):
        assert c_ours[key] == c_theirs[key], key
    # transformers 5 spells ModelOpt's expert count num_local_experts, 4.57 num_experts; the reader takes either
    theirs_e = [c_theirs[k] for k in EXPERT_COUNT_KEYS if k in c_theirs]
    assert c_ours["num_experts"] == E and theirs_e == [E]
    # config.json's quantization_config (what loaders reading config.json detect): the same object but for the
    # producer and the exclusions, which are those of hf_quant_config.json in both
    qc_ours, qc_theirs = c_ours["quantization_config"], c_theirs["quantization_config"]
    assert set(qc_ours) == set(qc_theirs)
    for key in set(qc_theirs) - {"producer", "ignore"}:
        assert qc_ours[key] == qc_theirs[key], key
    assert qc_theirs["producer"] == json.loads((exported / "hf_quant_config.json").read_text())["producer"]
    assert (qc_ours["ignore"], qc_theirs["ignore"]) == (q_ours["exclude_modules"], q_theirs["exclude_modules"])
