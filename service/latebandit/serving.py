"""Running the application under uvicorn, with the exit status a process manager can act on.

A worker that cannot start (a schema behind, an unsafe setting, a port taken) exits with uvicorn's
STARTUP_FAILURE (3). With one worker uvicorn exits so itself. With several, its supervisor stops every worker
when one exits so (since uvicorn 0.50), then returns normally: the parent exited 0, which systemd, compose
or Kubernetes read as a clean stop (no restart, no alert). ``serve`` runs the supervisor itself and exits
STARTUP_FAILURE when one of its workers did, whatever the worker count.
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from latebandit.config import Settings
from latebandit.logs import log_config

APPLICATION = "latebandit.api.app:create_app"

log = logging.getLogger("latebandit")


def run_service(settings: Settings) -> None:
    """Serve until stopped; SystemExit(STARTUP_FAILURE) when a worker failed to start."""
    options: dict[str, Any] = {
        "factory": True,
        "host": settings.host,
        "port": settings.port,
        "workers": settings.workers,
        "log_level": settings.log_level,
        "log_config": log_config(settings.log_level),
        "access_log": False,  # latebandit.logs.RequestLog writes the access lines, with request ids
    }
    if settings.workers == 1:
        uvicorn.run(APPLICATION, **options)  # exits STARTUP_FAILURE itself
        return
    config = uvicorn.Config(APPLICATION, **options)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    failed = [worker.pid for worker in supervisor.processes if worker.exitcode == STARTUP_FAILURE]
    if failed:
        log.error("worker process %s failed to start (its error is above): the service stopped", failed[0])
        raise SystemExit(STARTUP_FAILURE)
