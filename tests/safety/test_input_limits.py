"""Hostile or careless input is one line and exit 2, quickly: never a traceback, a hang or a blow-up.

Each case is a hole found on main (issue 27): the command is the real entry point, run in-process.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest
from clirun import assert_one_error, sparkctl

from prewarm.errors import BadInput
from prewarm.files import inspect_files, model_files
from sparkctl.server.diagnose import hint_for
from sparkctl.server.health import ServerExited, wait_healthy

TINY = "extends: tiny\n"


def recipe(tmp_path: Path, body: str, name: str = "r.yaml") -> str:
    path = tmp_path / name
    path.write_text(TINY + body)
    return str(path)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("serve:\n  port: !!float abc\n", ":3:9: 'abc' is not a valid !!float"),
        ("serve:\n  port: !!int 0x\n", ":3:9: '0x' is not a valid !!int"),
        ("serve:\n  enforce_eager: !!bool maybe\n", "'maybe' is not a valid !!bool"),
        ("serve:\n  port: !!timestamp 2020-99-99\n", "is not a valid !!timestamp"),
        (
            "serve:\n  port: " + "9" * 5000 + "\n",
            "integer '99999999999999999999999999999...9999999' is out of range",
        ),
        ("serve:\n  port: 99999999999999999999\n", "is out of range (at most 9,223,372,036,854,775,807)"),
        ('env:\n  A: "a\\0b"\n', ":3:6: a NUL character (\\0) cannot be passed to a process"),
        ("serve:\n  health_timeout_s: .inf\n", "serve.health_timeout_s: Input should be a finite number"),
        ("notes: " + "[" * 70 + "]" * 70 + "\n", "YAML nested deeper than 64 levels"),
    ],
)
def test_bad_values_in_a_file_are_one_located_line(tmp_path: Path, body: str, fragment: str) -> None:
    res = sparkctl("show", recipe(tmp_path, body))
    assert_one_error(res, fragment)


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("serve.port=!!float abc", "--set 'serve.port=!!float abc':1:1: 'abc' is not a valid !!float"),
        ("serve.port=!!int 0x", "'0x' is not a valid !!int"),
        ("serve.enforce_eager=!!bool maybe", "'maybe' is not a valid !!bool"),
        ("serve.port=" + "9" * 5000, "--set serve.port=<5,000 characters>:1:1: integer"),
        ('env.A="a\\0b"', "a NUL character"),
        ("a." * 100 + "b=1", "key path deeper than 64 levels"),
    ],
)
def test_bad_values_in_set_are_one_line(setting: str, fragment: str) -> None:
    res = sparkctl("show", "tiny", "--set", setting)
    line = assert_one_error(res, fragment)
    assert len(line) < 300


def test_an_anchor_bomb_is_refused_in_bytes_not_only_nodes(tmp_path: Path) -> None:
    """110 KB whose anchor is used 1000 times: on main `show` ran 52 s and printed 100 MB."""
    body = "notes:\n  - &big " + "x" * 110_000 + "\n" + "".join("  - *big\n" for _ in range(1000))
    path = recipe(tmp_path, body)
    assert 110_000 < os.path.getsize(path) < 120_000
    res = sparkctl("show", path)
    assert_one_error(res, "YAML expands to more than 2,097,152 bytes")
    assert res.seconds < 2 and len(res.stdout) == 0


def test_a_huge_file_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(TINY + "notes:\n" + "  - x\n" * 300_000)
    res = sparkctl("show", str(path))
    assert_one_error(res, "larger than 1,048,576 bytes; not a recipe")
    assert res.seconds < 2


def _two_loops(root: Path) -> Path:
    """A model dir whose subdir links back up twice: 2^depth paths to walk when links are followed."""
    model = root / "model"
    (model / "a").mkdir(parents=True)
    (model / "a" / "up").symlink_to("..")
    (model / "a" / "again").symlink_to("../../model")
    return model


def _shard(path: Path, nbytes: int = 64, header_len: int | None = None) -> Path:
    header = b'{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (nbytes, nbytes)
    header += b" " * (-len(header) % 8)
    n = len(header) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + header + b"\0" * nbytes)
    return path


def _within(seconds: float, fn):  # type: ignore[no-untyped-def]
    """fn() in a thread; fails (instead of hanging the suite) when it takes longer than `seconds`."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds}s (a symlink loop followed forever?)"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def test_symlink_loops_are_walked_once(tmp_path: Path) -> None:
    model = _two_loops(tmp_path)
    _shard(model / "model.safetensors")
    files = _within(10, lambda: model_files(model))
    assert files == [model / "model.safetensors"]


def test_prewarm_on_a_symlink_loop_finishes(tmp_path: Path) -> None:
    model = _two_loops(tmp_path)
    _shard(model / "model.safetensors", 4096)
    res = _within(20, lambda: sparkctl("prewarm", str(model), "--json"))
    assert res.code == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["total_bytes"] == (model / "model.safetensors").stat().st_size


def test_a_safetensors_header_length_past_the_limit_is_refused(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "model.safetensors", header_len=2**63 - 1)
    with pytest.raises(BadInput, match="not a safetensors file \\(header length 9,223,372,036,854,775,807"):
        inspect_files([shard])
    res = sparkctl("prewarm", str(tmp_path))
    assert_one_error(res, "not a safetensors file")


def test_a_header_that_is_not_json_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(struct.pack("<Q", 8) + b"not json" + b"\0" * 16)
    with pytest.raises(BadInput, match="header is not JSON"):
        inspect_files([shard])


# -- the diagnosis reads the whole log ----------------------------------------------------------------

TRUNCATED = (
    "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata, file not "
    "fully covered"
)


def test_the_root_cause_far_above_the_tail_is_found(tmp_path: Path) -> None:
    """The hole: a truncated shard failed with "the server process is gone" and no cause."""
    log = tmp_path / "server.log"
    noise = [f'  File "/x/vllm/worker.py", line {i}, in load' for i in range(400)]
    log.write_text("\n".join(["INFO starting", TRUNCATED, *noise, "RuntimeError: Engine core failed"]) + "\n")
    from sparkctl.runtimes.native import follow_file

    with pytest.raises(ServerExited) as err:
        wait_healthy(
            "http://127.0.0.1:9",
            "m",
            label="tiny",
            timeout_s=5,
            exit_detail=lambda: "the server process is gone",
            last_lines=lambda n: list(follow_file(log, tail=n)),
        )
    assert err.value.hint is not None and err.value.hint.startswith("truncated weights:")
    assert "not fully covered" in err.value.hint
    assert len(err.value.log_tail) == 50 and TRUNCATED not in err.value.log_tail


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (TRUNCATED, "truncated weights"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda out of memory"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda error"),
        ("kernel: Out of memory: Killed process 4242 (python)", "host out of memory"),
    ],
)
def test_known_causes_anywhere_in_a_long_log(line: str, cause: str) -> None:
    lines = ["INFO ok"] * 5000 + [line] + ["INFO more"] * 5000
    t0 = time.monotonic()
    hint = hint_for(lines, fallback="none")
    assert hint.startswith(cause + ":"), hint
    assert time.monotonic() - t0 < 2


def test_control_characters_in_an_error_are_shown_escaped_not_obeyed(tmp_path: Path) -> None:
    """A path with a carriage return or an escape sequence must not rewrite the terminal's error line."""
    res = sparkctl("show", str(tmp_path / "evil\r\x1b[2Kfine.yaml"))
    line = assert_one_error(res, "recipe file not found")
    assert "\r" not in res.stderr and "\x1b" not in res.stderr
    assert "evil\\r\\x1b[2Kfine.yaml" in line


@pytest.mark.parametrize(
    "target",
    ["/tmp/" + "a" * 300 + "/x.yaml", "/tmp/" + "a" * 300 + ".yaml", "/" + "a/" * 3000 + "x.yaml"],
    ids=["component-too-long", "file-name-too-long", "path-too-long"],
)
@pytest.mark.parametrize("where", ["extends", "argument"])
def test_a_recipe_path_too_long_for_the_filesystem_is_one_short_line(
    tmp_path: Path, target: str, where: str
) -> None:
    """The hole: `extends:` (or the path given) longer than NAME_MAX / PATH_MAX was an OSError traceback."""
    path = recipe(tmp_path, "") if where == "argument" else ""
    if where == "extends":
        path = str(tmp_path / "r.yaml")
        Path(path).write_text(f"extends: {target}\nname: r\n")
    res = sparkctl("show", path if where == "extends" else target)
    line = assert_one_error(res, "recipe")
    assert len(line) < 600  # the value is cut, not echoed whole


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null", "/dev/tty"])
def test_special_files_as_a_recipe_are_one_line_and_quick(tmp_path: Path, special: str) -> None:
    if special == "fifo":
        special = str(tmp_path / "pipe.yaml")
        os.mkfifo(special)
    t0 = time.monotonic()
    res = sparkctl("show", special)
    assert_one_error(res)
    assert time.monotonic() - t0 < 5


def test_a_recipe_name_too_long_for_a_file_name_still_has_its_state_lock_and_key_files(
    tmp_path: Path,
) -> None:
    """The hole: a 300-character name validated, then `down`/`up` failed writing `<name>.lock`."""
    from sparkctl.runtimes import state

    path = recipe(tmp_path, "name: " + "n" * 300 + "\n")
    res = sparkctl("down", path)
    assert res.code == 0 and "is not running" in res.stdout, res.stderr
    assert len(state.state_path("n" * 300).name) < 255
    assert state.state_path("n" * 300) != state.state_path("n" * 299 + "m")
