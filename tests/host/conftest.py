"""Fixtures for the host-side suites: one small SparkSession for the whole run, and a generated
landing set (with ledger) that the audit and report tests share, and no password left registered
from one test's `tern` commands to the next."""

import pytest


@pytest.fixture(autouse=True)
def _forget_secrets():
    """Each test's `tern` commands start with no password registered: one run in the same process
    (tests call ternlab.cli.main) would mask pieces of it in another test's output."""
    from ternlab.mqttcli.redact import forget_secrets

    forget_secrets()
    yield


@pytest.fixture(scope="session")
def spark():
    """local[1], 2 shuffle partitions, no UI: small enough to share 2 cores with other work."""
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[1]").appName("tern-tests")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "1")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def fleet_set(spark, tmp_path_factory):
    """A seeded landing set with injected losses (heavier at QoS 0, so some fall at boot tails),
    duplicates and reorderings, plus its ledger and 3 quarantined payloads."""
    from ternlab.pipeline.generate import generate

    root = tmp_path_factory.mktemp("fleet")
    return generate(spark, str(root / "landing"), n_messages=2400, devices=3, boots=2,
                    qos_levels=(0, 1, 2), loss={0: 0.15, 1: 0.02, 2: 0.02}, dup=0.03,
                    reorder=0.04, seed=11, ledger=str(root / "ledger"), quarantine=3)


@pytest.fixture(scope="session")
def fleet_audit(spark, fleet_set, tmp_path_factory):
    """The audit of ``fleet_set`` without a ledger: (output dir, summary)."""
    from ternlab.pipeline.audit import run_audit

    out = str(tmp_path_factory.mktemp("audit") / "inferred")
    return out, run_audit(spark, fleet_set.landing, out)
