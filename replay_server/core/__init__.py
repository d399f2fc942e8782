"""The replay shard's core floor: the pure data structures and the table (sum tree, rate limiter, key ring, column
storage, de-duplication, admission, the table and what it shows of itself to what persists it). numpy only: it
imports no other floor of the shard, neither grpc nor protobuf nor torch (tests/unit/test_import_rules.py,
REPLAY_FLOORS).

Empty on purpose: importing the package loads none of its modules.
"""
