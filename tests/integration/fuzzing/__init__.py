"""Helpers of tests/integration/test_fuzz_rpcs.py: raw-bytes gRPC calls and the status tally (raw.py), hypothesis
mutations of bytes and protobuf fields (mutations.py), and for each service the fuzzed requests plus an oracle of
what every answer may be and may change (replay.py, params.py)."""
