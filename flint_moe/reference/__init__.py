"""Golden model of the Flint MoE numerics rule (docs/numerics.md). Imports torch and numpy only.

Modules: ``formats`` (bit-level bf16 / E2M1 / E4M3), ``weights`` (checkpoint-layout containers), ``quantize``
(ModelOpt NVFP4 recipe), ``pertoken`` (the per-token NVFP4 quantizer), ``mufu`` (bit-exact PTX special
functions), ``mma`` (bit-exact H200 tensor-core k16 step), ``exact`` (exact long reductions and their certified
bounds; ``exact_sum`` and ``accumulation`` behind it), ``routing`` (steps 1-4), ``experts`` (steps 5-8),
``pertoken_experts`` (per-token NVFP4 x NVFP4 experts, steps P6-P12), ``combine`` (steps 9-10),
``decode_block`` (step 11), ``model`` (end to end). The public names of each are re-exported here; ``layouts``
(independent decoders of the stored kernel layouts) is reachable as a module.
"""

from __future__ import annotations

import sys

from . import (  # noqa: F401
    combine,
    decode_block,
    exact,
    experts,
    formats,
    layouts,
    mma,
    model,
    mufu,
    pertoken,
    pertoken_experts,
    quantize,
    routing,
    weights,
)
from .combine import *  # noqa: F403
from .decode_block import *  # noqa: F403
from .exact import *  # noqa: F403
from .experts import *  # noqa: F403
from .formats import *  # noqa: F403
from .mma import *  # noqa: F403
from .model import *  # noqa: F403
from .mufu import *  # noqa: F403
from .pertoken import *  # noqa: F403
from .pertoken_experts import *  # noqa: F403
from .quantize import *  # noqa: F403
from .routing import *  # noqa: F403
from .weights import *  # noqa: F403

# ``combine`` is both a module and a function; after the star imports the name is the step-9 function.
_NAMES = (
    "formats weights quantize pertoken mufu mma exact routing experts pertoken_experts combine decode_block model"
).split()
_MODULES = tuple(sys.modules[f"{__name__}.{n}"] for n in _NAMES)
__all__ = [name for mod in _MODULES for name in mod.__all__]
