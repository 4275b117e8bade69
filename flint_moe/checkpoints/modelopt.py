"""Read one MoE layer of a ModelOpt NVFP4 checkpoint directory (``hf_quant_config.json`` + ``*.safetensors``).

Format (NVIDIA Model Optimizer's HF export; shared/notes/models-and-formats.md "ModelOpt NVFP4 checkpoints"):
``hf_quant_config.json`` with ``quantization.quant_algo == "NVFP4"`` and ``group_size`` 16 (or the same keys
under ``config.json``'s ``quantization_config``); tensors in one or more ``*.safetensors`` files, sharded
checkpoints listing them in ``*.safetensors.index.json`` (``weight_map``: name -> file). Per expert ``e`` of
layer ``L``: ``{prefix}.experts.{e}.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2,input_scale}``
(dtypes and shapes: ``checkpoints.experts``), router ``{prefix}.gate.weight`` bf16 [E, H], prefix
``model.layers.{L}.mlp`` by default (configurable: families differ). ``config.json``'s ``num_experts_per_tok``
(or ``text_config.num_experts_per_tok``) gives top_k when present.

Only the selected layer's tensors are read (safetensors reads each tensor on its own). Rejected with a
ValueError naming the tensor or file: a directory without an NVFP4 quant config, a missing layer (the message
lists the MoE layers present), missing / duplicate / misshapen expert tensors, E4M3 NaN scale bytes
(0x7F / 0xFF), non-finite or negative global scales, a router that is not bf16-valued.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from flint_moe.checkpoints.experts import ExpertStack
from flint_moe.checkpoints.layer import CheckpointLayer, router_to_bf16

__all__ = ["DEFAULT_PREFIX", "read_modelopt_layer", "modelopt_moe_layers", "read_quant_config"]

#: Default name prefix of layer L's MoE block (DeepSeek / Qwen / GLM style).
DEFAULT_PREFIX = "model.layers.{layer}.mlp"


def read_quant_config(path: str | Path) -> dict:
    """The ``quantization`` section of ``hf_quant_config.json`` (or ``config.json``'s ``quantization_config``).

    Raises FileNotFoundError if neither is there, ValueError unless quant_algo is NVFP4 with group_size 16.
    """
    d = Path(path)
    q = None
    f = d / "hf_quant_config.json"
    if f.is_file():
        q = json.loads(f.read_text()).get("quantization")
    if q is None and (d / "config.json").is_file():
        q = json.loads((d / "config.json").read_text()).get("quantization_config")
    if q is None:
        raise FileNotFoundError(
            f"{d}: no hf_quant_config.json (nor quantization_config in config.json): not a ModelOpt checkpoint"
        )
    algo = q.get("quant_algo")
    if algo != "NVFP4":
        raise ValueError(f"{d}: quant_algo is {algo!r}, expected 'NVFP4' (hf_quant_config.json)")
    gs = q.get("group_size", 16)
    if gs != 16:
        raise ValueError(f"{d}: group_size {gs}, expected 16 (NVFP4 block)")
    return q


def _top_k(d: Path) -> int | None:
    f = d / "config.json"
    if not f.is_file():
        return None
    cfg = json.loads(f.read_text())
    for c in (cfg, cfg.get("text_config") or {}):
        k = c.get("num_experts_per_tok")
        if isinstance(k, int):
            return k
    return None


def _name_map(d: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file (from the index json if there is one, else every file's header)."""
    from safetensors import safe_open

    idx = sorted(d.glob("*.safetensors.index.json"))
    if idx:
        wm = json.loads(idx[0].read_text()).get("weight_map")
        if not isinstance(wm, dict):
            raise ValueError(f"{idx[0]}: no 'weight_map' object")
        return {k: d / v for k, v in wm.items()}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{d}: no *.safetensors files")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), "pt") as h:
            for k in h.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if k in out:
                    raise ValueError(f"{k}: stored in both {out[k].name} and {f.name}")
                out[k] = f
    return out


def modelopt_moe_layers(path: str | Path, prefix: str = DEFAULT_PREFIX) -> list[int]:
    """Indices of the layers that have routed experts under ``prefix`` (``{layer}`` placeholder)."""
    pat = re.compile(re.escape(prefix).replace(re.escape("{layer}"), r"(\d+)") + r"\.experts\.\d+\.")
    return sorted({int(m[1]) for k in _name_map(Path(path)) if (m := pat.match(k))})


def read_modelopt_layer(
    path: str | Path,
    layer: int,
    *,
    prefix: str = DEFAULT_PREFIX,
    router_name: str = "gate.weight",
    device: torch.device | str | None = "cpu",
) -> CheckpointLayer:
    """Read layer ``layer``'s routed experts and router weight from a ModelOpt NVFP4 directory.

    Args:
        path: the checkpoint directory.
        layer: layer index (>= 0).
        prefix: name prefix of the MoE block, ``{layer}`` replaced by ``layer``; experts are under
            ``{prefix}.experts.{e}.``, the router is ``{prefix}.{router_name}``.
        device: where the stacked tensors go.

    Returns:
        ``CheckpointLayer`` (source ``"modelopt"``): experts stacked in ModelOpt layout (E from the names,
        H and I from expert 0's shapes), router bf16 [E, H], top_k from config.json if present.

    Raises:
        FileNotFoundError: no quant config / safetensors. ValueError: see module docstring.
    """
    from safetensors import safe_open

    d = Path(path)
    read_quant_config(d)
    names = _name_map(d)
    base = prefix.format(layer=layer)
    ex_prefix = base + ".experts."
    pat = re.compile(re.escape(ex_prefix) + r"(\d+)\.")
    ids = sorted({int(m[1]) for k in names if (m := pat.match(k))})
    if not ids:
        present = modelopt_moe_layers(d, prefix)
        raise ValueError(f"layer {layer}: no tensors named {ex_prefix}<e>.* in {d} (MoE layers present: {present})")
    E = ids[-1] + 1
    handles: dict[Path, object] = {}

    def get(name: str) -> torch.Tensor:
        if name not in names:
            raise ValueError(f"{name}: missing from {d}")
        f = names[name]
        if f not in handles:
            handles[f] = safe_open(str(f), "pt")
        return handles[f].get_tensor(name)

    g0, d0 = get(ex_prefix + "0.gate_proj.weight"), get(ex_prefix + "0.down_proj.weight")
    if g0.dim() != 2 or d0.dim() != 2:
        raise ValueError(f"{ex_prefix}0: expected 2-D weights, got {tuple(g0.shape)} and {tuple(d0.shape)}")
    inter, hidden = int(g0.shape[0]), 2 * int(g0.shape[1])
    stack = ExpertStack(E, hidden, inter, device=device, prefix=ex_prefix)
    read = []
    for k in sorted((k for k in names if k.startswith(ex_prefix)), key=_natural):
        stack.add(k[len(ex_prefix) :], get(k))
        read.append(k)
    experts = stack.finish()
    rname = f"{base}.{router_name}"
    router = router_to_bf16(rname, get(rname), E, hidden).to(device)
    read.append(rname)
    return CheckpointLayer(layer, experts, router, _top_k(d), "modelopt", str(d), read)


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
