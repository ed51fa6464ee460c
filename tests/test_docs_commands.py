"""The shell blocks the docs mark runnable run as written on a fresh checkout (issue 18).

A block preceded by ``<!-- test: run -->`` runs with bash -e in a copy of the tracked files whose ``.venv``
is the environment running the tests; ``<!-- test: run beside the service -->`` runs while
``.venv/bin/latebandit serve`` (the embedded default, the README's first command) serves from that copy.
Blocks that need what a test cannot have (docker, kubectl, a cluster, hours of load) stay unmarked.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server import service_env

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- test: (run|run beside the service) -->\s*```bash\n(.*?)```", re.S)
PORT = 8000  # the README's own address

pytestmark = pytest.mark.slow


def marked_blocks() -> list[tuple[str, str, str]]:
    """(where, mode, block) for every marked block of the README and docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [
        (f"{page.name}:{page.read_text()[: match.start()].count(chr(10)) + 1}", match.group(1), match.group(2))
        for page in pages
        for match in BLOCK.finditer(page.read_text())
    ]


def checkout(target: Path) -> Path:
    """The tracked files, as a fresh clone has them, with .venv the running environment."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name, follow_symlinks=False)
    (target / ".venv").symlink_to(Path(sys.prefix))
    return target


@contextlib.contextmanager
def serving(workdir: Path) -> Iterator[None]:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PORT)) == 0:
            pytest.fail(f"port {PORT}, which the README's session uses, is taken")
    env = service_env(workdir)
    env.pop("LATEBANDIT_SECRET")
    env.pop("LATEBANDIT_DATABASE_URL")  # the embedded default, exactly as the README starts it
    with open(workdir / "serve.log", "wb") as log:
        server = subprocess.Popen([".venv/bin/latebandit", "serve"], cwd=workdir, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["curl", "-sf", f"localhost:{PORT}/healthz"], capture_output=True).returncode:
            assert server.poll() is None and time.monotonic() < deadline, (workdir / "serve.log").read_text()
            time.sleep(0.2)
        yield
    finally:
        server.terminate()
        server.wait(30)


def test_the_docs_mark_the_first_session_and_the_simulation_commands() -> None:
    assert {where.split(":")[0] for where, _, _ in marked_blocks()} >= {"README.md", "simulations.md"}


@pytest.mark.parametrize(("where", "mode", "block"), marked_blocks(), ids=[where for where, _, _ in marked_blocks()])
def test_marked_blocks_run_as_written(tmp_path: Path, where: str, mode: str, block: str) -> None:
    workdir = checkout(tmp_path / "checkout")
    with serving(workdir) if mode == "run beside the service" else contextlib.nullcontext():
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=workdir, capture_output=True,
                                text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, f"{where}\n{result.stdout}\n{result.stderr}"
    if mode == "run beside the service":  # curl exits 0 on any HTTP answer: the session must also succeed
        assert '"accepted":1' in result.stdout and '"fallback":false' in result.stdout, result.stdout
