"""Report files and report tools: report.json and summary.md (``report``, ``summary``), report.html (``html``),
mismatch maps (``maps``), report.json validation (``schema``), ``--baseline`` diffs (``baseline``), the source
digest and GPU-report freshness (``digest``, standard library only) and shard merging (``merge``)."""
