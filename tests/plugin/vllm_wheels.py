"""Single Python files out of other vLLM releases' wheels on PyPI, for the plugin's version-seam tests.

A vLLM wheel is 300-400 MB; the seam tests need a handful of its sources. remotezip reads the zip's central
directory and the named members with HTTP range requests (about a second a release). Files are kept under
``$XDG_CACHE_HOME/sparkctl/vllm-src/<version>/`` (written to a temp file, then renamed), so a machine reads PyPI
once per release.
"""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path

import httpx

SIMPLE = "https://pypi.org/simple/vllm/"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkctl" / "vllm-src"


@cache
def wheel_url(version: str) -> str:
    """The x86-64 wheel of ``version`` from PyPI's simple index (JSON form, PEP 691)."""
    r = httpx.get(
        SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60, follow_redirects=True
    )
    r.raise_for_status()
    for f in r.json()["files"]:
        if f["filename"].startswith(f"vllm-{version}-") and f["filename"].endswith("x86_64.whl"):
            return f["url"]
    raise LookupError(f"PyPI lists no x86-64 wheel of vllm {version}")


def source(version: str, path: str) -> str:
    """The text of ``path`` (e.g. ``vllm/model_executor/layers/linear.py``) in vllm ``version``'s wheel."""
    dest = cache_root() / version / path
    if not dest.exists():
        from remotezip import RemoteZip

        with RemoteZip(wheel_url(version)) as z:
            data = z.read(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    return dest.read_text()


def module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"
