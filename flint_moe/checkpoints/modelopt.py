"""Read one MoE layer of a ModelOpt NVFP4 checkpoint directory (``hf_quant_config.json`` + ``*.safetensors``).

Format (NVIDIA Model Optimizer's HF export; shared/notes/models-and-formats.md "ModelOpt NVFP4 checkpoints"):
``hf_quant_config.json`` with ``quantization.quant_algo == "NVFP4"`` and ``group_size`` 16 (or the same keys
under ``config.json``'s ``quantization_config``); tensors in one or more ``*.safetensors`` files, sharded
checkpoints listing them in ``*.safetensors.index.json`` (``weight_map``: name -> file). Per expert ``e`` of
layer ``L``: ``{prefix}.experts.{e}.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2,input_scale}``
(dtypes and shapes: ``checkpoints.experts``), router ``{prefix}.gate.weight`` bf16 [E, H], prefix
``model.layers.{L}.mlp`` by default (configurable: families differ). ``config.json``'s ``num_experts_per_tok``
(or ``text_config.num_experts_per_tok``) gives top_k when present; its ``num_experts`` / ``n_routed_experts`` /
``num_local_experts`` (same places), when present, is the layer's E, otherwise E is the contiguous index range
0..E-1 of the names present.

Only the selected layer's tensors are read (safetensors reads each tensor on its own); every name is checked
and E bounded before anything is allocated. Every file read lies inside the checkpoint directory: an index entry
that is absolute, has a ``..`` part or resolves (through symlinks) outside it is refused; the one exception is a
Hugging Face hub cache snapshot (``.../snapshots/<revision>/``), whose files are symlinks into the repository's
own ``blobs`` folder. Rejected with ``CheckpointError`` (a ValueError naming the file and the tensor or key): a
directory without an NVFP4 quant config, JSON that is not valid or not an object, a missing layer (the message
lists the MoE layers present), missing / duplicate / misshapen / wrongly typed expert tensors, non-canonical or
out-of-range expert indices, E4M3 NaN scale bytes (0x7F / 0xFF), non-finite or negative global scales, a router
that is not bf16-valued or not finite, unreadable safetensors files.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from flint_moe.checkpoints.errors import CheckpointError, read_json_object, reraise_in
from flint_moe.checkpoints.experts import INDEX, ExpertStack, check_stack_fits, expert_count
from flint_moe.checkpoints.layer import CheckpointLayer, router_to_bf16

__all__ = ["DEFAULT_PREFIX", "read_modelopt_layer", "modelopt_moe_layers", "read_quant_config"]

#: Default name prefix of layer L's MoE block (DeepSeek / Qwen / GLM style).
DEFAULT_PREFIX = "model.layers.{layer}.mlp"
#: config.json keys holding the routed expert count (Qwen, DeepSeek, Mixtral / GPT-OSS / Llama 4).
EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def read_quant_config(path: str | Path) -> dict:
    """The ``quantization`` section of ``hf_quant_config.json`` (or ``config.json``'s ``quantization_config``).

    Raises FileNotFoundError if neither is there, CheckpointError (naming the file) for JSON that is not an
    object and unless quant_algo is NVFP4 with group_size 16.
    """
    d = Path(path)
    q, src = None, d / "hf_quant_config.json"
    if src.is_file():
        q = read_json_object(src).get("quantization")
        key = "quantization"
    if q is None and (d / "config.json").is_file():
        src, key = d / "config.json", "quantization_config"
        q = read_json_object(src).get(key)
    if q is None:
        raise FileNotFoundError(
            f"{d}: no hf_quant_config.json (nor quantization_config in config.json): not a ModelOpt checkpoint"
        )
    if not isinstance(q, dict):
        raise CheckpointError(src, key, f"expected a JSON object, got {type(q).__name__}")
    algo = q.get("quant_algo")
    if algo != "NVFP4":
        raise CheckpointError(src, f"{key}.quant_algo", f"quant_algo is {algo!r}, expected 'NVFP4'")
    gs = q.get("group_size", 16)
    if isinstance(gs, bool) or gs != 16:
        raise CheckpointError(src, f"{key}.group_size", f"group_size {gs!r}, expected 16 (NVFP4 block)")
    return q


def _config_int(d: Path, keys: tuple[str, ...]) -> tuple[int | None, str]:
    """The first of ``keys`` in config.json (or its ``text_config``) and where it was found; (None, "") if none."""
    f = d / "config.json"
    if not f.is_file():
        return None, ""
    cfg = read_json_object(f)
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise CheckpointError(f, "text_config", f"expected a JSON object, got {type(text).__name__}")
    for where, c in (("", cfg), ("text_config.", text or {})):
        for k in keys:
            v = c.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f, where + k, f"expected a positive integer, got {v!r}")
            return v, f"config.json {where}{k} = {v}"
    return None, ""


def _inside(d: Path, rel: str, source: Path, tensor: str | None = None) -> Path:
    """``d / rel`` if it lies inside the checkpoint directory ``d`` (module docstring), else CheckpointError."""
    if not isinstance(rel, str) or not rel:
        raise CheckpointError(source, tensor, f"expected a file name, got {rel!r}")
    p = Path(rel)
    if p.is_absolute() or p.drive or ".." in p.parts:
        raise CheckpointError(source, tensor, f"file {rel!r} is not a path inside the checkpoint directory {d}")
    full = d / p
    root = d.resolve()
    target = full.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # Hugging Face hub cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
        allowed.append((root.parent.parent / "blobs").resolve())
    if not any(target.is_relative_to(a) for a in allowed):
        raise CheckpointError(source, tensor, f"file {rel!r} resolves to {target}, outside the checkpoint directory")
    return full


def _name_map(d: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file (from the index json if there is one, else every file's header)."""
    idx = sorted(d.glob("*.safetensors.index.json"))
    if idx:
        wm = read_json_object(idx[0]).get("weight_map")
        if not isinstance(wm, dict):
            raise CheckpointError(idx[0], "weight_map", "no 'weight_map' object")
        return {k: _inside(d, v, idx[0], k) for k, v in wm.items()}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{d}: no *.safetensors files")
    out: dict[str, Path] = {}
    for f in files:
        for k in _open(_inside(d, f.name, d)).keys():  # noqa: SIM118 (safe_open is not a mapping)
            if k in out:
                raise CheckpointError(f, k, f"also stored in {out[k].name}")
            out[k] = f
    return out


def _open(f: Path, tensor: str | None = None):
    """``safe_open(f)`` (to read ``tensor``); CheckpointError naming the file (and the tensor) for anything but
    a readable safetensors file."""
    from safetensors import safe_open

    if not f.is_file():
        raise CheckpointError(f, tensor, "no such safetensors file")
    try:
        return safe_open(str(f), "pt")
    except OSError:
        raise
    except Exception as exc:  # SafetensorError (a header that does not parse) has no common base with ValueError
        raise CheckpointError(f, tensor, f"not a readable safetensors file: {exc}") from exc


def modelopt_moe_layers(path: str | Path, prefix: str = DEFAULT_PREFIX) -> list[int]:
    """Indices of the layers that have routed experts under ``prefix`` (``{layer}`` placeholder)."""
    pat = re.compile(re.escape(prefix).replace(re.escape("{layer}"), f"({INDEX})") + r"\.experts\.")
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
        ``CheckpointLayer`` (source ``"modelopt"``): experts stacked in ModelOpt layout (E from config.json or
        the names, H and I from expert 0's shapes), router bf16 [E, H], top_k from config.json if present.

    Raises:
        FileNotFoundError: no quant config / safetensors. CheckpointError (ValueError): see module docstring.
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: must be an int >= 0, got {layer!r}")
    d = Path(path)
    read_quant_config(d)
    names = _name_map(d)
    base = prefix.format(layer=layer)
    ex_prefix = base + ".experts."
    keys = sorted((k for k in names if k.startswith(ex_prefix)), key=_natural)
    if not keys:
        present = modelopt_moe_layers(d, prefix)
        raise CheckpointError(d, None, f"layer {layer}: no tensors named {ex_prefix}<e>.* (MoE layers present: "
                              f"{present})")  # fmt: skip
    cfg_e, cfg_src = _config_int(d, EXPERT_COUNT_KEYS)
    rel = [k[len(ex_prefix) :] for k in keys]
    try:
        E = expert_count(rel, ex_prefix, cfg_e, cfg_src)
    except CheckpointError as exc:  # located in the tensor's file where it names one
        raise CheckpointError(names.get(exc.tensor, d), exc.tensor, exc.what) from exc
    handles: dict[Path, object] = {}

    def get(name: str) -> torch.Tensor:
        if name not in names:
            raise CheckpointError(d, name, "missing")
        f = names[name]
        if f not in handles:
            handles[f] = _open(f, name)
        try:
            return handles[f].get_tensor(name)
        except Exception as exc:  # SafetensorError: not in this file, data out of the file's range, bad dtype
            raise CheckpointError(f, name, f"cannot be read: {exc}") from exc

    g0n, d0n = ex_prefix + "0.gate_proj.weight", ex_prefix + "0.down_proj.weight"
    g0, d0 = get(g0n), get(d0n)
    if g0.dim() != 2 or d0.dim() != 2:
        raise CheckpointError(names[g0n], g0n, f"expected 2-D weights, got {tuple(g0.shape)} and {d0n} "
                              f"{tuple(d0.shape)}")  # fmt: skip
    inter, hidden = int(g0.shape[0]), 2 * int(g0.shape[1])
    files = {names[k] for k in keys}
    with reraise_in(d, f"{ex_prefix}<e>.*"):
        check_stack_fits(E, hidden, inter, sum(f.stat().st_size for f in files), "their safetensors files")
    with reraise_in(names[g0n], g0n):
        stack = ExpertStack(E, hidden, inter, device=device, prefix=ex_prefix)
    for k, r in zip(keys, rel, strict=True):
        t = get(k)
        with reraise_in(names[k], k):
            stack.add(r, t)
    with reraise_in(d, None):
        experts = stack.finish()
    rname = f"{base}.{router_name}"
    router = get(rname)
    with reraise_in(names[rname], rname):
        router = router_to_bf16(rname, router, E, hidden).to(device)
    return CheckpointLayer(layer, experts, router, _config_int(d, ("num_experts_per_tok",))[0], "modelopt", str(d),
                           [*keys, rname])  # fmt: skip


def _natural(name: str) -> tuple:
    return tuple((0, int(p), p) if p.isdigit() else (1, 0, p) for p in re.split(r"([0-9]+)", name))
