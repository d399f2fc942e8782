"""Generated protobuf and gRPC modules for the apexrl wire format (source: protos/apexrl/proto/*.proto).

Regenerate with `python protos/generate.py`. Only servicers and clients import these modules.
"""
