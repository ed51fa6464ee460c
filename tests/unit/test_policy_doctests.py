"""Every policy's docstring shows it deciding, and the example runs: the policy modules' doctests, run here so
that the suite's usual command runs them too (pytest's --doctest-modules would collect the whole package)."""

from __future__ import annotations

import doctest
import importlib

import pytest

from latebandit.policies import CONTEXTUAL_POLICIES, POLICIES

EVERY = {**POLICIES, **CONTEXTUAL_POLICIES}
MODULES = sorted({cls.__module__ for cls in EVERY.values()})


@pytest.mark.parametrize("name", sorted(EVERY))
def test_every_policy_has_an_example(name: str) -> None:
    assert ">>>" in (vars(EVERY[name]).get("__doc__") or ""), f"{EVERY[name].__name__} shows no example"


@pytest.mark.parametrize("module", MODULES)
def test_the_examples_run(module: str) -> None:
    failed, attempted = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert attempted > 0
    assert failed == 0, f"{failed} of {attempted} examples of {module} failed (printed above)"
