"""The conformance harness: every kernel path run with taps and judged against the golden model.

Rooms: ``inputs`` (cases and their data), ``run`` (kernel paths, the case runner, workers, shards, the
``--out`` guard), ``judge`` (results, metrics, stage checks, end-to-end tracing, black box, invariances,
faults, mutation self-test), ``report`` (report files, html, maps, baseline, digest, schema, merge). Entry
points: ``python -m flint_moe.conformance`` (``__main__``), ``python -m flint_moe.conformance.merge``,
``python -m flint_moe.conformance.digest`` and ``python -m flint_moe.conformance.audit``.
"""
