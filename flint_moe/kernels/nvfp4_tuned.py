"""Launch configurations of the NVFP4 decode kernels chosen on the H200 (issue 4).

Written by ``benchmarks/bench_decode_nvfp4.py --tune --write-tuned`` (docs/kernels/nvfp4-decode.md, round
6): ``GATE_UP`` / ``DOWN`` are the pair with the least gate/up + down time at DeepSeek-V3 M=1 among the
CUDA-core and tensor-core (``MMA``) candidates, each checked against the golden model first;
``*_BY_SHAPE[(H, I)]`` the pair of another measured model where it differs (same paths: a shape never
changes ``MMA``); ``*_CUDA_CORE`` / ``*_MMA`` the best of each path at DeepSeek-V3 (tests run both).
Measured 2026-11-29 22:54 UTC: DeepSeek-V3 M=1 gate/up + down 71.0 us
(copy 4.163 TB/s).
"""

GATE_UP = {
    "MMA": True,
    "BN": 8,
    "num_warps": 4,
    "RT": 2,
    "S": 2,
    "SK": 4,
    "LATE": False,
    "PF": False,
    "L2PF": 0,
    "FENCE": True,
}  # mma-BN8w4r2s2k4-f
DOWN = {
    "MMA": True,
    "BH": 16,
    "num_warps": 1,
    "RT": 2,
    "S": 4,
    "SK": 1,
    "LATE": False,
    "PF": False,
    "L2PF": 0,
    "FENCE": False,
}  # mma-BH16w1r2s4
GATE_UP_CUDA_CORE = {"MMA": False, "BN": 8, "num_warps": 2, "BKB": 512, "PREFETCH": False, "WORDS": False}  # cc-BN8w2
GATE_UP_MMA = {
    "MMA": True,
    "BN": 8,
    "num_warps": 4,
    "RT": 2,
    "S": 2,
    "SK": 4,
    "LATE": False,
    "PF": False,
    "L2PF": 0,
    "FENCE": True,
}  # mma-BN8w4r2s2k4-f
DOWN_CUDA_CORE = {"MMA": False, "BH": 16, "num_warps": 4, "BKB": 512, "PREFETCH": True, "WORDS": False}  # cc-BH16w4
DOWN_MMA = {
    "MMA": True,
    "BH": 16,
    "num_warps": 1,
    "RT": 2,
    "S": 4,
    "SK": 1,
    "LATE": False,
    "PF": False,
    "L2PF": 0,
    "FENCE": False,
}  # mma-BH16w1r2s4
#: Per-shape overrides ((H, I) -> keys replacing GATE_UP's / DOWN's at that shape; never MMA).
GATE_UP_BY_SHAPE: dict = {
    (2048, 768): {
        "MMA": True,
        "BN": 16,
        "num_warps": 2,
        "RT": 2,
        "S": 4,
        "SK": 1,
        "LATE": False,
        "PF": False,
        "L2PF": 0,
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
        "LATE": False,
        "PF": False,
        "L2PF": 0,
        "FENCE": True,
    },  # mma-BH16w2r2s4k2-f
    (2880, 2880): {
        "MMA": True,
        "BH": 16,
        "num_warps": 4,
        "RT": 2,
        "S": 2,
        "SK": 4,
        "LATE": False,
        "PF": False,
        "L2PF": 0,
        "FENCE": True,
    },  # mma-BH16w4r2s2k4-f
}
