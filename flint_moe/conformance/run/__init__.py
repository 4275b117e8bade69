"""Running cases: kernel paths (``paths``), one case with taps and its judgement (``runner``), worker processes
(``parallel``), shards (``shard``) and the ``--out`` guard and staging (``outdir``)."""
