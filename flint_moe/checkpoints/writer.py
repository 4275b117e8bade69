"""Write ModelOpt NVFP4 checkpoint directories that ``read_modelopt_layer`` (and ``read_layer``) load back.

Two levels:

- :func:`write_modelopt_layer`: one checked MoE layer -> a directory. The experts (``ModelOptExperts``, or the
  per-expert ``{e}.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2,input_scale}`` tensors of ModelOpt's
  export, e.g. from its quantizer) pass the readers' own checks (``checkpoints.experts.ExpertStack``: names,
  dtypes, shapes, E4M3 NaN scale bytes, global scales) and the router those of ``layer.router_to_bf16`` (bf16
  [E, H], finite) before anything is written, so reading the directory back gives the same bits.
- :func:`write_modelopt_tensors`: tensors under their full names, written as given, with the two JSON files. It
  checks its arguments, not the tensors: the form for fixtures, including the malformed checkpoints a reader
  must reject.

Directory layout (the ModelOpt Hugging Face export, docs/checkpoints.md): ``hf_quant_config.json``
(``{"producer": {"name": "flint_moe", ...}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
"kv_cache_quant_algo": null, "exclude_modules": [...]}}``), ``config.json`` (``model_type``,
``num_experts_per_tok`` when top_k is given, ``num_experts``, ``hidden_size``, ``moe_intermediate_size`` and,
as nvidia-modelopt 0.47's export has it, ``quantization_config`` (:func:`config_quantization`) from
:func:`write_modelopt_layer`), and the tensors in ``model.safetensors``, or with ``shards`` > 1 in
``model-0000i-of-0000n.safetensors`` files (sorted names dealt round robin) listed by
``model.safetensors.index.json`` (``weight_map``). Tensor names: ``{prefix}.experts.{e}.{proj}.{kind}``
(``weight`` uint8 [N, K/2], ``weight_scale`` float8_e4m3fn [N, K/16], ``weight_scale_2`` and ``input_scale``
fp32 0-d) and the router ``{prefix}.gate.weight`` bf16 [E, H], ``prefix`` ``model.layers.{layer}.mlp``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from flint_moe.checkpoints.experts import FP8, ExpertStack, ModelOptExperts, expert_count
from flint_moe.checkpoints.layer import router_to_bf16
from flint_moe.checkpoints.modelopt import DEFAULT_PREFIX
from flint_moe.reference._checks import check_tensor

__all__ = ["PRODUCER", "QUANT_CONFIG", "config_quantization", "write_modelopt_layer", "write_modelopt_tensors"]

#: ``hf_quant_config.json``'s producer entry.
PRODUCER = {"name": "flint_moe", "version": "0.1"}
#: ``hf_quant_config.json``'s ``quantization`` section (the router, ``...mlp.gate``, stays unquantized).
QUANT_CONFIG = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]}  # fmt: skip
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: NVFP4 (E2M1 values in blocks of 16, static scales) for weights and activations, as ModelOpt's config groups.
_NVFP4_GROUP = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}


def config_quantization() -> dict:
    """``config.json``'s ``quantization_config`` object: ``hf_quant_config.json``'s quantization section in the
    form nvidia-modelopt 0.47's export writes beside it (``quant_method`` ``"modelopt"``, ``quant_algo``,
    ``producer``, ``ignore`` = ``exclude_modules``, one config group of NVFP4 weights and activations for
    ``Linear`` modules), for loaders that look in config.json rather than ``hf_quant_config.json``; flint's
    reader takes ``hf_quant_config.json`` first."""
    return {
        "config_groups": {"group_0": {"input_activations": dict(_NVFP4_GROUP), "weights": dict(_NVFP4_GROUP),
                                      "targets": ["Linear"]}},
        "ignore": list(QUANT_CONFIG["exclude_modules"]),
        "quant_algo": QUANT_CONFIG["quant_algo"],
        "producer": dict(PRODUCER),
        "quant_method": "modelopt",
    }  # fmt: skip


def _prepare_dir(path: str | Path, overwrite: bool) -> Path:
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise ValueError(f"path: {d} exists and is not a directory")
    if d.is_dir() and any(d.iterdir()) and not overwrite:
        raise ValueError(f"path: directory {d} is not empty (pass overwrite=True to write into it)")
    d.mkdir(parents=True, exist_ok=True)
    for stale in (*d.glob("*.safetensors"), *d.glob("*.safetensors.index.json")):
        stale.unlink()  # overwrite: no shard of an earlier checkpoint may stay readable beside the new one
    return d


def write_modelopt_tensors(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor],
    *,
    config: Mapping | None = None,
    shards: int = 1,
    overwrite: bool = False,
) -> Path:
    """Write ``tensors`` (full checkpoint name -> tensor, written as given) as a ModelOpt NVFP4 directory.

    Args:
        path: the directory (created; it must be empty or absent unless ``overwrite``).
        tensors: name -> CPU or CUDA tensor; each is copied to the CPU (contiguous). Names and values are
            not checked against the format (module docstring): use :func:`write_modelopt_layer` for a checked
            layer.
        config: the ``config.json`` object (default ``{}``).
        shards: number of safetensors files (1: ``model.safetensors`` without an index).
        overwrite: write into a non-empty directory (its earlier safetensors files and index are removed).

    Returns:
        the directory's Path.

    Raises:
        TypeError: ``tensors`` is not a mapping of str -> torch.Tensor, ``config`` not a mapping.
        ValueError: ``shards`` not an int in [1, len(tensors)], no tensors, ``path`` a file or a non-empty
            directory without ``overwrite``.
    """
    from safetensors.torch import save_file

    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a mapping of name -> torch.Tensor, got {type(tensors).__name__}")
    for n, t in tensors.items():
        if not isinstance(n, str) or not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors: entry {n!r} must map a str to a torch.Tensor, got {type(t).__name__}")
    if not tensors:
        raise ValueError("tensors: no tensors to write")
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= len(tensors):
        raise ValueError(f"shards: must be an int in [1, {len(tensors)}] (a tensor per file at least), got {shards!r}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config: expected a mapping (the config.json object), got {type(config).__name__}")
    d = _prepare_dir(path, overwrite)
    (d / "hf_quant_config.json").write_text(
        json.dumps({"producer": PRODUCER, "quantization": QUANT_CONFIG}, indent=2) + "\n"
    )
    (d / "config.json").write_text(json.dumps(dict(config or {}), indent=2) + "\n")
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(shards)]
    for i, name in enumerate(sorted(tensors)):
        # a copy of each: safetensors refuses tensors sharing memory (views of one stack, one tensor given twice)
        parts[i % shards][name] = tensors[name].detach().to("cpu", copy=True).contiguous()
    if shards == 1:
        save_file(parts[0], str(d / SINGLE_FILE), metadata={"format": "pt"})
        return d
    weight_map: dict[str, str] = {}
    for i, part in enumerate(parts):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(d / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2))
    return d


def _checked_experts(experts: ModelOptExperts | Mapping[str, torch.Tensor]) -> tuple[ModelOptExperts, dict]:
    """``experts`` as a checked stack (on the CPU) and its ``input_scale`` tensors by relative name."""
    if isinstance(experts, ModelOptExperts):
        experts, inputs = dict(experts.named_tensors()), {}
    elif isinstance(experts, Mapping):
        inputs = {n: t for n, t in experts.items() if isinstance(n, str) and n.endswith(".input_scale")}
    else:
        raise TypeError(f"experts: expected ModelOptExperts or a mapping of '{{e}}.{{proj}}.{{kind}}' -> tensor, got "
                        f"{type(experts).__name__}")  # fmt: skip
    E = expert_count(experts)
    w = experts["0.gate_proj.weight"]
    d = experts["0.down_proj.weight"]
    check_tensor("experts['0.gate_proj.weight']", w, ndim=2)
    check_tensor("experts['0.down_proj.weight']", d, ndim=2)
    stack = ExpertStack(E, 2 * int(w.shape[1]), int(w.shape[0]), device="cpu")
    for n, t in experts.items():
        stack.add(n, t.detach().to("cpu") if isinstance(t, torch.Tensor) else t)
    for n, t in inputs.items():
        check_tensor(n, t, dtype=torch.float32)
        if t.numel() != 1:
            raise ValueError(f"{n}: expected one fp32 activation scale, got shape {tuple(t.shape)}")
    return stack.finish(), {n: t.detach().to("cpu").reshape(()) for n, t in inputs.items()}


def write_modelopt_layer(
    path: str | Path,
    experts: ModelOptExperts | Mapping[str, torch.Tensor],
    router_weight: torch.Tensor,
    *,
    layer: int = 0,
    top_k: int | None = None,
    prefix: str = DEFAULT_PREFIX,
    model_type: str = "qwen3_moe",
    shards: int = 1,
    overwrite: bool = False,
) -> Path:
    """Write one MoE layer as a ModelOpt NVFP4 checkpoint directory; ``read_modelopt_layer(path, layer)`` returns
    the same experts (bitwise), router and top_k.

    Args:
        path: the directory (created; empty or absent unless ``overwrite``).
        experts: ``ModelOptExperts`` (e.g. ``CheckpointLayer.experts``), or per-expert ModelOpt tensors
            ``{e}.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2[,input_scale]}``: ``weight`` uint8
            [I, H/2] (gate/up) / [H, I/2] (down), ``weight_scale`` float8_e4m3fn (or its uint8 bytes)
            [I, H/16] / [H, I/16], ``weight_scale_2`` fp32 one element, ``input_scale`` fp32 one element
            (optional, kept: W4A16 ignores it).
        router_weight: bf16 [E, H] (fp32 / fp16 only when every value is a bf16 value).
        layer: the layer index in the names (``prefix`` ``{layer}``).
        top_k: experts per token, 1 <= top_k <= E, written as ``num_experts_per_tok`` (None: not recorded).
        prefix: name prefix of the MoE block (``{layer}`` placeholder).
        model_type: ``config.json``'s ``model_type``.
        shards: safetensors files (see :func:`write_modelopt_tensors`).
        overwrite: write into a non-empty directory.

    Returns:
        the directory's Path.

    Raises:
        CheckpointError (a ValueError) or TypeError naming the expert tensor that breaks the format (the
        readers' checks: unknown or non-canonical names, missing or repeated slots, dtypes, shapes, E4M3 NaN
        scale bytes, non-finite or negative global scales); TypeError / ValueError for a router that is not
        bf16-valued [E, H] or not finite, for ``layer`` < 0, ``top_k`` out of [1, E], a ``prefix`` without
        ``{layer}``, and as :func:`write_modelopt_tensors` for ``path`` and ``shards``. Nothing is written
        when a check fails.
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: must be an int >= 0, got {layer!r}")
    if not isinstance(prefix, str) or "{layer}" not in prefix:
        raise ValueError(f"prefix: must be a str with a '{{layer}}' placeholder, got {prefix!r}")
    stacked, input_scales = _checked_experts(experts)
    E, H, inter = stacked.num_experts, stacked.hidden_size, stacked.intermediate_size
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E):
        raise ValueError(f"top_k: must be an int in [1, {E}] (the layer's experts) or None, got {top_k!r}")
    base = prefix.format(layer=layer)
    router = router_to_bf16("router_weight", router_weight, E, H).detach().to("cpu")
    tensors: dict[str, torch.Tensor] = {}
    for name, t in stacked.named_tensors():
        if name.endswith("weight_scale"):
            t = t.view(FP8)
        elif name.endswith("weight_scale_2"):
            t = t.reshape(())
        tensors[f"{base}.experts.{name}"] = t
    for name, t in input_scales.items():
        tensors[f"{base}.experts.{name}"] = t
    tensors[f"{base}.gate.weight"] = router
    config = {"model_type": model_type, "num_experts": E, "hidden_size": H, "moe_intermediate_size": inter}
    if top_k is not None:
        config["num_experts_per_tok"] = top_k
    config["quantization_config"] = config_quantization()
    return write_modelopt_tensors(path, tensors, config=config, shards=shards, overwrite=overwrite)
