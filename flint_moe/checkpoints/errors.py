"""``CheckpointError``: a checkpoint file that does not hold what its format requires."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["CheckpointError", "read_json_object", "reraise_in"]


class CheckpointError(ValueError):
    """A malformed or inconsistent checkpoint, or checkpoint tensor names that break the naming rules.

    Attributes: ``path`` (str: the file, or the checkpoint directory when no one file is at fault; None for
    tensors handed over in memory, e.g. to a module's ``load_weights``), ``tensor`` (the tensor name or config
    key concerned; None for a fault of the file as a whole), ``what`` (the violated constraint). Message:
    ``"<tensor> in <path>: <what>"``, without either part ``"<path>: <what>"`` / ``"<tensor>: <what>"``.
    """

    def __init__(self, path: str | Path | None, tensor: str | None, what: str) -> None:
        self.path, self.tensor, self.what = None if path is None else str(path), tensor, what
        where = " in ".join(x for x in (tensor, self.path) if x)
        super().__init__(f"{where}: {what}" if where else what)


@contextmanager
def reraise_in(path: str | Path, tensor: str | None = None, named: str | None = None) -> Iterator[None]:
    """Re-raise errors of the block as ``CheckpointError`` located in ``path``.

    A CheckpointError without a path gets ``path`` (and ``tensor`` in place of its own, if given); one with a
    path passes unchanged. Another ValueError / TypeError becomes ``CheckpointError(path, tensor, message)``, a leading
    ``"<named>: "`` (default ``tensor``) of its message dropped, since the new message names the tensor itself.
    """
    try:
        yield
    except CheckpointError as exc:
        if exc.path is not None:
            raise
        raise CheckpointError(path, tensor or exc.tensor, exc.what) from exc
    except (ValueError, TypeError) as exc:
        msg, lead = str(exc), f"{tensor if named is None else named}: "
        if tensor is not None or named is not None:
            msg = msg[len(lead) :] if msg.startswith(lead) else msg
        raise CheckpointError(path, tensor, msg) from exc


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path`` (UTF-8). CheckpointError naming the file if it is not valid JSON, repeats a
    key within an object, or is not an object at the top level; OSError if it cannot be read."""
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=_unique_keys)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a repeated key
        raise CheckpointError(path, None, f"not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CheckpointError(path, None, f"expected a JSON object at the top level, got {type(obj).__name__}")
    return obj
