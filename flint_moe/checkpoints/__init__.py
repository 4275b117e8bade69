"""Real checkpoint loading: one MoE layer of a ModelOpt NVFP4 safetensors directory or a GGUF file, read into
the ModelOpt checkpoint layout (``ModelOptExperts``) plus the router weight (``CheckpointLayer``), from which
``CheckpointLayer.build_module`` makes a loaded ``flint_moe.modules.FlintNvfp4Experts``.

- ``read_modelopt_layer`` (``checkpoints.modelopt``): ``hf_quant_config.json`` + ``*.safetensors`` (sharded
  with an index json or not).
- ``read_gguf_layer`` (``checkpoints.gguf``): per-expert ModelOpt tensors stored as plain GGUF tensors, or
  llama.cpp's NVFP4 type 40 with merged experts and ``<name>.scale`` global scales (converted exactly).
- ``read_layer``: either, by path (a directory -> ModelOpt, a ``.gguf`` file -> GGUF).
- ``write_modelopt_layer`` / ``write_modelopt_tensors`` (``checkpoints.writer``): one MoE layer (checked) or
  named tensors (as given) to a ModelOpt NVFP4 directory that ``read_modelopt_layer`` loads back.

A checkpoint that breaks its format raises ``CheckpointError`` (a ValueError whose message names the file and
the tensor or key); expert names follow one rule everywhere (``checkpoints.experts.parse_expert_name``).

Formats and conversion rules: docs/checkpoints.md.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flint_moe.checkpoints.errors import CheckpointError
from flint_moe.checkpoints.experts import ExpertStack, ModelOptExperts, parse_expert_name
from flint_moe.checkpoints.gguf import nvfp4_gguf_to_modelopt, read_gguf_layer
from flint_moe.checkpoints.layer import CheckpointLayer
from flint_moe.checkpoints.modelopt import read_modelopt_layer
from flint_moe.checkpoints.writer import write_modelopt_layer, write_modelopt_tensors

__all__ = [
    "CheckpointError",
    "CheckpointLayer",
    "ExpertStack",
    "ModelOptExperts",
    "nvfp4_gguf_to_modelopt",
    "parse_expert_name",
    "read_gguf_layer",
    "read_layer",
    "read_modelopt_layer",
    "write_modelopt_layer",
    "write_modelopt_tensors",
]


def read_layer(path: str | Path, layer: int, *, device: torch.device | str | None = "cpu") -> CheckpointLayer:
    """Layer ``layer`` of the checkpoint at ``path``: a directory is read as ModelOpt safetensors
    (``read_modelopt_layer``), a file as GGUF (``read_gguf_layer``). FileNotFoundError if ``path`` does not
    exist; otherwise OSError (unreadable), ValueError (``layer`` < 0) or CheckpointError as the readers raise."""
    p = Path(path)
    if p.is_dir():
        return read_modelopt_layer(p, layer, device=device)
    if p.is_file():
        return read_gguf_layer(p, layer, device=device)
    raise FileNotFoundError(f"{p}: no such checkpoint directory or GGUF file")
