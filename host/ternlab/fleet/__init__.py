"""Fleets of emulated boards under seeded fault scenarios (see runner.py for how a run goes).

    from ternlab.fleet import Fleet, load_scenario
    result = Fleet(load_scenario("scenarios/smoke.toml"), seed=1, out="fleet-out").run()
    assert result.ok, result.failures
"""

from .runner import Callbacks, ExternalBroker, FaultRecord, Fleet, FleetResult
from .scenario import FaultSpec, Scenario, ScenarioError, load_scenario, parse_scenario
from .schedule import Fault, make_schedule

__all__ = ["Callbacks", "ExternalBroker", "FaultRecord", "Fleet", "FleetResult", "FaultSpec", "Scenario", "ScenarioError",
           "load_scenario", "parse_scenario", "Fault", "make_schedule"]
