"""Tables on a terminal fit the window; piped (CI logs) they keep every column."""

import io
from collections import Counter
from pathlib import Path

from rich.console import Console

from ternlab.fleet.runner import FleetResult
from ternlab.fleet.view import FleetView
from ternlab.pipeline.report import summary_table
from ternlab.term import print_table

SUMMARY = {"expected_from": "ledger", "verdict": {"ok": True, "reasons": []},
           "per_qos": {"1": {"expected": 123456, "received": 123456, "unique": 123456, "lost": 0,
                             "duplicated": 0, "reordered": 3, "latency_p50_ms": 1234.5,
                             "latency_p95_ms": 2345.6, "latency_p99_ms": 3456.7}},
           "totals": {"expected": 123456, "received": 123456, "unique": 123456, "lost": 0,
                      "duplicated": 0, "reordered": 3}}
HEADER = "┃ QoS ┃ expected ┃ received ┃ unique ┃ lost ┃ dup ┃ reord ┃ p50 ms ┃ p95 ms ┃ p99 ms ┃"


def test_piped_table_keeps_every_column_and_a_terminal_fits_it():
    piped = Console(file=io.StringIO(), width=60)  # not a terminal: rich would cut to 60 columns
    print_table(piped, summary_table(SUMMARY))
    text = piped.file.getvalue()
    assert HEADER in text and "123456" in text and "3456.7" in text and "…" not in text
    assert piped.width == 60  # the console is left as it was
    tty = Console(file=io.StringIO(), width=60, force_terminal=True, color_system=None)
    print_table(tty, summary_table(SUMMARY))
    assert max(len(ln) for ln in tty.file.getvalue().splitlines()) <= 60


def test_the_fleet_summary_table_keeps_every_column_when_piped(tmp_path):
    board = {"boots": 3, "published": 123456, "acked": 123450, "received": 123456, "lost": 0,
             "power_cuts": 12, "network_cuts": 34}
    result = FleetResult(ok=True, seed=1, failures=[], replay=None, out=Path(tmp_path), boards={"board-000": board},
                         ledger_rows=123456, lost=[], duplicates=Counter(), faults=[], elapsed=1.0)
    console = Console(file=io.StringIO(), width=50, highlight=False)
    FleetView(console, live=False).summary(result, 1.0)
    text = console.file.getvalue()
    assert "┃ board     ┃ boots ┃ published ┃  acked ┃ received ┃ lost ┃ pwr cut ┃ net cut ┃" in text
    assert "│ board-000 │     3 │    123456 │ 123450 │   123456 │    0 │      12 │      34 │" in text
