"""The registry of paper reproductions (``latebandit reproduce``).

A paper adds a module beside vernade2017.py that defines its Reproduction objects in a
``REPRODUCTIONS`` tuple, and appends that module to ``PAPERS`` below; names must be unique.
"""

from __future__ import annotations

from latebandit.sim.reproductions import guha, manegueu2020, pikeburke2018, vernade2017, vernade2020, wang2021
from latebandit.sim.reproductions.base import Check, Panel, Reference, Reproduction, run_reproduction

PAPERS = (vernade2017, pikeburke2018, wang2021, manegueu2020, guha, vernade2020)


def _registry() -> dict[str, Reproduction]:
    registry: dict[str, Reproduction] = {}
    for paper in PAPERS:
        for reproduction in paper.REPRODUCTIONS:
            if reproduction.name in registry:
                raise ValueError(f"two reproductions are named {reproduction.name!r}")
            registry[reproduction.name] = reproduction
    return registry


REPRODUCTIONS = _registry()

__all__ = ["REPRODUCTIONS", "Check", "Panel", "Reference", "Reproduction", "run_reproduction"]
