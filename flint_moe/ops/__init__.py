"""Public ops (docs/CONTRACTS.md, "Issue 4"): ``route`` (owner E), ``flint_moe`` (owner F),
``flint_moe_bf16_decode`` (owner G).

Each owner imports their own names below; an op module that is missing or fails to import does not break
the others (its names are simply absent).
"""

from __future__ import annotations

import importlib

__all__: list[str] = []


def _reexport(module: str, names: tuple[str, ...]) -> None:
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ImportError:  # an op module of another owner that has not landed yet
        return
    for name in names:
        globals()[name] = getattr(mod, name)
        __all__.append(name)


# owner E
_reexport("route", ("ROUTE_GEMV_MAX_TOKENS", "make_route_counter", "route"))
# owner F
_reexport("moe_nvfp4", ("DECODE_MAX_TOKENS", "flint_moe"))
# owner G
_reexport("moe_bf16", ("DECODE_BF16_MAX_TOKENS", "flint_moe_bf16_decode"))
