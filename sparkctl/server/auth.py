"""API keys: who may use a server that sparkctl starts.

A key is never a command-line argument (it would be in `ps`, the log's header line and every rendered
script): the engine gets it from its environment (vLLM reads VLLM_API_KEY, llama-server LLAMA_API_KEY),
filled from an env file under the state directory (mode 0600, paths.api_key_file) that rendered scripts
and compose files reference by path. sparkctl's own calls (health, smoke, chat) send it as a bearer token.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from sparkctl import paths
from sparkctl.atomic import write_atomic
from sparkctl.errors import UserError, write_failure

# Characters that mean the same in an env file read by docker, compose and a shell: nothing to quote.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
GENERATE = "generate"  # `--api-key generate`: a new random key, stored, printed once


def is_loopback(host: str) -> bool:
    """Only this machine can reach a server bound here."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key(key: str, source: str) -> str:
    if not KEY_PATTERN.fullmatch(key):
        raise UserError(
            f"{source}: an API key is 16-512 characters of letters, digits and ._~+/=-",
            hint="`--api-key generate` makes one",
        )
    return key


def generate() -> str:
    return secrets.token_urlsafe(32)


def read_key_file(path: str | Path, source: str = "serve.api_key_file") -> str:
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{source}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return check_key(text.strip(), f"{source} {path}")


def store(recipe: str, engine: str, key: str) -> Path:
    """Write the env file that hands `key` to the engine; 0600 in a 0700 directory, atomically."""
    path = paths.api_key_file(recipe)
    from sparkctl.planner.adapters import adapter_for

    var = adapter_for(engine).api_key_env
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        write_atomic(path, f"{var}={key}\n", fsync=True, mode=0o600)
    except OSError as exc:
        raise write_failure(path, exc) from None
    return path


def env_of(env_file: str | Path | None) -> dict[str, str]:
    """The variables of an API key env file (empty when there is none)."""
    if not env_file:
        return {}
    out: dict[str, str] = {}
    try:
        text = Path(env_file).read_text(encoding="utf-8")
    except OSError:
        return out
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip():
            out[name.strip()] = value.strip()
    return out


def key_of(env_file: str | Path | None) -> str | None:
    """The key an env file holds, for sparkctl's own requests to the server."""
    env = env_of(env_file)
    from sparkctl.planner.adapters import ADAPTERS

    names = {a.api_key_env for a in ADAPTERS.values()}
    return next((v for k, v in env.items() if k in names), None)


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
