"""`sparkctl doctor --bundle FILE`: everything a bug report needs, in one archive with the secrets scrubbed.

Host facts, the doctor's checks, the recipe and its plan, every server state file and the tail of every
server log. A Spark holds a Hugging Face token and API keys, and logs and environments repeat them, so
every member goes through `Redactor` before it is written: the secrets known by value (the HF token,
the stored API keys, the values of secret-named environment variables and recipe env entries) and
anything shaped like one (hf_..., sk-..., Bearer ..., `token=...`) become `[REDACTED]`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl import __version__, paths
from sparkctl.atomic import write_atomic
from sparkctl.errors import write_failure

LOG_TAIL_LINES = 500
REDACTED = "[REDACTED]"
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
_SECRET_SHAPES = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{12,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)\b((?:api[_-]?key|token|secret|password)[\"']?\s*[=:]\s*[\"']?)[^\s\"',}]{6,}"),
]


@dataclass
class Redactor:
    secrets: set[str] = field(default_factory=set)

    def add(self, value: str | None) -> None:
        if value and len(value) >= 6:
            self.secrets.add(value)

    def __call__(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        for pattern in _SECRET_SHAPES:
            text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
        return text


def known_secrets(recipe: Any = None) -> Redactor:
    """Every secret this machine's sparkctl knows by value."""
    red = Redactor()
    for name, value in os.environ.items():
        if _SECRET_NAME.search(name):
            red.add(value)
    try:
        from huggingface_hub import get_token

        red.add(get_token())
    except Exception:  # noqa: BLE001 - no hub library or no token: nothing to scrub
        pass
    keys = paths.state_dir() / "keys"
    if keys.is_dir():
        for f in keys.glob("*.env"):
            for line in f.read_text(errors="replace").splitlines():
                red.add(line.partition("=")[2].strip())
    if recipe is not None:
        for name, value in recipe.env_strings().items():
            if _SECRET_NAME.search(name):
                red.add(value)
        if recipe.serve.api_key_file:
            with contextlib.suppress(OSError):
                red.add(Path(recipe.serve.api_key_file).expanduser().read_text().strip())
    return red


def _host() -> dict[str, Any]:
    import psutil

    return {
        "sparkctl": __version__,
        "python": sys.version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    from collections import deque

    with path.open(encoding="utf-8", errors="replace") as fh:
        return "".join(deque(fh, maxlen=n))


def members(recipe_source: str | None = None, sets: tuple[str, ...] = ()) -> tuple[dict[str, str], Redactor]:
    """name -> text of every member, not yet redacted (tests look at both sides)."""
    from sparkctl.doctor import run_checks

    out: dict[str, str] = {"host.json": json.dumps(_host(), indent=2)}
    recipe = plan = None
    if recipe_source:
        from sparkctl.planner.render import plan_to_dict
        from sparkctl.plans import load_and_plan

        recipe, plan = load_and_plan(recipe_source, sets, check_memory=False)
        out["recipe.json"] = json.dumps(recipe.model_dump(mode="json", by_alias=True), indent=2)
        out["plan.json"] = json.dumps(plan_to_dict(plan), indent=2)
    checks = run_checks(plan)
    out["doctor.json"] = json.dumps([c.to_dict() for c in checks], indent=2)
    for f in sorted((paths.state_dir() / "servers").glob("*.json")):
        out[f"state/{f.name}"] = f.read_text(errors="replace")
    logs = paths.logs_dir()
    if logs.is_dir():
        for f in sorted(logs.glob("*.log*")):
            out[f"logs/{f.name}"] = _tail(f)
    env = {
        k: v for k, v in os.environ.items() if k.startswith(("SPARKCTL_", "VLLM_", "CUDA", "NCCL_", "HF_"))
    }
    out["environment.json"] = json.dumps(env, indent=2, sort_keys=True)
    return out, known_secrets(recipe)


def write_bundle(target: str | Path, recipe_source: str | None = None, sets: tuple[str, ...] = ()) -> Path:
    """The redacted .tar.gz at `target` (mode 0600, written atomically); returns its path."""
    texts, redact = members(recipe_source, sets)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in texts.items():
            data = redact(text).encode("utf-8")
            info = tarfile.TarInfo(f"sparkctl-bundle/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    path = Path(target).expanduser()
    try:
        return write_atomic(path, buf.getvalue(), fsync=True, mode=0o600)
    except OSError as exc:
        raise write_failure(path, exc) from None
