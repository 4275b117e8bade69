"""``python -m flint_moe.conformance.digest --check [REPORT]``: the freshness line of a committed GPU report.

The command-line entry point only (standard library, like the module it calls); the source digest and the
check are :mod:`flint_moe.conformance.report.digest` (options and exit status are documented there).
"""

from __future__ import annotations

import sys

from flint_moe.conformance.report.digest import main

if __name__ == "__main__":
    sys.exit(main())
