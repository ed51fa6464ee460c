"""A serving worker runs BLAS on one thread (api/app.py): on the worker's own core, BLAS's threads only contend
with its event loop and Redis."""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

from latebandit.config import Settings
from tests.inprocess import started


async def test_the_app_limits_blas_to_one_thread(tmp_path) -> None:
    with threadpool_limits(limits=2, user_api="blas"):  # as a process started with two would have them
        async with started(Settings(database_url=f"sqlite:///{tmp_path / 'audit.db'}")):
            pools = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
            assert pools and all(pool["num_threads"] == 1 for pool in pools)
