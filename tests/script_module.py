"""Import a script that is not in a package (kernels/bench/*.py run on the GPU machine) as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType


def loaded(path: Path, name: str) -> Iterator[ModuleType]:
    """The script at ``path`` as module ``name``, registered in sys.modules while in use (dataclasses look their
    module up there); for a module-scoped fixture: ``yield from loaded(...)``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]
