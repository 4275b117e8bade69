"""Judging one run against the golden model: result types and verdicts (``results``), element-wise metrics
(``metrics``), the stage-by-stage teacher-forced checks (``stages``), the end-to-end tracing (``explain``), the
black-box comparison (``blackbox``), invariances (``invariance``), the fault catalogue (``faults``) and the
mutation self-test (``mutation``)."""
