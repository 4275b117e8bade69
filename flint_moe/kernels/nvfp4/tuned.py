"""Launch configurations of the NVFP4 decode kernels chosen on the H200.

Written by ``python -m benchmarks.tune.decode_nvfp4 --tune --write-tuned`` (docs/kernels/nvfp4-decode.md):
``GATE_UP`` / ``DOWN`` are the pair with the least gate/up + down time at DeepSeek-V3 M=1 among the
CUDA-core and tensor-core (``MMA``) candidates, each checked against the golden model first;
``*_BY_SHAPE[(H, I)]`` the pair of another measured model where it differs (same paths: a shape never
changes ``MMA``); ``*_CUDA_CORE`` / ``*_MMA`` the best of each path at DeepSeek-V3 (tests run both).
Then ``--down-early --write-tuned``: ``DOWN`` / ``DOWN_MMA`` the fastest pair of the down candidates
(weights loaded before the grid-dependency wait, register cap; same bits as the base down
``mma-BH16w1r2s4``, the ``--tune`` choice); the per-shape down overrides pinned to the base down's behaviour
(EARLY 0, MAXNREG 0). The keys of launch variants removed later (docs/kernels/nvfp4-decode.md) were dropped
from the written values.
Measured 2026-11-30 01:43 UTC: DeepSeek-V3 M=1 gate/up + down 69.1 us
(copy 4.158 TB/s; base down 72.6 us in the same run).
"""

GATE_UP = {
    "MMA": True,
    "BN": 8,
    "num_warps": 4,
    "RT": 2,
    "S": 2,
    "SK": 4,
    "FENCE": True,
}  # mma-BN8w4r2s2k4-f
DOWN = {
    "MMA": True,
    "BH": 16,
    "num_warps": 1,
    "RT": 2,
    "S": 4,
    "SK": 1,
    "FENCE": False,
    "EARLY": 1,
    "MAXNREG": 72,
}  # mma-BH16w1r2s4-e1-r72
GATE_UP_CUDA_CORE = {"MMA": False, "BN": 8, "num_warps": 2, "BKB": 512}  # cc-BN8w2
GATE_UP_MMA = dict(GATE_UP)  # mma-BN8w4r2s2k4-f
DOWN_CUDA_CORE = {"MMA": False, "BH": 16, "num_warps": 4, "BKB": 512}  # cc-BH16w4
DOWN_MMA = dict(DOWN)  # mma-BH16w1r2s4-e1-r72
#: Per-shape overrides ((H, I) -> keys replacing GATE_UP's / DOWN's at that shape; never MMA).
GATE_UP_BY_SHAPE: dict = {
    (2048, 768): {
        "MMA": True,
        "BN": 16,
        "num_warps": 2,
        "RT": 2,
        "S": 4,
        "SK": 1,
        "FENCE": True,
    },  # mma-BN16w2r2s4-f
}
DOWN_BY_SHAPE: dict = {
    (2048, 768): {
        "MMA": True,
        "BH": 16,
        "num_warps": 2,
        "RT": 2,
        "S": 4,
        "SK": 2,
        "FENCE": True,
        "EARLY": 0,
        "MAXNREG": 0,
    },  # mma-BH16w2r2s4k2-f
    (2880, 2880): {
        "MMA": True,
        "BH": 16,
        "num_warps": 4,
        "RT": 2,
        "S": 2,
        "SK": 4,
        "FENCE": True,
        "EARLY": 0,
        "MAXNREG": 0,
    },  # mma-BH16w4r2s2k4-f
}
