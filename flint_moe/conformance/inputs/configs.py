"""The launch configurations of the conformance matrix: every kernel configuration a path can pick besides its
default (``PATH_CONFIGS``; a case's ``/c-<config>``, ``flint_moe.conformance.inputs.cases``)."""

from __future__ import annotations

__all__ = ["PATH_CONFIGS"]

#: Launch configurations a path can pick besides its default (every kernel configuration a path can
#: pick, not only the default): name -> overrides per kernel (``gate_up`` / ``down``: a launcher config dict,
#: or the name of one in flint_moe/kernels/nvfp4/tuned.py; ``BM`` and ``TAIL`` for the grouped path).
#: ``flint_moe.conformance.run.paths.path_for`` runs them and ``stages.expert_models`` bounds their accumulations
#: with the model each kernel declares for that configuration. NVFP4 decode: the other measured path of each
#: kernel (CUDA cores / tensor cores; docs/kernels/nvfp4-decode.md); BF16: the faster Qwen M=1 gate/up of the
#: launch sweep and a deeper down unroll; grouped: the smallest and a larger row block, and the expert-wide row
#: blocks (``TAIL``: BM + min(TAIL, BM) pairs per program, a second accumulator for the pairs past BM) where the
#: default (below 8 pairs per expert) has none, and ``classic`` (neither ``TAIL`` nor ``SCALE_WORD``) where the
#: default has both, both on the Triton kernels, whose row-block and scale-word code they exercise (with
#: ``ENGINE`` None the H200 runs row blocks of 16 pairs on the Gluon kernels); the engines (``ENGINE``,
#: ``grouped_gate_up.default_engine``): the Triton kernels where the default takes a Gluon one on the H200, the
#: Gluon and the warp-specialised Gluon kernels where it takes another (their row blocks of 128 + 32 pairs too).
PATH_CONFIGS: dict[str, dict[str, dict]] = {
    "nvfp4_decode": {
        "default": {},
        "gu-cuda-core": {"gate_up": "GATE_UP_CUDA_CORE"},
        "dn-cuda-core": {"down": "DOWN_CUDA_CORE"},
    },
    "bf16_decode": {
        "default": {},
        "gu-bn4-w1-u8": {"gate_up": {"BN": 4, "num_warps": 1, "UNROLL": 8}},
        "dn-bh8-u8": {"down": {"BH": 8, "UNROLL": 8}},
    },
    "nvfp4_grouped": {
        "default": {},
        "bm64": {"BM": 64},
        "bm128": {"BM": 128},
        "rows-tail32": {"TAIL": 32, "gate_up": {"ENGINE": "triton"}, "down": {"ENGINE": "triton"}},
        "classic": {"TAIL": 0, "gate_up": {"ENGINE": "triton", "SCALE_WORD": False},
                    "down": {"ENGINE": "triton", "SCALE_WORD": False}},
        "triton": {"gate_up": {"ENGINE": "triton"}, "down": {"ENGINE": "triton"}},
        "gluon": {"gate_up": {"ENGINE": "gluon"}, "down": {"ENGINE": "gluon"}},
        "gluon-ws": {"gate_up": {"ENGINE": "gluon_ws"}, "down": {"ENGINE": "gluon_ws"}},
        "gluon-ws-bm128": {"BM": 128, "TAIL": 32, "gate_up": {"ENGINE": "gluon_ws"},
                           "down": {"ENGINE": "gluon_ws"}},
    },
    "nvfp4_module": {"default": {}},
    "bf16_module": {"default": {}},
    "nvfp4_dispatch": {"default": {}},
    "ll_block": {"default": {}},
    "ll_module": {"default": {}},
    "nvfp4_pertoken_swiglu": {"default": {}},
    "nvfp4_pertoken_relu2": {"default": {}},
}
