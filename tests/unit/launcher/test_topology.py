"""Which roles each machine runs and how they find each other (launcher/topology.py, pure)."""

from __future__ import annotations

import pytest

from apexrl.launcher.fleet_config import ConfigError
from apexrl.launcher.fleet_file import parse_config
from apexrl.launcher.topology import address, roles_on, wiring
from tests.unit.launcher.fleets import error, fleet


def test_roles_per_host_and_global_actor_indices():
    config = parse_config(fleet())
    assert config.num_actors == 5
    on_m2 = roles_on(config, "m2")
    assert [(r.name, r.index, r.metrics_port) for r in on_m2] == [
        ("actor-0", 0, 9300),
        ("actor-1", 1, 9301),
        ("actor-2", 2, 9302),
    ]
    on_m1 = roles_on(config, "m1")
    assert [r.name for r in on_m1] == ["shard-0", "shard-1", "learner", "actor-3", "actor-4", "evaluator"]
    # The second group continues the indices; its metrics ports start again on its own host.
    assert [(r.index, r.metrics_port) for r in on_m1 if r.kind == "actor"] == [(3, 9300), (4, 9301)]
    with pytest.raises(ConfigError, match="no role of the fleet runs on host 'm3'.*m1, m2"):
        roles_on(config, "m3")


def test_wiring_uses_loopback_on_the_same_machine_and_host_addresses_across():
    config = parse_config(fleet())
    assert wiring(config, "m1").replay == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert wiring(config, "m1").params == "127.0.0.1:7100"
    assert wiring(config, "m2").replay == ("10.0.0.1:7000", "10.0.0.1:7001")
    assert wiring(config, "m2").params == "10.0.0.1:7100"
    # A host missing from [hosts] is reached by its name; a service bound to one interface is reached there.
    unnamed = parse_config(fleet(hosts={}))
    assert wiring(unnamed, "m2").params == "m1:7100"
    bound = parse_config(fleet(fleet={"bind": "10.0.0.1"}))
    assert address(bound, "m1", 7000, "m1") == "10.0.0.1:7000"


def test_duplicate_ports_on_one_host_are_refused_but_not_across_hosts():
    message = error(fleet(learner={"host": "m1", "port": 7000}))
    assert message == "port 7000 on host 'm1' is used by both shard-0 (port) and learner (port)"
    # actor-4 (m1, second group) takes 9301 from its range start 9300; the evaluator may not reuse it.
    assert "actor-4 (metrics_port) and evaluator (metrics_port)" in error(
        fleet(evaluator={"host": "m1", "metrics_port": 9301})
    )
    # The same numbers on different machines are fine (actor groups on m1 and m2 both start at 9300).
    parse_config(fleet())


def test_actor_indices_must_tile_without_overlap_or_gaps():
    overlap = fleet(actors=[{"host": "m2", "count": 3}, {"host": "m1", "count": 2, "first_index": 2}])
    assert "actor index 2 is also in [[actors]] #0" in error(overlap)
    gap = fleet(actors=[{"host": "m2", "count": 3, "first_index": 1}])
    assert "missing [0]" in error(gap)
