"""The replay shard's server floor: the ReplayService servicer and its edge (the Insert path, the event-loop waits,
quotas, the writer's identity, metrics), the shard's settings and its main. It builds on the core, durability and
wire.py, and never imports the client floor (tests/unit/test_import_rules.py, REPLAY_FLOORS).

Empty on purpose: importing the package loads none of its modules.
"""
