"""common/grpc_logs.py: gRPC's ExecuteBatchError record (a call whose client left while it was answered) becomes one
INFO line; every other gRPC record passes unchanged."""

from __future__ import annotations

import logging

from apexrl.common.grpc_logs import GRPC_AIO_LOGGER, PeerGoneFilter, quiet_peer_gone_errors

# What grpc.aio logs (server.pyx.pxi, _handle_exceptions), as seen in a shard's log at a fleet-wide SIGTERM.
GRPC_LINE = "ExecuteBatchError raised in core by servicer method [/apexrl.v1.ReplayService/Insert]"


def _raise_and_log(logger: logging.Logger, message: str) -> None:
    try:
        raise RuntimeError('Failed "execute_batch"')
    except RuntimeError:
        logger.exception(message)


def test_the_peer_gone_error_becomes_one_info_line_and_other_grpc_errors_pass(caplog):
    quiet_peer_gone_errors()
    grpc_logger = logging.getLogger(GRPC_AIO_LOGGER)
    with caplog.at_level(logging.INFO):
        _raise_and_log(grpc_logger, GRPC_LINE)
        _raise_and_log(
            grpc_logger, "Unexpected [ValueError] raised by servicer method [/apexrl.v1.ReplayService/Sample]"
        )
    records = [(r.name, r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert records == [
        (
            "apexrl.common.grpc_logs",
            "INFO",
            "a /apexrl.v1.ReplayService/Insert call ended while its answer was being sent (the caller went away, "
            "or this server is stopping)",
            False,
        ),
        (
            GRPC_AIO_LOGGER,
            "ERROR",
            "Unexpected [ValueError] raised by servicer method [/apexrl.v1.ReplayService/Sample]",
            True,
        ),
    ]


def test_the_filter_is_installed_once():
    quiet_peer_gone_errors()
    quiet_peer_gone_errors()
    assert sum(isinstance(f, PeerGoneFilter) for f in logging.getLogger(GRPC_AIO_LOGGER).filters) == 1
