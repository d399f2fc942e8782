"""Following TLS files renewed on disk (common/tls_reload.py, common/certificates.py), without a network: what a
renewal must be to be taken (parsable, the key the certificate's), how a change is noticed (a stat: a swapped
Secret-volume link, a file rewritten in place), that a broken state is reported once and the previous files kept,
and how ReloadingChannel moves calls to a channel of the renewed files and closes the previous one once its last
call has ended. On real servers and clients: tests/integration/test_tls_rotation.py."""

from __future__ import annotations

import datetime
import logging
import threading
from concurrent import futures

import grpc
import pytest

from apexrl.common import certificates, grpc_util, tls_reload
from apexrl.common.tls import TlsFiles
from apexrl.common.tls_reload import ReloadingChannel, TlsWatch
from tests.support.certs import SecretVolume, issue


def moment(days: int) -> datetime.datetime:
    return datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(days=days)


@pytest.fixture
def volume(tmp_path) -> SecretVolume:
    return SecretVolume(tmp_path / "tls")


def write(volume: SecretVolume, identity) -> None:
    volume.write(cert=identity.cert, key=identity.key, ca=identity.ca_pem)


# ------------------------------------------------------------------------------------------------- certificates
def test_check_gives_the_earliest_expiry_of_the_chain_and_of_the_ca_bundle():
    identity = issue(not_after=moment(10))
    other = issue(not_after=moment(20))
    expiry = certificates.check(
        TlsFiles(cert=identity.cert, key=identity.key, ca=identity.ca_pem + other.cert)
    )
    assert expiry["cert"] == moment(10).timestamp()
    assert (
        expiry["ca"] == moment(20).timestamp()
    )  # the bundle's earliest: `other`'s certificate, not the CA's
    assert certificates.check(TlsFiles(ca=identity.ca_pem)).keys() == {"ca"}


def test_check_names_the_file_that_is_not_usable(volume):
    old, new = issue(), issue()
    volume.write(cert=new.cert, key=old.key, ca=new.ca_pem)
    with pytest.raises(
        ValueError,
        match=r"tls_key \(.*tls\.key\) is not the private key of the first certificate "
        r"in tls_cert \(.*tls\.crt\)",
    ):
        certificates.check(TlsFiles.read(volume.cert, volume.key))
    volume.write(cert=new.cert[:200], key=new.key, ca=b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    with pytest.raises(ValueError, match=r"tls_cert \(.*tls\.crt\) does not parse as PEM certificates"):
        certificates.check(TlsFiles.read(volume.cert, volume.key))
    with pytest.raises(ValueError, match=r"tls_ca \(.*ca\.crt\) does not parse as PEM certificates"):
        certificates.check(TlsFiles.read(ca=volume.ca))


# ------------------------------------------------------------------------------------------------------ TlsWatch
def test_a_watch_takes_a_swapped_secret_volume_and_a_file_rewritten_in_place(volume):
    old, new, third = issue(), issue(), issue()
    write(volume, old)
    watch = TlsWatch(TlsFiles.read(volume.cert, volume.key, volume.ca), "test")
    assert not watch.refresh() and watch.snapshot()[1] == 0  # nothing changed: a stat, no read
    write(volume, new)
    assert watch.refresh()
    files, version, _expiry = watch.snapshot()
    assert (files.cert, files.key, files.ca, version) == (new.cert, new.key, new.ca_pem, 1)
    assert files.cert_path == volume.cert  # still the link, not what it pointed at
    write(volume, new)  # the same bytes again (a resync): nothing to take
    assert not watch.refresh() and watch.snapshot()[1] == 1
    target = volume.directory / "..data"
    for name, data in (("tls.crt", third.cert), ("tls.key", third.key)):
        (target / name).write_bytes(data)  # in place, through the links
        watch.refresh()  # half way (the key not yet written): refused; whole: taken
    assert watch.snapshot()[0].cert == third.cert and watch.snapshot()[1] == 2


def test_a_broken_renewal_is_logged_once_and_the_previous_files_kept_until_a_good_one(volume, caplog):
    old, new = issue(), issue()
    write(volume, old)
    watch = TlsWatch(TlsFiles.read(volume.cert, volume.key, volume.ca), "the server on test")
    caplog.set_level(logging.ERROR, logger="apexrl.common.tls_reload")
    (volume.directory / "..data" / "tls.key").unlink()  # a renewal that lost a file
    for _ in range(3):
        assert not watch.refresh()
    assert watch.snapshot()[0].cert == old.cert
    [error] = [r.getMessage() for r in caplog.records]
    assert (
        "TLS files of the server on test changed but are not usable; keeping the previous ones: tls_key"
        in error
    )
    assert "cannot be read" in error
    write(volume, new)
    assert watch.refresh() and watch.snapshot()[0].key == new.key


def test_expiries_name_each_file_in_use(volume):
    identity = issue(not_after=moment(5))
    write(volume, identity)
    watch = TlsWatch(TlsFiles.read(volume.cert, volume.key, volume.ca), "test")
    found = tls_reload.expiries()
    assert found[("cert", volume.cert)] == moment(5).timestamp()
    assert ("ca", volume.ca) in found
    del watch


# ----------------------------------------------------------------------------------------------- ReloadingChannel
class FakeCall:
    """A call in flight (a future or a stream): done when `finish()` is called."""

    def __init__(self) -> None:
        self._callbacks = []

    def add_done_callback(self, callback) -> None:
        self._callbacks.append(callback)

    def finish(self) -> None:
        for callback in self._callbacks:
            callback(self)


class FakeChannel:
    def __init__(self, files: TlsFiles) -> None:
        self.files, self.closed, self.calls = files, False, []

    def unary_unary(
        self, method, request_serializer=None, response_deserializer=None, _registered_method=False
    ):
        channel = self

        class MultiCallable:
            def __call__(self, request, timeout=None):
                channel.calls.append((method, request))
                return channel.files.cert

            def future(self, request, timeout=None):
                channel.calls.append((method, request))
                return FakeCall()

        return MultiCallable()

    def close(self) -> None:
        self.closed = True


def test_calls_started_after_a_renewal_use_a_channel_of_the_renewed_files(volume):
    old, new = issue(), issue()
    write(volume, old)
    opened: list[FakeChannel] = []

    def open_channel(files: TlsFiles) -> FakeChannel:
        opened.append(FakeChannel(files))
        return opened[-1]

    channel = ReloadingChannel(
        TlsFiles.read(volume.cert, volume.key, volume.ca), open_channel, "test", check_every=0.0
    )
    call = channel.unary_unary("/apexrl.v1.Test/Call")  # what a stub keeps
    assert call(b"1") == old.cert
    in_flight = call.future(b"2")
    write(volume, new)
    assert call(b"3") == new.cert and len(opened) == 2
    assert [c.calls for c in opened] == [
        [("/apexrl.v1.Test/Call", b"1"), ("/apexrl.v1.Test/Call", b"2")],
        [("/apexrl.v1.Test/Call", b"3")],
    ]
    assert not opened[0].closed  # a call is still in flight on it
    in_flight.finish()
    tls_reload_threads_done()
    assert opened[0].closed and not opened[1].closed
    write(volume, issue())
    call(b"4")  # nothing in flight on the second channel: closed at once
    assert opened[1].closed and len(opened) == 3
    channel.close()
    assert opened[2].closed


def test_a_renewal_that_is_not_usable_keeps_the_channel(volume):
    old, new = issue(), issue()
    write(volume, old)
    opened: list[FakeChannel] = []
    channel = ReloadingChannel(
        TlsFiles.read(volume.cert, volume.key, volume.ca),
        lambda files: opened.append(FakeChannel(files)) or opened[-1],
        "test",
        check_every=0.0,
    )
    volume.write(cert=new.cert, key=old.key, ca=new.ca_pem)
    assert channel.unary_unary("/apexrl.v1.Test/Call")(b"1") == old.cert and len(opened) == 1
    channel.close()


def tls_reload_threads_done(timeout: float = 10.0) -> None:
    """Wait for the threads that close retired channels (they run apart from gRPC's callback threads)."""
    for thread in threading.enumerate():
        if thread.name == "tls-channel-close":
            thread.join(timeout)


def test_a_server_refuses_at_start_the_files_it_would_refuse_as_a_renewal(volume):
    """bind checks the files as a renewal is checked, and names the one at fault."""
    identity = issue()
    volume.write(cert=identity.cert[:300], key=identity.key, ca=identity.ca_pem)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    with pytest.raises(
        OSError, match=r"cannot serve TLS on 127.0.0.1:0: tls_cert \(.*tls\.crt\) does not parse"
    ):
        grpc_util.bind(server, "127.0.0.1:0", tls=TlsFiles.read(volume.cert, volume.key))
