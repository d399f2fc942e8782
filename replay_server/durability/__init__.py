"""A replay shard's durability, above the table and below the edge; it reaches the table only through its public
interface (listeners, state, load_state, insert_at: table_state.py): snapshot.py (a consistent copy taken while the
table serves), checkpoint.py (the file format),
checkpointer.py (the checkpoint directory), restore_checks.py (what a restore checks before trusting a file), wal.py
(the write-ahead log), reshard.py (`apexrl replay-reshard`: M checkpoints onto N shards), durability_metrics.py.
Nothing here imports gRPC or the wire.

Empty on purpose: importing the package loads none of its modules.
"""
