"""Fixtures of the kvpalace Python package's tests: a real kvpalaced on a
temporary socket (as tests/integration/harness.c starts one: --socket,
--admin-socket, --state-dir and --cache-dir in a private directory), and
layouts. $KVPALACED names the daemon (meson test sets it, and PYTHONPATH
to the build tree's package); the daemon dies with the test session."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import kvpalace

LAYOUT = kvpalace.Layout(2, 2, 32, 16, "f16")


def _can_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    def __init__(self, extra=()):
        daemon = os.environ.get("KVPALACED")
        if not daemon:
            pytest.skip("$KVPALACED is not set (meson test sets it)")
        tmp = os.environ.get("TMPDIR", "/tmp")
        if len(tmp) > 60:
            tmp = "/tmp"
        self.dir = tempfile.mkdtemp(prefix="kvpy-", dir=tmp)
        self.sock = os.path.join(self.dir, "kvpalace.sock")
        self.admin_sock = os.path.join(self.dir, "admin.sock")
        argv = os.environ.get("KVPALACED_WRAPPER", "").split() + [
            daemon,
            "--socket", self.sock,
            "--admin-socket", self.admin_sock,
            "--state-dir", os.path.join(self.dir, "state"),
            "--cache-dir", os.path.join(self.dir, "cache"),
            "--host-pool-size", "64M",
            "--max-pools-per-tenant", "512",  # a pool (or a few) per test
            *extra,
        ]
        self.proc = subprocess.Popen(argv)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvpalaced exited with %d" % self.proc.returncode)
            if _can_connect(self.sock) and _can_connect(self.admin_sock):
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("kvpalaced did not accept connections")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    rc = d.proc.poll()
    d.stop()
    assert rc is None, "kvpalaced died during the tests (status %s)" % rc


@pytest.fixture
def client(daemon):
    with kvpalace.Client(daemon.sock) as c:
        yield c


_model_seq = [0]


@pytest.fixture
def pool(client):
    """A pool of its own model id per test, so tests do not see each other's pages."""
    _model_seq[0] += 1
    with client.open_pool("py-test-%d-%d" % (os.getpid(), _model_seq[0]), LAYOUT) as p:
        yield p
