"""Tern's data pipeline on Apache Spark (PySpark).

Modules:
- ``schema``   -- the landing, quarantine and ledger schemas, and ``parse_payload`` for collectors;
- ``session``  -- the Java check and the SparkSession builder, plus small Hadoop-filesystem helpers;
- ``audit``    -- delivery audit (expected / lost / duplicated / reordered / latency) and its verdict;
- ``rollup``   -- per device and time window statistics of each reading, batch or Structured Streaming;
- ``report``   -- an HTML page with matplotlib plots and the rich terminal summary;
- ``generate`` -- a seeded synthetic landing set (and ledger) with known injected faults;
- ``cli``      -- the ``audit``, ``rollup`` and ``report`` subcommands of ``tern``.

Importing this package does not import PySpark; the job modules do.
"""
