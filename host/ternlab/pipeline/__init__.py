"""Tern's data pipeline: a collector that lands telemetry, and Apache Spark (PySpark) jobs over it.

Modules:
- ``schema``   -- the landing, quarantine and ledger schemas, and ``parse_payload`` for collectors;
- ``landing``  -- durable landing files (temp file, fsync, rename), the collector's only way to disk;
- ``collect``  -- the collector of ``tern collect``: a shared subscription landed as Parquet, acked after fsync;
- ``collect_cli`` -- ``tern collect``'s options (the broker flags of ``tern pub``/``sub``) and the command;
- ``spark``    -- the Java check and the SparkSession builder, plus small Hadoop-filesystem helpers;
- ``audit``    -- delivery audit (expected / lost / duplicated / reordered / latency);
- ``judge``    -- the one judge of delivery: the message key, the landing read back without Spark, the
  pass rule (used by the audit, the fleet and the demo);
- ``rollup``   -- per device and time window statistics of each reading, batch or Structured Streaming;
- ``report``   -- an HTML page (``templates/``) with inline plots and the rich terminal summary;
- ``generate`` -- a seeded synthetic landing set (and ledger) with known injected faults;
- ``cli``      -- the ``collect``, ``audit``, ``rollup`` and ``report`` subcommands of ``tern``.

Importing this package does not import PySpark; the Spark job modules do.
"""
