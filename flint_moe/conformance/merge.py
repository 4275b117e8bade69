"""``python -m flint_moe.conformance.merge DIR... --out DIR``: join the reports of a sharded run into one.

The command-line entry point only; the merge itself is :mod:`flint_moe.conformance.report.merge` (arguments,
refusals and exit status are documented there).
"""

from __future__ import annotations

import sys

from flint_moe.conformance.report.merge import main

if __name__ == "__main__":
    sys.exit(main())
