"""Services a test owns so that it can break them: a Redis server it kills and restarts, a three-master
Redis Cluster, and a TCP proxy in front of PostgreSQL or Redis that it cuts and restores (the shared servers
cannot be stopped by one test, and ``initdb`` refuses to run as root).

Each starts from the installed binaries in a temporary directory and is stopped by its context manager.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.conftest import unavailable
from tests.e2e.server import free_port


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(name, FileNotFoundError(f"{name} is not on PATH"))
    assert path is not None
    return path


def _wait(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if condition():
                return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout}s")


def _ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


@dataclass
class RedisServer:
    """One redis-server on a free port, with no persistence unless ``persist`` (AOF, fsync always)."""

    workdir: Path
    persist: bool = False
    extra: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        args = [_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--dir", str(self.workdir), *persistence, *self.extra]  # fmt: skip
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _wait(lambda: _ping(self.port), f"redis-server on port {self.port} answering")

    def kill(self) -> None:
        """SIGKILL: what a crash or an OOM kill does; nothing is flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()


@contextlib.contextmanager
def redis_server(workdir: Path, persist: bool = False) -> Iterator[RedisServer]:
    server = RedisServer(workdir, persist)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class RedisCluster:
    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        return self.nodes[0].url


CLUSTER_MODE = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")


@contextlib.contextmanager
def redis_cluster(workdir: Path, masters: int = 3) -> Iterator[RedisCluster]:
    """``masters`` cluster-enabled redis-servers joined by ``redis-cli --cluster create`` (no replicas)."""
    nodes = [
        RedisServer(workdir / f"node{i}", extra=(*CLUSTER_MODE, "--cluster-port", str(free_port())))
        for i in range(masters)
    ]
    try:
        for node in nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            [_binary("redis-cli"), "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

        def settled() -> bool:
            for node in nodes:
                info = subprocess.run(
                    [_binary("redis-cli"), "-p", str(node.port), "cluster", "info"], capture_output=True, text=True
                ).stdout
                if "cluster_state:ok" not in info:
                    return False
            return True

        _wait(settled, "the cluster reaching cluster_state:ok", timeout=30)
        yield RedisCluster(nodes)
    finally:
        for node in nodes:
            node.kill()


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()`` is a network partition: new connections are refused,
    the clients' open connections are reset, and the target is told nothing (its sessions linger, holding
    whatever their open transactions hold); ``restore()`` heals it: the target's side of each cut connection
    is reset (as its next packet would be answered by the client host, which has no such connection any
    more), and the proxy listens again on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._clients: set[socket.socket] = set()
        self._upstreams: dict[socket.socket, socket.socket] = {}  # client -> its connection to the target
        self._severed: list[socket.socket] = []  # target sides of cut connections, reset when healed
        self._cut = 0  # generation: a connection set up across a cut belongs to none
        self._lock = threading.Lock()

    def restore(self) -> None:
        with self._lock:
            for sock in self._severed:
                _reset(sock)
            self._severed.clear()
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._clients:  # a blocked recv in a pump thread keeps a socket alive: shut it down
                _reset(sock)
                if sock in self._upstreams:
                    self._severed.append(self._upstreams[sock])
            self._clients.clear()
            self._upstreams.clear()
            self._cut += 1

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            generation = self._cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if generation != self._cut:  # cut while connecting
                    client.close()
                    upstream.close()
                    continue
                self._clients.add(client)
                self._upstreams[client] = upstream
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Until either side closes; a cut client makes this end without telling the target (the upstream
        socket is closed without a shutdown, and its other pump may wait on it until the target gives up)."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._clients -= {source, sink}


def _reset(sock: socket.socket) -> None:
    """Close with an RST (linger 0), which also wakes a thread blocked reading the socket."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.shutdown(socket.SHUT_RDWR)


DEFAULT_PORTS = {"postgresql": 5432, "redis": 6379}


@contextlib.contextmanager
def tcp_proxy(url: str) -> Iterator[tuple[TcpProxy, str]]:
    """A proxy in front of the server of ``url`` (PostgreSQL or Redis); yields it and the same URL pointed
    through it."""
    parts = urlsplit(url)
    assert parts.hostname is not None, url
    proxy = TcpProxy(parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme.split("+")[0]])
    user, at, _ = parts.netloc.rpartition("@")
    proxy.restore()
    try:
        yield proxy, urlunsplit(parts._replace(netloc=f"{user}{at}127.0.0.1:{proxy.port}"))
    finally:
        proxy.cut()


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (uvicorn's workers under its supervisor), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry))
    return sorted(found)


def serving_process(pids: list[int], server_port: int, client_port: int) -> int:
    """Which of ``pids`` holds the server end of the TCP connection from ``client_port`` (from /proc)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        if (local, remote) == (server_port, client_port):
            inode = fields[9]
    link = f"socket:[{inode}]"
    for pid in pids:
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == link for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
    raise AssertionError(f"no process serves the connection from port {client_port}")
