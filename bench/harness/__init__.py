"""What every benchmark here shares: timing loops and CPU accounting (`timing`), server child processes
(`processes`), the raw gRPC ceiling (`ceiling`, served by `ceiling_server`), result rows and their table
(`results`), and progress lines, metadata and JSON output (`report`).

Nothing is imported here: the cpprb worker imports `harness.timing` under an interpreter that has only numpy.
"""
