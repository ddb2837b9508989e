"""Frameworks tested from their source (miles, slime: not on PyPI): put ``$MILES_SRC`` /
``$SLIME_SRC`` on the path, and stand in for sglang where it is absent.

miles' ``data_source`` and ``fully_async_rollout`` modules import sglang at module level (chat
templates, OpenAI protocol types) though nothing tested here calls it; sglang is a GPU serving
engine that does not install on these machines. ``stub_sglang`` registers an import hook that makes
every ``sglang.*`` module an empty namespace whose attributes are placeholder classes, only when
sglang itself is not importable, so a test that reaches real sglang code fails loudly instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

__all__ = ["add_source", "stub_sglang"]


def add_source(env: str) -> str | None:
    """Put the checkout named by ``$env`` first on sys.path; its path, or None when unset."""
    path = os.environ.get(env)
    if path and path not in sys.path:
        sys.path.insert(0, path)
    return path


class _Placeholders(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "sglang" or name.startswith("sglang."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Placeholders(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]


def stub_sglang() -> None:
    if importlib.util.find_spec("sglang") is None and not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.append(_StubFinder())
