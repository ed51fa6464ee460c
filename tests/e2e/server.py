"""Start the real service (`latebandit serve`, uvicorn) as a child process for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from latebandit.config import is_loopback
from tests.conftest import unavailable

LATEBANDIT = [sys.executable, "-m", "latebandit.cli"]
KEEPALIVE_EXPIRY = 2.0  # seconds a test client keeps an idle connection: below uvicorn's keep-alive timeout (5 s)
SECRET = "e2e-decision-id-secret-0123456789abcdef"  # 32+ bytes: `serve` refuses shorter ones


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def public_address() -> str:
    """A non-loopback address of this host: where its route to the outside leaves from (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by the default route, never answered
            address = sock.getsockname()[0]
        except OSError as error:
            unavailable("a non-loopback address of this host", error)
    if is_loopback(address):
        unavailable("a non-loopback address of this host", OSError(f"the route leaves from {address}"))
    return address


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path

    def client(self, **kwargs) -> httpx.Client:
        """A client that drops an idle connection before uvicorn does (its keep-alive timeout is 5 s): a request
        sent on a connection the server closes at that moment fails "Server disconnected without sending a
        response" (seen once in test_prometheus, after the test waited on Prometheus for longer)."""
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY)
        return httpx.Client(base_url=self.url, timeout=30.0, limits=limits, **kwargs)


def service_env(workdir: Path, **settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LATEBANDIT_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["LATEBANDIT_SECRET"] = settings.pop("secret", SECRET)
    env.update({f"LATEBANDIT_{name.upper()}": value for name, value in settings.items()})
    env.setdefault("LATEBANDIT_DATABASE_URL", f"sqlite:///{workdir / 'latebandit.db'}")
    return env


@contextlib.contextmanager
def running(env: dict[str, str], workdir: Path, workers: int = 1) -> Iterator[Server]:
    port = free_port()
    with started([*LATEBANDIT, "serve", "--port", str(port), "--workers", str(workers)], env, workdir, port) as server:
        yield server


@contextlib.contextmanager
def started(args: list[str], env: dict[str, str], workdir: Path, port: int) -> Iterator[Server]:
    """``args`` (a command serving on ``port``) in a session of its own, its output in ``workdir``."""
    log = workdir / f"server-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(f"http://127.0.0.1:{port}", process, env, log)
    try:
        wait_ready(server)
        yield server
    finally:
        stop(server)


def wait_ready(server: Server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the service exited at start:\n{server.log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/healthz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the service did not start in {timeout}s:\n{server.log.read_text()}")


def stop(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


def cli(env: dict[str, str], workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*LATEBANDIT, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"latebandit {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result
