"""Tern's data pipeline: a collector that lands telemetry, and Apache Spark (PySpark) jobs over it.

Modules:
- ``schema``   -- the landing, quarantine and ledger schemas, and ``parse_payload`` for collectors;
- ``landing``  -- durable landing files (temp file, fsync, rename), the collector's only way to disk, and
  its own state directory (the QoS 2 window log);
- ``qos2``     -- what makes two QoS 2 copies the same message: one identity rule, and the record's format;
- ``collect``  -- the collector of ``tern collect``: a shared subscription landed as Parquet, acked after fsync;
- ``batch``    -- what a collector holds and has not made durable yet, as the writer's column lists;
- ``retire``   -- ``tern collect --retire``: when the broker has nothing more, and ending the session;
- ``collect_cli`` -- ``tern collect``'s options (the broker flags of ``tern pub``/``sub``) and the command;
- ``spark``    -- the Java check, the SparkSession builder and SparkJob (a command's session, its log
  file), plus small Hadoop-filesystem helpers;
- ``audit``    -- delivery audit (expected / lost / duplicated / reordered / latency);
- ``judge``    -- the one judge of delivery: the message key, the landing read back without Spark, the
  pass rule (used by the audit, the fleet and the demo);
- ``rollup``   -- per device and time window statistics of each reading, batch or Structured Streaming;
- ``report``   -- an HTML page (``templates/``) with inline plots and the rich terminal summary;
- ``losses``   -- the report's rules: where a message was lost, the fault that overlapped its flight, every
  fault's outcome and spans, each reboot explained (plain Python);
- ``inputs``   -- what a folder given to a pipeline command is, said in one line before Spark starts;
- ``generate`` -- a seeded synthetic landing set (and ledger) with known injected faults;
- ``cli``      -- the ``collect``, ``audit``, ``rollup`` and ``report`` subcommands of ``tern``.

Importing this package does not import PySpark; the Spark job modules do.
"""
