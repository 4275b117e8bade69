"""Routing control of a conformance case (``Case.route``): router weights and token channels chosen so that the
golden model's own routing (rule steps 1-2, never bypassed) selects the requested experts.

Route specifications (canonical form, as in the case id segment ``/r-<route>``; the command line also takes the
``=`` / ``,`` / ``@`` spelling on the right):

- ``experts-5-7`` (``experts=5,7``): every token's first slots are these experts, in this order; the other
  ``k - n`` slots are routed as the data profile would (n <= k, distinct ids < E).
- ``last`` / ``last-3`` (``last``, ``last=3``): the last N experts (N = k when not given) take every token's
  first N slots, highest id first (E-1, E-2, ...).
- ``count-128-5`` (``count=128@5``): exactly the first 128 tokens send a slot (their first) to expert 5; no
  other token selects it (128 <= M; needs k < E).

How (:func:`apply_route`): the first ``s = max(1, H // 8)`` hidden channels form a steering block. Tokens get
``|x| + 1`` there (``-(|x| + 1)`` for the tokens of ``count`` that must avoid the expert); every router row is
zero on the block except the forced experts', which hold ``level_j / s`` with ``level_j = 16 (n - j) + 16`` for
the j-th listed expert; the other router entries are scaled by 0.1. A forced expert's logit is then at least
``level_j`` (the block's mean |x| + 1 >= 1) plus a rest of standard deviation ~0.2 (gaussian tokens), so the
forced experts lead in order by >= 16 - a few tenths, and a ``count`` expert trails every other expert by as
much. Profiles that shape the routing themselves (``tied_logits``, ``skewed_routing``, ``tiny_sigmoids``,
``subnormal_tokens``) do not combine with a route (ValueError).
"""

from __future__ import annotations

import re

import torch

__all__ = ["ROUTE_EXCLUSIVE_PROFILES", "parse_route", "check_route", "route_plan", "apply_route"]

#: Data profiles that set the routing themselves (a route on top would undo what they test).
ROUTE_EXCLUSIVE_PROFILES = ("tied_logits", "skewed_routing", "tiny_sigmoids", "subnormal_tokens")

_CANON = re.compile(r"^(?:experts(?:-\d+)+|last(?:-\d+)?|count-\d+-\d+)$")
_CLI = re.compile(r"^(?P<kind>experts|last|count)(?:\s*=\s*(?P<args>[\d,@\s]+))?$")


def parse_route(text: str) -> str:
    """Canonical route of ``text`` (either spelling, see the module docstring): ``"experts=5,7"`` ->
    ``"experts-5-7"``, ``"last=3"`` -> ``"last-3"``, ``"count=128@5"`` -> ``"count-128-5"``. Raises ValueError
    naming the text and the accepted forms."""
    t = text.strip()
    if _CANON.match(t):
        return t
    m = _CLI.match(t)
    nums = [] if m is None or m["args"] is None else [a for a in re.split(r"[,@\s]+", m["args"].strip()) if a]
    ok = m is not None and (
        (m["kind"] == "experts" and len(nums) >= 1)
        or (m["kind"] == "last" and len(nums) <= 1)
        or (m["kind"] == "count" and len(nums) == 2)
    )
    if not ok:
        raise ValueError(
            f"route {text!r}: expected experts=E1[,E2...] (these experts lead every token), last[=N] (the last N "
            "experts, N = top_k by default), or count=N@E (exactly the first N tokens go to expert E)"
        )
    return "-".join([m["kind"], *(str(int(n)) for n in nums)])


def route_plan(route: str, E: int, k: int, M: int) -> tuple[list[int], int]:  # noqa: N803
    """(forced experts in slot order, number of tokens that select them: M except for ``count``) of the
    canonical ``route`` on a layer of E experts, top_k k, M tokens; checked by :func:`check_route`."""
    check_route(route, E, k, M)
    kind, *nums = route.split("-")
    args = [int(n) for n in nums]
    if kind == "experts":
        return args, M
    if kind == "last":
        n = args[0] if args else k
        return list(range(E - 1, E - 1 - n, -1)), M
    return [args[1]], args[0]


def check_route(route: str, E: int, k: int, M: int) -> None:  # noqa: N803
    """Raise ValueError (naming the route and the violated constraint) unless the canonical ``route`` can be
    forced on E experts with top_k k and M tokens."""
    if not isinstance(route, str) or not _CANON.match(route):
        raise ValueError(f"route {route!r}: not a canonical route (experts-5-7, last, last-3, count-128-5)")
    kind, *nums = route.split("-")
    args = [int(n) for n in nums]
    if kind == "experts":
        if len(set(args)) != len(args) or len(args) > k or max(args) >= E:
            raise ValueError(f"route {route!r}: needs at most top_k = {k} distinct expert ids below E = {E}")
    elif kind == "last":
        if args and not 1 <= args[0] <= k:
            raise ValueError(f"route {route!r}: N must be in [1, top_k = {k}]")
    else:
        n, e = args
        if not 1 <= n <= M or e >= E or k >= E:
            raise ValueError(f"route {route!r}: needs 1 <= N <= M = {M}, expert < E = {E} and top_k = {k} < E")


def apply_route(route: str, x: torch.Tensor, router: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Steer ``x`` fp32 [M, H] and ``router`` fp32 [E, H] (new tensors returned, both still to be rounded to
    bf16 by the caller) so that the golden routing follows the canonical ``route`` (module docstring).
    Returns (x, router, notes) with notes ``{"route": route, "forced_experts": [...], "forced_tokens": N,
    "steer_channels": s}``. Raises ValueError for a route the sizes cannot hold."""
    M, H = x.shape
    E = router.shape[0]
    forced, n_tok = route_plan(route, E, k, M)
    s = max(1, H // 8)
    x, router = x.clone(), router * 0.1
    block = x[:, :s].abs() + 1.0
    if n_tok < M:
        block[n_tok:] = -block[n_tok:]
    x[:, :s] = block
    router[:, :s] = 0.0
    n = len(forced)
    for j, e in enumerate(forced):
        router[e, :s] = (16.0 * (n - j) + 16.0) / s
    notes = {"route": route, "forced_experts": forced, "forced_tokens": n_tok, "steer_channels": s}
    return x, router, notes
