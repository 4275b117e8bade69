"""Inputs of the per-token NVFP4 paths (``nvfp4_pertoken_swiglu``, ``nvfp4_pertoken_relu2``: the op
``flint_moe.ops.routed_nvfp4_moe``; docs/numerics.md "Per-token NVFP4 experts").

The layer: random bf16 MCore stacks quantized by ``prepare_routed_nvfp4_weights`` (P6), the golden model's
logical twin ``reference.pertoken_experts.quantize_pertoken_experts``. The routing is an input of the op (no
router): ``notes["routing_map"]`` int32 [M, k] (k distinct experts per token), ``notes["probabilities"]`` fp32
[M, k]. Data profiles stress the per-token quantizer (P1-P5 of the tokens, and through them of the FC2 input):

- ``gaussian``: normal rows, each times its own power of two 2^-6 ... 2^6;
- ``outlier_rows``: every other row tiny values (~1e-3) beside one huge outlier (3e4), so the other blocks'
  decode scales underflow to 0 (their encode scale is FLT_MAX, their codes saturate);
- ``zero_rows``: all-zero rows (g = d = 1), a -0.0 row, among normal rows;
- ``e4m3_clamp``: rows whose amax is a power of two times 2688 = 448 x 6, several blocks at the row max (the
  block scale lands on the 448 clamp by rounding);
- ``e2m1_ties``: rows of the E2M1 midpoints (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) times the row's encode
  scale inverse, with a 6 in each block so the midpoints stay exact after scaling;
- ``dispatcher``: a graph-stable dispatcher buffer: 2E global experts of which this rank holds [E, 2E), a
  fifth of the slots -1, ``token_capacity`` = M - M // 4 and ``out`` pre-filled with 7.0 (rows past the
  capacity must stay untouched).

The shapes and the case lists are in ``cases.py`` (``PERTOKEN_SHAPES``, ``_pertoken_cases``).
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["PERTOKEN_PATHS", "PERTOKEN_PROFILES", "build_pertoken_inputs", "run_pertoken"]

#: Path name -> activation.
PERTOKEN_PATHS = {"nvfp4_pertoken_swiglu": "swiglu", "nvfp4_pertoken_relu2": "relu2"}
PERTOKEN_PROFILES = ("gaussian", "outlier_rows", "zero_rows", "e4m3_clamp", "e2m1_ties", "dispatcher")


def _gen(device: torch.device, text: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(zlib.crc32(text.encode()))


_cache: dict = {}


def _weights(case, device: torch.device):
    from flint_moe.layouts.routed_nvfp4 import to_routed_nvfp4
    from flint_moe.reference.pertoken_experts import quantize_pertoken_experts

    key = (case.path, case.shape, case.seed, str(device))
    if key not in _cache:
        _cache.clear()  # one entry: real layers are large
        g = _gen(device, "/".join(map(str, key[:3])))
        n1 = (2 if PERTOKEN_PATHS[case.path] == "swiglu" else 1) * case.I
        f32 = dict(generator=g, device=device, dtype=torch.float32)
        fc1 = (torch.randn(case.E, n1, case.H, **f32) * 0.02).to(torch.bfloat16)
        fc2 = (torch.randn(case.E, case.H, case.I, **f32) * 0.02).to(torch.bfloat16)
        q = quantize_pertoken_experts(fc1, fc2)
        del fc1, fc2
        stored = to_routed_nvfp4(q.fc1, q.fc1_scale, q.fc1_alpha, q.fc2, q.fc2_scale, q.fc2_alpha, gated=q.gated)
        _cache[key] = (q, stored)
    return _cache[key]


def _tokens(case, g: torch.Generator, dev: torch.device) -> torch.Tensor:
    M, H = case.M, case.H
    f32 = dict(generator=g, device=dev, dtype=torch.float32)
    x = torch.randn(M, H, **f32) * 2.0 ** torch.randint(-6, 7, (M, 1), generator=g, device=dev).float()
    p = case.profile
    rows = torch.arange(M, device=dev)
    if p == "outlier_rows":
        odd = rows % 2 == 1
        x = torch.where(odd[:, None], torch.randn(M, H, **f32) * 1e-3, x)
        col = torch.randint(0, H, (M,), generator=g, device=dev)
        x[rows[odd], col[odd]] = 3.0e4
    elif p == "zero_rows":
        x[rows % 3 == 0] = 0.0
        if M > 1:
            x[1] = -0.0
    elif p == "e4m3_clamp":
        x = x.clamp(-2000.0, 2000.0)
        x[:, ::16] = 2688.0  # the row max, once in every block
        x = x * 2.0 ** torch.randint(-8, 4, (M, 1), generator=g, device=dev).float()
    elif p == "e2m1_ties":
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], device=dev).repeat(H // 8)
        sign = torch.where(torch.rand(M, H, **f32) < 0.5, -1.0, 1.0)
        x = mids[None, :] * sign * 2.0 ** torch.randint(-4, 4, (M, 1), generator=g, device=dev).float()
    return x.to(torch.bfloat16)


def build_pertoken_inputs(case, device: torch.device):
    """``profiles.CaseInputs`` of a per-token case (module docstring): ``x`` bf16 [M, H]; ``router_weight`` and
    ``shared`` zeros (the op has no router and no shared add; kept so generic code finds tensors); ``logical``
    the golden model's ``PerTokenNVFP4Experts``; ``stored`` ``RoutedNVFP4Weights``; ``notes`` ``top_k``,
    ``routing_map``, ``probabilities``, ``num_experts``, ``local_expert_offset``, ``token_capacity``,
    ``activation``, ``out_init`` (None, or the bf16 [M, H] contents of ``out`` before the call)."""
    from flint_moe.conformance.inputs.profiles import CaseInputs

    logical, stored = _weights(case, device)
    g = _gen(device, case.id)
    x = _tokens(case, g, device)
    M, E, k = case.M, case.E, case.k
    disp = case.profile == "dispatcher"
    n_exp, off = (2 * E, E) if disp else (E, 0)
    ids = torch.argsort(torch.rand(M, n_exp, generator=g, device=device), dim=1)[:, :k].to(torch.int32)
    if disp:
        drop = torch.rand(M, k, generator=g, device=device) < 0.2
        ids = torch.where(drop, torch.full_like(ids, -1), ids)
        ids[0, -1] = -1  # at least one empty slot
    probs = torch.rand(M, k, generator=g, device=device)
    notes = {
        "top_k": k, "routing_map": ids, "probabilities": probs, "num_experts": n_exp, "local_expert_offset": off,
        "token_capacity": M - M // 4 if disp else None, "activation": PERTOKEN_PATHS[case.path],
        "out_init": torch.full((M, case.H), 7.0, dtype=torch.bfloat16, device=device) if disp else None,
    }  # fmt: skip
    zeros = torch.zeros((E, case.H), dtype=torch.bfloat16, device=device)
    shared = torch.zeros((M, case.H), dtype=torch.bfloat16, device=device)
    return CaseInputs(x, zeros, shared, logical, stored, notes)


def run_pertoken(inputs, counter, taps):
    """The op on a per-token case's inputs (``run.paths`` calls it; ``counter`` unused: no router)."""
    from flint_moe.ops import routed_nvfp4_moe

    n = inputs.notes
    m = int(inputs.x.shape[0])
    ids, probs = n["routing_map"], n["probabilities"]
    if ids.shape[0] != m:  # an invariance ran a subset of the rows: no routing for it
        raise ValueError(f"per-token path: routing_map has {ids.shape[0]} rows, x has {m}")
    out = None if n.get("out_init") is None else n["out_init"].clone()
    return routed_nvfp4_moe(inputs.x, ids, probs, inputs.stored, num_experts=n["num_experts"],
                            local_expert_offset=n["local_expert_offset"], activation=n["activation"], out=out,
                            token_capacity=n["token_capacity"], taps=taps)  # fmt: skip
