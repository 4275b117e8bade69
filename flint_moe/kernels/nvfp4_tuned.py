"""Launch configurations of the NVFP4 decode kernels chosen on the H200 (issue 4).

Written by ``benchmarks/bench_decode_nvfp4.py --tune --write-tuned`` (docs/kernels/nvfp4-decode.md, round 5):
the fastest measured gate/up and down configurations at DeepSeek-V3 M=1 among the CUDA-core path and the
tensor-core path (``MMA``), each checked bit-for-bit against its own path's other variants and against the
golden model before it is chosen. ``nvfp4_gate_up.GATE_UP_CONFIG`` / ``nvfp4_down.DOWN_CONFIG`` are their
module defaults updated with these dicts. Edit only through the tuning run (or by hand with a new
measurement in the notebook).
"""

#: Gate/up: CUDA-core path, BN 8 / 2 warps (round 2 default; round 4: the tensor-core variants were not faster
#: at DeepSeek-V3 M=1).
GATE_UP = {"MMA": False, "BN": 8, "num_warps": 2}
#: Down: tensor-core path, BH 16 / 1 warp, RT 2, S 4 (round 4: 28.3 vs 37.1 us at DeepSeek-V3 M=1).
DOWN = {"MMA": True, "BH": 16, "num_warps": 1, "RT": 2, "S": 4, "SK": 1, "LATE": False}
#: Best measured configuration of each path (the GPU tests run both paths on every shape of the matrix).
GATE_UP_CUDA_CORE = {"MMA": False, "BN": 8, "num_warps": 2}
GATE_UP_MMA = {"MMA": True, "BN": 16, "num_warps": 2, "RT": 2, "S": 4}
DOWN_CUDA_CORE = {"MMA": False, "BH": 16, "num_warps": 4, "PREFETCH": True}
DOWN_MMA = DOWN
#: Per-shape overrides ((H, I) -> keys replacing GATE_UP's / DOWN's at that shape; never MMA): none yet.
GATE_UP_BY_SHAPE: dict = {}
DOWN_BY_SHAPE: dict = {}
