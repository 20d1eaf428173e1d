"""`up --persist` for the native runtime: a systemd user unit that runs the same plan after a reboot.

A docker recipe survives a reboot through its container's restart policy; a native server has no daemon
of its own, so sparkctl writes `~/.config/systemd/user/sparkctl-RECIPE.service` (ExecStart is the plan's
argv, Environment= its env, EnvironmentFile= its API key file, the log appended to the recipe's log) and
enables it the way `systemctl --user enable` does (a `default.target.wants` link), so it needs no running
systemd to be written or tested. `down` disables and removes both.

systemd's own syntax is not a shell's: in ExecStart `$` and `%` are expanded (written `$$`, `%%`), a
double-quoted word takes backslash escapes (only `\\\\` and `\\"` are written). Control characters in a
value are refused rather than escaped: they have no place on a command line that systemd logs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from sparkctl.atomic import write_atomic
from sparkctl.errors import UserError, write_failure
from sparkctl.planner.types import Plan


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def unit_name(recipe: str) -> str:
    return f"sparkctl-{recipe}.service"


def unit_path(recipe: str) -> Path:
    return unit_dir() / unit_name(recipe)


def persisted_recipes() -> list[str]:
    """Recipes with a unit of ours (for `down --all`)."""
    try:
        names = [p.name for p in unit_dir().glob("sparkctl-*.service")]
    except OSError:
        return []
    return sorted(n.removeprefix("sparkctl-").removesuffix(".service") for n in names)


def _wants_link(recipe: str) -> Path:
    return unit_dir() / "default.target.wants" / unit_name(recipe)


def _checked(value: str, what: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise UserError(
            f"--persist: {what} holds a control character ({value[:40]!r}), which a systemd unit cannot carry",
            hint="drop --persist, or remove the newline/tab from that value",
        )
    return value


def _word(arg: str, *, dollars: bool) -> str:
    """One double-quoted word of ExecStart= (dollars) or Environment= (no `$` expansion there)."""
    text = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if dollars:
        text = text.replace("$", "$$")
    return f'"{text}"'


def _path_value(path: str) -> str:
    return path.replace("%", "%%")


def render_unit(plan: Plan, log_path: Path | str, *, strict: bool = True) -> str:
    """The unit file's text; ExecStart's first word is the executable's absolute path (systemd's PATH is not
    the user's shell's). `strict=False` (a dry run) keeps a name that is not installed here as it is."""
    if not plan.argv:
        raise UserError(f"--persist: {plan.recipe_name}'s plan has an empty command line")
    argv = [_checked(a, "the command line") for a in plan.argv]
    argv[0] = shutil.which(argv[0]) or argv[0]
    if strict and not os.path.isabs(argv[0]):
        raise UserError(
            f"--persist: executable {plan.argv[0]!r} not found, a systemd unit needs its absolute path",
            hint="install the engine, or set engine.entrypoint to an absolute path",
        )
    env = {"PYTHONUNBUFFERED": "1", **plan.env}
    lines = [
        f"# written by `sparkctl up --persist {plan.recipe_name}` (recipe {plan.recipe_hash[:12]});",
        f"# `sparkctl down {plan.recipe_name}` disables and removes it",
        "[Unit]",
        f"Description=sparkctl {plan.recipe_name} ({plan.engine} on {plan.host}:{plan.port})",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_word(a, dollars=True) for a in argv),
    ]
    for key, value in env.items():
        lines.append("Environment=" + _word(f"{key}={_checked(value, f'env {key}')}", dollars=False))
    if plan.api_key_file:  # the key itself stays in its 0600 file, as for `up`
        lines.append(f"EnvironmentFile={_path_value(_checked(plan.api_key_file, 'the API key file'))}")
    log = _checked(str(log_path), "the log path")
    lines += [
        f"StandardOutput=append:{_path_value(log)}",
        "StandardError=inherit",
        "KillMode=control-group",  # the engine core and workers go down with the API server
        "Restart=on-failure",
        "RestartSec=10",
        "TimeoutStopSec=30",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def install(plan: Plan, log_path: Path | str) -> Path:
    """Write the unit (temp file, then rename) and enable it; returns its path."""
    text = render_unit(plan, log_path)
    path = unit_path(plan.recipe_name)
    link = _wants_link(plan.recipe_name)
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text, fsync=True, mode=0o644)
        if not link.is_symlink():
            tmp = link.with_name(f".{link.name}.tmp")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(Path("..") / path.name)
            os.replace(tmp, link)
    except OSError as exc:
        raise write_failure(path, exc) from None
    _systemctl("daemon-reload")
    return path


def remove(recipe: str) -> bool:
    """Disable and delete the recipe's unit; True if there was one. A missing unit is not an error."""
    path, link = unit_path(recipe), _wants_link(recipe)
    if not path.exists() and not link.is_symlink():
        return False
    _systemctl("disable", "--now", unit_name(recipe))  # stops a server systemd started after a reboot
    try:
        link.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise write_failure(path, exc) from None
    _systemctl("daemon-reload")
    return True


def _systemctl(*args: str) -> bool:
    """Tell a running user manager (best effort: none runs in a container or before the first login)."""
    exe = shutil.which("systemctl")
    if exe is None:
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [exe, "--user", *args], capture_output=True, timeout=15, stdin=subprocess.DEVNULL
        )
        return done.returncode == 0
    return False
