"""A replay shard's durability, beside the table and below the edge: snapshot.py (a consistent copy taken while the
table serves), table_hooks.py (the table's snapshot, restore and log-replay hooks), checkpoint.py (the file format),
checkpointer.py (the checkpoint directory), restore_checks.py (what a restore checks before trusting a file), wal.py
(the write-ahead log), reshard.py (`apexrl replay-reshard`: M checkpoints onto N shards), durability_metrics.py.
Nothing here imports gRPC or the wire.

Empty on purpose: importing the package loads none of its modules.
"""
