"""Launch configurations of the NVFP4 decode kernels chosen on the H200 (issue 4).

Written by ``benchmarks/bench_decode_nvfp4.py --tune --write-tuned`` (docs/kernels/nvfp4-decode.md, round
5): ``GATE_UP`` / ``DOWN`` are the gate/up with the least gate/up + down time and the down with the least
down time at DeepSeek-V3 M=1 among the CUDA-core and tensor-core (``MMA``) candidates, each checked
against the golden model first; ``*_CUDA_CORE`` / ``*_MMA`` the best of each path (tests run both).
Measured 2026-11-29 20:43 UTC: gate/up + down 71.7 us, down
alone 26.0 us (copy 4.176 TB/s).
"""

GATE_UP = {'MMA': True, 'BN': 8, 'num_warps': 4, 'RT': 2, 'S': 4, 'SK': 4}
DOWN = {'MMA': True, 'BH': 16, 'num_warps': 1, 'RT': 2, 'S': 4}
GATE_UP_CUDA_CORE = {'MMA': False, 'BN': 8, 'num_warps': 2}
GATE_UP_MMA = {'MMA': True, 'BN': 8, 'num_warps': 4, 'RT': 2, 'S': 4, 'SK': 4}
DOWN_CUDA_CORE = {'MMA': False, 'BH': 16, 'num_warps': 4, 'PREFETCH': True}
DOWN_MMA = {'MMA': True, 'BH': 16, 'num_warps': 1, 'RT': 2, 'S': 4}
