"""Certificates renewed on disk, taken up without a restart.

cert-manager, a Kubernetes Secret volume (which swaps its `..data` symlink to a new directory, so every file
changes at once) or a cron job renew a process's TLS files while it runs; gRPC fixes credentials when it builds
them. This module keeps them current (grpc_util.bind and grpc_util.make_channel use it for every TlsFiles read
from paths):

- Servers (every port `bind` opens: AioServerThread's and thread-pool servers'): gRPC asks a certificate fetcher
  before every TLS handshake. It stats the files (microseconds) and, when one changed, rereads and checks them
  (certificates.check) and hands gRPC the new certificate chain, key and CA bundle. Open connections keep what
  they were made with; the next connection gets the renewed files.
- Clients: a channel's credentials cannot change, so ReloadingChannel opens a new channel with the renewed files
  and starts every later call on it (it looks at most once a second); calls in flight finish on the previous
  channel, which is closed once none is left. A client whose CA bundle or own certificate was renewed thus
  reconnects with the new files, without being told.
- Renewed files that do not make a usable identity (unparsable, a key that is not the certificate's, a file
  missing: a renewal caught half way) are logged as an error once per state of the files, and the previous ones
  stay in use: never no TLS. The next change is tried again.
- A daemon thread looks at every watched set of files once a minute too, so that an idle server's or client's
  expiry gauge (`expiries`, exported as apexrl_tls_certificate_expiry_timestamp_seconds) follows renewals.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import grpc

from apexrl.common import certificates
from apexrl.common.tls import TlsFiles

log = logging.getLogger(__name__)

# How often the background thread looks at every watched set of files (the gauge's lag behind a renewal).
REFRESH_SECONDS = 60.0
# How often a client looks at its files, at the start of a call.
CLIENT_CHECK_SECONDS = 1.0

_FileState = tuple[tuple[str, tuple[int, int, int, int] | str], ...]


def _state(tls: TlsFiles) -> _FileState:
    """What a stat of each file says (through symlinks: a swapped link shows as another inode)."""
    found = []
    for path in tls.paths.values():
        try:
            st = os.stat(path)
            found.append((path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)))
        except OSError as err:
            found.append((path, err.strerror or str(err)))
    return tuple(found)


def _dates(expiry: dict[str, float]) -> str:
    return ", ".join(
        f"{name} expires {datetime.datetime.fromtimestamp(when, datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
        for name, when in expiry.items()
    )


class TlsWatch:
    """The newest usable version of a TlsFiles' files (see the module docstring). Thread-safe.

    `refresh()` stats the files and, when one changed, rereads and checks them; `snapshot()` is the files in use,
    how many renewals were taken (`version`) and when the certificates expire."""

    def __init__(self, tls: TlsFiles, who: str) -> None:
        self._who = who  # for log lines: "the server on 0.0.0.0:7000", "the channel to 10.0.0.1:7000"
        self._lock = threading.Lock()
        self._files, self._version, self._seen = tls, 0, _state(tls)
        try:
            self._expiry = certificates.check(tls)
        except ValueError as err:  # servers check before they get here; a client finds out at its handshakes
            log.error("TLS files of %s are not usable: %s", who, err)
            self._expiry = {}
        _watched.add(self)

    def snapshot(self) -> tuple[TlsFiles, int, dict[str, float]]:
        with self._lock:
            return self._files, self._version, dict(self._expiry)

    def refresh(self) -> bool:
        """Take the files as they are now when they changed since the last look and make a usable identity; True
        when that gave new contents."""
        state = _state(self._files)
        with self._lock:
            if state == self._seen:
                return False
            self._seen = state  # a broken state is reported once; the next change is tried again
            try:
                renewed = self._files.reread()
                expiry = certificates.check(renewed)
            except ValueError as err:
                log.error(
                    "TLS files of %s changed but are not usable; keeping the previous ones: %s",
                    self._who,
                    err,
                )
                return False
            if renewed == self._files:
                return False  # touched or rewritten with the same bytes
            self._files, self._version, self._expiry = renewed, self._version + 1, expiry
        log.info("TLS files of %s renewed (%s): new connections use them", self._who, _dates(expiry))
        return True


class _Watched:
    """Every live TlsWatch of the process, looked at by a daemon thread every REFRESH_SECONDS."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: weakref.WeakSet[TlsWatch] = weakref.WeakSet()
        self._thread_pid: int | None = None  # a forked child starts its own thread

    def add(self, watch: TlsWatch) -> None:
        with self._lock:
            self._watches.add(watch)
            if self._thread_pid != os.getpid():
                self._thread_pid = os.getpid()
                threading.Thread(target=self._refresh_forever, name="tls-reload", daemon=True).start()

    def discard(self, watch: TlsWatch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def all(self) -> list[TlsWatch]:
        with self._lock:
            return list(self._watches)

    def _refresh_forever(self) -> None:
        while True:
            time.sleep(REFRESH_SECONDS)
            for watch in self.all():
                try:
                    watch.refresh()
                except Exception:  # noqa: BLE001 (this thread must outlive any one bad file)
                    log.exception("looking at TLS files failed")


_watched = _Watched()


def expiries() -> dict[tuple[str, str], float]:
    """(file, path) -> expiry as a Unix time of the files this process's servers and channels use now: file "cert"
    (the earliest notAfter of the certificate chain it presents) or "ca" (of the CA bundle it verifies peers with);
    path "" for files given as bytes."""
    found: dict[tuple[str, str], float] = {}
    for watch in _watched.all():
        files, _version, expiry = watch.snapshot()
        for name, when in expiry.items():
            key = (name, str((files.cert_path if name == "cert" else files.ca_path) or ""))
            found[key] = min(when, found.get(key, when))
    return found


# ------------------------------------------------------------------------------------------------------- servers
def certificate_configuration(tls: TlsFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(tls.key, tls.cert)], root_certificates=tls.ca)


class _CertificateFetcher:
    """gRPC's certificate_configuration_fetcher, called before every TLS handshake: the renewed files' configuration
    once after each renewal, else None (gRPC keeps the one it has)."""

    def __init__(self, watch: TlsWatch) -> None:
        self._watch = watch
        self._lock = threading.Lock()
        self._handed = watch.snapshot()[1]

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        self._watch.refresh()
        files, version, _expiry = self._watch.snapshot()
        with self._lock:
            if version == self._handed:
                return None
            self._handed = version
        return certificate_configuration(files)


def reloading_server_credentials(tls: TlsFiles, who: str) -> grpc.ServerCredentials:
    """Serve tls.cert, requiring client certificates signed by tls.ca when there is one (mutual TLS), and take up
    renewals of the files. The caller checks the files first (certificates.check)."""
    return grpc.dynamic_ssl_server_credentials(
        certificate_configuration(tls),
        _CertificateFetcher(TlsWatch(tls, who)),
        require_client_authentication=tls.ca is not None,
    )


# ------------------------------------------------------------------------------------------------------- clients
class ReloadingChannel(grpc.Channel):
    """A TLS channel that follows renewals of its files (see the module docstring): `open_channel(files)` builds
    the channel for a version of the files. Every call starts on the newest channel; `subscribe` watches only
    the channel current when it is called."""

    def __init__(
        self,
        tls: TlsFiles,
        open_channel: Callable[[TlsFiles], grpc.Channel],
        who: str,
        *,
        check_every: float = CLIENT_CHECK_SECONDS,
    ) -> None:
        self._watch = TlsWatch(tls, who)
        self._open = open_channel
        self._check_every = check_every
        self._next_check = time.monotonic() + check_every
        self._lock = threading.Lock()
        self._version = 0
        self._channel = open_channel(tls)
        self._in_flight: dict[grpc.Channel, int] = {self._channel: 0}  # retired channels close at 0
        self._callables: dict[tuple, Any] = {}  # multicallables of the current channel
        self._closed = False

    def begin_call(self, kind: str, args: tuple) -> tuple[grpc.Channel, Any]:
        """The channel a call starts on now, and its multicallable; the call counts as in flight until end_call (its multicallable's, _MultiCallable)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self._check_every
            self._watch.refresh()
        files, version, _expiry = self._watch.snapshot()
        idle = None
        with self._lock:
            if version != self._version and not self._closed:
                previous, self._channel, self._version = self._channel, self._open(files), version
                self._in_flight[self._channel] = 0
                self._callables.clear()
                if self._in_flight[previous] == 0:
                    del self._in_flight[previous]
                    idle = previous
            channel = self._channel
            multicallable = self._callables.get((kind, args))
            if multicallable is None:
                multicallable = self._callables[(kind, args)] = getattr(channel, kind)(*args)
            if channel in self._in_flight:
                self._in_flight[channel] += 1
        if idle is not None:
            idle.close()
        return channel, multicallable

    def end_call(self, channel: grpc.Channel) -> None:
        with self._lock:
            if channel not in self._in_flight:
                return
            self._in_flight[channel] -= 1
            if channel is self._channel or self._in_flight[channel] > 0:
                return
            del self._in_flight[channel]
        # Possibly on one of gRPC's own threads (a done callback): close from another.
        threading.Thread(target=channel.close, name="tls-channel-close", daemon=True).start()

    def unary_unary(
        self, method, request_serializer=None, response_deserializer=None, _registered_method=False
    ):
        return _MultiCallable(
            self, "unary_unary", (method, request_serializer, response_deserializer, _registered_method)
        )

    def unary_stream(
        self, method, request_serializer=None, response_deserializer=None, _registered_method=False
    ):
        return _MultiCallable(
            self, "unary_stream", (method, request_serializer, response_deserializer, _registered_method)
        )

    def stream_unary(
        self, method, request_serializer=None, response_deserializer=None, _registered_method=False
    ):
        return _MultiCallable(
            self, "stream_unary", (method, request_serializer, response_deserializer, _registered_method)
        )

    def stream_stream(
        self, method, request_serializer=None, response_deserializer=None, _registered_method=False
    ):
        return _MultiCallable(
            self, "stream_stream", (method, request_serializer, response_deserializer, _registered_method)
        )

    def subscribe(self, callback, try_to_connect=False):
        self._channel.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback):
        self._channel.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._in_flight)
            self._in_flight.clear()
        _watched.discard(self._watch)
        for channel in channels:
            channel.close()

    def __enter__(self) -> ReloadingChannel:
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> bool:
        self.close()
        return False


class _MultiCallable:
    """A multicallable of ReloadingChannel: each invocation runs on the channel that is newest when it starts."""

    _BLOCKING = {"unary_unary", "stream_unary"}  # their __call__ returns the answer

    def __init__(self, owner: ReloadingChannel, kind: str, args: tuple) -> None:
        self._owner, self._kind, self._args = owner, kind, args

    def _invoke(self, name: str, args: tuple, kwargs: dict, *, blocking: bool) -> Any:
        channel, multicallable = self._owner.begin_call(self._kind, self._args)
        try:
            result = getattr(multicallable, name)(*args, **kwargs)
        except BaseException:
            self._owner.end_call(channel)
            raise
        if blocking:
            self._owner.end_call(channel)
        else:  # a future or a stream: in flight until it ends
            result.add_done_callback(lambda _call: self._owner.end_call(channel))
        return result

    def __call__(self, *args, **kwargs):
        return self._invoke("__call__", args, kwargs, blocking=self._kind in self._BLOCKING)

    def with_call(self, *args, **kwargs):
        return self._invoke("with_call", args, kwargs, blocking=True)

    def future(self, *args, **kwargs):
        return self._invoke("future", args, kwargs, blocking=False)
