"""Conformance cases on a real checkpoint's MoE layer (``python -m flint_moe.conformance --checkpoint
PATH --layer N``).

The weights come from the checkpoint (``flint_moe.checkpoints.read_layer``: a ModelOpt NVFP4 directory or a
GGUF file in either convention, docs/checkpoints.md); tokens and the shared output are generated from the
seed. Each case is an ``nvfp4_decode`` ``Case`` on a ``ShapeSpec`` named after the checkpoint, so it runs
through the same paths, comparison and report as the matrix (``paths.PATHS["nvfp4_decode"]``,
``stages.compare_case``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from pathlib import Path

import torch

from flint_moe.conformance.inputs.cases import Case, ShapeSpec
from flint_moe.conformance.inputs.profiles import CaseInputs

__all__ = [
    "CHECKPOINT_ERRORS",
    "CHECKPOINT_PROFILE",
    "checkpoint_cases",
    "checkpoint_error_line",
    "checkpoint_shape_name",
]

#: Data profile recorded in the cases (weights produced by the ModelOpt recipe, or converted from one).
CHECKPOINT_PROFILE = "modelopt"
#: What ``checkpoint_cases`` raises for a checkpoint it cannot use: OSError (no such path, unreadable),
#: ValueError (``checkpoints.CheckpointError``: the file and tensor named; a bad argument or top_k), KeyError.
CHECKPOINT_ERRORS = (OSError, ValueError, KeyError)


def checkpoint_error_line(path: str | Path, layer: int, exc: BaseException) -> str:
    """One line for the CLI's stderr: ``--checkpoint PATH --layer N: <message>`` (line breaks of the message,
    e.g. of a wrapped library error, become '; ')."""
    msg = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__
    return f"--checkpoint {path} --layer {layer}: {msg}"


def checkpoint_shape_name(path: str | Path, layer: int) -> str:
    """``ckpt-<file or directory name>-L<layer>`` with characters outside [A-Za-z0-9_.-] replaced by '-'."""
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "-", Path(path).name or "root")
    return f"ckpt-{stem}-L{layer}"


def checkpoint_cases(
    path: str | Path,
    layer: int,
    *,
    token_counts: Iterable[int],
    seed: int = 0,
    device: torch.device | str = "cpu",
    top_k: int | None = None,
) -> list[tuple[Case, CaseInputs]]:
    """Conformance inputs for layer ``layer`` of the checkpoint at ``path``, one case per token count.

    Contract:
      - Weights: ``checkpoints.read_layer(path, layer)``. ``CaseInputs.logical`` is the golden model's
        ``reference.weights.NVFP4Experts`` (checkpoint layout, logical I: what the reference decodes);
        ``CaseInputs.stored`` is the ``layouts.FlintMoEWeights`` the kernels read, built by loading the
        experts through ``modules.FlintNvfp4Experts.load_weights`` (so the module's loader is what is
        checked), intermediate padded to 64 when I % 64 != 0. ``router_weight`` is the checkpoint's (bf16
        [E, H]). The weights are read and converted once and shared by every returned case.
      - Tokens: ``x`` bf16 [M, H] ~ N(0, 1) and ``shared`` bf16 [M, H] ~ 0.5 N(0, 1), drawn on ``device`` from a
        ``torch.Generator`` seeded with crc32 of ``"checkpoint/" + case.id``: same checkpoint, layer, M, seed
        and device -> same bytes.
      - Cases: ``Case.make("nvfp4_decode", ShapeSpec(checkpoint_shape_name(path, layer), E, H, I, k, pad),
        M, CHECKPOINT_PROFILE, seed)``, in the order of ``token_counts``. Their ids name a shape that is not in
        ``cases.SHAPES``: ``Case.from_id`` cannot rebuild them (rerun with the same path, layer and seed).
      - ``CaseInputs.notes``: ``top_k``, ``checkpoint`` (path), ``layer``, ``source`` (``"modelopt"``,
        ``"gguf-modelopt"`` or ``"gguf-nvfp4"``).

    Args:
        path: ModelOpt NVFP4 checkpoint directory or GGUF file.
        layer: MoE layer index.
        token_counts: M values (each >= 1; ``ops.flint_moe`` runs the decode kernels for M <=
            ``ops.decode_max_tokens(E, k)``, the grouped path above: the caller picks the path,
            ``run.paths.dispatch_path``).
        seed: token seed (>= 0).
        device: where every tensor goes.
        top_k: experts per token; default: the checkpoint's (config.json ``num_experts_per_tok`` / GGUF
            ``<arch>.expert_used_count``).

    Raises:
        FileNotFoundError / OSError: no such or an unreadable checkpoint. ``checkpoints.CheckpointError`` (a
        ValueError naming the file and tensor): a bad checkpoint (see ``flint_moe.checkpoints``). ValueError:
        top_k unknown or out of range, an empty ``token_counts`` or an M < 1, seed < 0.
    """
    from flint_moe.checkpoints import read_layer

    counts = [int(m) for m in token_counts]
    if not counts or min(counts) < 1:
        raise ValueError(f"token_counts: need at least one M >= 1, got {counts}")
    if seed < 0:
        raise ValueError(f"seed: must be >= 0, got {seed}")
    dev = torch.device(device)
    ck = read_layer(path, layer, device=dev)
    k = ck.resolve_top_k(top_k)
    E, H, I = ck.num_experts, ck.hidden_size, ck.intermediate_size  # noqa: E741
    pad = None if I % 64 == 0 else 64
    module = ck.build_module(k, pad_intermediate_to=pad, device=dev)
    stored = module.weights
    logical = ck.experts.to_logical()
    spec = ShapeSpec(checkpoint_shape_name(path, layer), E, H, I, k, pad)
    notes = {"top_k": k, "checkpoint": str(path), "layer": layer, "source": ck.source}
    out = []
    for m in counts:
        case = Case.make("nvfp4_decode", spec, m, CHECKPOINT_PROFILE, seed)
        g = torch.Generator(device=dev).manual_seed(zlib.crc32(("checkpoint/" + case.id).encode()))
        x = torch.randn(m, H, generator=g, device=dev).to(torch.bfloat16)
        shared = (torch.randn(m, H, generator=g, device=dev) * 0.5).to(torch.bfloat16)
        out.append((case, CaseInputs(x, ck.router_weight, shared, logical, stored, dict(notes))))
    return out
