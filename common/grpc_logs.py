"""gRPC's own log lines that say less than they seem to, told in one line of ours.

grpc.aio's server logs an ERROR with a traceback when a batch of a call fails in gRPC core (`ExecuteBatchError`)
before it has noticed that the client closed the call: the failed write and the close arrive on its completion
queue in either order (grpc/grpc `server.pyx.pxi`, `_handle_exceptions`; the same failure after the close is
ignored). The call is over either way, and nothing is lost with it (an insert not acknowledged is resent; an
unanswered sample is the caller's to retry), so a fleet stopped all at once (pods sent SIGTERM together) logged a
traceback from a shard for a writer that left first. `quiet_peer_gone_errors` replaces those records with one INFO
line naming the method; every other gRPC record passes unchanged.
"""

from __future__ import annotations

import logging
import re

GRPC_AIO_LOGGER = "grpc._cython.cygrpc"
_PEER_GONE = re.compile(r"ExecuteBatchError raised in core by servicer method \[(?P<method>[^\]]*)\]")

log = logging.getLogger(__name__)


class PeerGoneFilter(logging.Filter):
    """Drops gRPC's ExecuteBatchError record (see the module docstring) and logs one INFO line in its place."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = _PEER_GONE.match(record.getMessage())
        if found is None:
            return True
        log.info(
            "a %s call ended while its answer was being sent (the caller went away, or this server is stopping)",
            found["method"],
        )
        return False


def quiet_peer_gone_errors() -> None:
    """Install the filter on gRPC's aio logger, once per process."""
    logger = logging.getLogger(GRPC_AIO_LOGGER)
    if not any(isinstance(f, PeerGoneFilter) for f in logger.filters):
        logger.addFilter(PeerGoneFilter())
