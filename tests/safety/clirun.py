"""Run the real `sparkctl` entry point in-process: fast enough for a thousand fuzzed invocations.

`sparkctl.cli.main` is what the console script calls (it turns every SparkctlError into one line and an
exit code), so it is called here, not `cli` directly; click's CliRunner isolates the streams.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from click.testing import CliRunner

from sparkctl.cli import main


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float


def sparkctl(*argv: str) -> Result:
    runner = CliRunner()
    t0 = time.monotonic()
    with runner.isolation() as (out, err, _):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace") if err is not None else ""
    return Result(code, stdout, stderr, time.monotonic() - t0)


def assert_one_error(res: Result, *fragments: str) -> str:
    """Exit 2, and stderr is one `error:` line (plus at most a `hint:` line), with no traceback."""
    assert res.code == 2, (res.code, res.stderr[-2000:])
    lines = res.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), res.stderr[-2000:]
    assert all(line.startswith(("hint: ", "  ")) for line in lines[1:]), res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
