"""`apexrl params` (parameter_server/main.py) as an operator runs it: a real process that serves, reports its port
and metrics, refuses a bad configuration with exit status 2, and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

from apexrl.parameter_server.client import ParameterClient


def test_standalone_process_serves_and_exits_0_on_sigterm(tmp_path):
    port_file = tmp_path / "params.port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "params",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--port-file",
            str(port_file),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        deadline = time.monotonic() + 10
        match = None
        while match is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            match = re.search(r"serving on 127\.0\.0\.1:(\d+) .*metrics (http://\S+)", line)
        assert match, "no start line"
        port, metrics_url = int(match.group(1)), match.group(2)
        deadline = time.monotonic() + 5
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert int(port_file.read_text()) == port
        with ParameterClient(f"127.0.0.1:{port}", timeout=5.0) as c:
            assert c.publish({"w": np.arange(3, dtype=np.float32)}) == 1
            assert c.fetch(0)[0] == 1
        with urllib.request.urlopen(metrics_url, timeout=5) as reply:
            assert b"apexrl_params_current_version 1.0" in reply.read()
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - start < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_configuration_exits_2_before_serving():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.launcher",
            "params",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            "--chunk-bytes",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert (
        "apexrl params: error: --chunk-bytes: chunk_bytes (0) must be in [1, max_message_bytes" in done.stderr
    )
    assert "serving" not in done.stderr
