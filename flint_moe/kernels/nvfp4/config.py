"""Launch configurations of the NVFP4 decode kernels (``nvfp4_gate_up``, ``nvfp4_down``): what may vary, and
its checks.

Callers keep passing plain dicts (``GATE_UP_CONFIG`` / ``DOWN_CONFIG``, ``default_config(H, I)``,
``nvfp4.tuned``, ``config=`` of the launchers); the launchers turn the merged dict into a frozen
``GateUpConfig`` / ``DownConfig`` with ``from_dict`` (unknown keys and out-of-range values raise
``ValueError`` naming the key), and take the K-split and warps they run from ``mma_launch``.

Keys (dataclass fields of the same name):

- ``MMA``: the tensor-core path (``nvfp4.mma``: no block regrouping, ``FP32_TRUNCATE`` bound) instead of the
  CUDA-core path (``nvfp4.cuda_core``: block model B = 16). The only key that selects the summation model.
- ``BN`` (gate/up: intermediate columns per program, a divisor of 64) / ``BH`` (down: hidden rows per
  program, a power of two), ``num_warps``.
- ``BKB`` (CUDA-core path): code bytes of a row per K step, a power of two >= 32; fixes the summation order.
- ``RT``, ``S`` (tensor-core path): rows per thread and 64-byte sub-steps per inline-PTX call, one of
  ``nvfp4.mma.MMA_SHAPES``; ``SK``: K-parts summed by different warps (a power of two dividing ``num_warps``;
  rows per program * SK = 8 * num_warps * RT); changes bits within the path. ``FENCE``: all code / scale
  loads of a call issued before its first decode (scheduling only).
- Down only, tensor-core path: ``EARLY`` (``Early``: the first call's weights read into registers before
  ``griddepcontrol.wait``; scheduling only) and ``MAXNREG`` (register cap per thread for ptxas, 0 = none).
  The CUDA-core path ignores ``RT``, ``S``, ``SK``, ``FENCE``, ``EARLY`` and ``MAXNREG``.

Launch variants that lost their measurements were removed (docs/kernels/nvfp4-decode.md, "Removed launch
variants"); their keys are refused with that reference.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields

__all__ = ["Early", "GateUpConfig", "DownConfig", "check_shape_overrides", "REMOVED_KEYS"]

#: Keys of launch variants that lost their measurements (docs/kernels/nvfp4-decode.md).
REMOVED_KEYS = frozenset({"ASM", "DECODE", "PREFETCH", "WORDS", "SPLIT", "COMBINE", "LATE", "PF", "L2PF", "RB"})


class Early(enum.IntEnum):
    """When the tensor-core down kernel reads its first call's weights (``nvfp4.mma.mma_gemv`` ``EARLY``)."""

    AFTER_WAIT = 0  #: everything after ``griddepcontrol.wait``
    REGISTERS = 1  #: the first call's codes and scales into registers before the wait


def _fields_from(cls, d: dict, name: str) -> dict:
    known = {f.name for f in fields(cls)}
    removed = sorted(set(d) & REMOVED_KEYS)
    if removed:
        raise ValueError(
            f"{name}: config keys {removed} belong to removed launch variants (docs/kernels/nvfp4-decode.md)"
        )
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{name}: unknown config keys {unknown} (known: {sorted(known)})")
    missing = sorted(known - set(d))
    if missing:
        raise ValueError(f"{name}: config keys {missing} missing")
    return dict(d)


def _pow2(v: int) -> bool:
    return v > 0 and not v & (v - 1)


def _check_common(cfg) -> None:
    if cfg.BKB < 32 or not _pow2(cfg.BKB):
        raise ValueError(f"config BKB: {cfg.BKB} must be a power of two >= 32")
    if cfg.num_warps <= 0:
        raise ValueError(f"config num_warps: {cfg.num_warps} must be >= 1")


def _check_mma_shape(cfg, rows: int, key: str) -> None:
    from flint_moe.kernels.nvfp4.mma import MMA_SHAPES

    if (cfg.RT, cfg.S) not in MMA_SHAPES:
        raise ValueError(f"config (RT, S) = ({cfg.RT}, {cfg.S}): must be one of {MMA_SHAPES} with MMA")
    if not _pow2(cfg.SK) or cfg.num_warps % cfg.SK:
        raise ValueError(f"config SK: {cfg.SK} must be a power of two dividing num_warps = {cfg.num_warps}")
    if rows * cfg.SK != 8 * cfg.num_warps * cfg.RT:
        raise ValueError(
            f"config {key}: with MMA, {'2 * BN' if key == 'BN' else 'BH'} * SK = {rows * cfg.SK} must equal "
            f"8 * num_warps * RT = {8 * cfg.num_warps * cfg.RT}"
        )


def _mma_launch(sk: int, num_warps: int, kbytes: int) -> tuple[int, int]:
    from flint_moe.kernels.nvfp4.mma import mma_part_bytes

    while sk > 1 and kbytes - (sk - 1) * mma_part_bytes(kbytes, sk) <= 0:
        sk, num_warps = sk // 2, num_warps // 2
    return sk, num_warps


@dataclass(frozen=True)
class _PathConfig:
    """The keys both decode kernels take (module docstring); ``GateUpConfig`` / ``DownConfig`` add their own
    keys (rows per program first) and checks."""

    MMA: bool
    BKB: int
    num_warps: int
    RT: int
    S: int
    SK: int
    FENCE: bool

    @staticmethod
    def _common(v: dict) -> dict:
        """The shared keys of a checked dict (``_fields_from``) as the dataclass types."""
        return {"MMA": bool(v["MMA"]), "BKB": int(v["BKB"]), "num_warps": int(v["num_warps"]), "RT": int(v["RT"]),
                "S": int(v["S"]), "SK": int(v["SK"]), "FENCE": bool(v["FENCE"])}  # fmt: skip

    def as_dict(self) -> dict:
        return asdict(self)

    def mma_launch(self, K: int) -> tuple[int, int]:
        """(SK, num_warps) the tensor-core launch runs at reduction length ``K`` (gate/up: the hidden size H;
        down: the valid intermediate size I; K / 2 code bytes per row): a shape where SK parts would leave the
        last one empty runs with SK / 2 on num_warps / 2 warps (same rows per program), halved again until it
        is not; a function of the shape only, never of the token count. The CUDA-core path: (1, num_warps)."""
        if not self.MMA:
            return 1, self.num_warps
        return _mma_launch(self.SK, self.num_warps, K // 2)


@dataclass(frozen=True)
class GateUpConfig(_PathConfig):
    """Launch configuration of ``nvfp4_gate_up`` (module docstring for the keys). ``ValueError`` on a value
    out of range."""

    BN: int

    def __post_init__(self) -> None:
        if self.BN <= 0 or 64 % self.BN:
            raise ValueError(f"config BN: {self.BN} must divide 64")
        _check_common(self)
        if self.MMA:
            _check_mma_shape(self, 2 * self.BN, "BN")

    @classmethod
    def from_dict(cls, d: dict, name: str = "nvfp4_gate_up") -> GateUpConfig:
        """The configuration of dict ``d`` (every key of the dataclass, nothing else)."""
        v = _fields_from(cls, d, name)
        return cls(**cls._common(v), BN=int(v["BN"]))


@dataclass(frozen=True)
class DownConfig(_PathConfig):
    """Launch configuration of ``nvfp4_down`` (module docstring for the keys). ``ValueError`` on a value out
    of range."""

    BH: int
    EARLY: Early
    MAXNREG: int

    def __post_init__(self) -> None:
        if not _pow2(self.BH):
            raise ValueError(f"config BH: {self.BH} must be a power of two")
        _check_common(self)
        if self.MAXNREG and not 24 <= self.MAXNREG <= 255:
            raise ValueError(f"config MAXNREG: {self.MAXNREG} must be 0 (none) or in [24, 255]")
        if self.MMA:
            _check_mma_shape(self, self.BH, "BH")

    @classmethod
    def from_dict(cls, d: dict, name: str = "nvfp4_down") -> DownConfig:
        """The configuration of dict ``d`` (every key of the dataclass, nothing else); ``EARLY`` an ``Early``
        or its value."""
        v = _fields_from(cls, d, name)
        try:
            early = Early(int(v["EARLY"]))
        except ValueError:
            raise ValueError(f"config EARLY: {v['EARLY']!r} must be one of {[int(e) for e in Early]}") from None
        return cls(**cls._common(v), BH=int(v["BH"]), EARLY=early, MAXNREG=int(v["MAXNREG"]))

    @property
    def early(self) -> Early:
        """``EARLY`` as launched: ``AFTER_WAIT`` on the CUDA-core path."""
        return self.EARLY if self.MMA else Early.AFTER_WAIT

    @property
    def maxnreg(self) -> int:
        """``MAXNREG`` as launched: 0 (none) on the CUDA-core path."""
        return self.MAXNREG if self.MMA else 0


def check_shape_overrides(base: dict, by_shape: dict, name: str) -> None:
    """Per-shape tuned overrides ((H, I) -> dict) may change the launch configuration only, never the path
    (``MMA``): ``accumulation_model(config)`` must not depend on the shape. ``ValueError`` otherwise."""
    for shape, over in by_shape.items():
        if set(over) - set(base):
            raise ValueError(f"{name}[{shape}]: unknown config keys {sorted(set(over) - set(base))}")
        if bool(over.get("MMA", base["MMA"])) != bool(base["MMA"]):
            raise ValueError(f"{name}[{shape}]: may not change MMA (the accumulation path) from the default")
