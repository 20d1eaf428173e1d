#!/usr/bin/env python3
"""Run the fault-injection suite (tests/safety) and write its matrix (case, result) into docs/reliability.md.

    .venv/bin/python scripts/fault-matrix.py          # run, then rewrite the table in docs/reliability.md
    .venv/bin/python scripts/fault-matrix.py --check  # run, print the table, exit 1 if a case fails

The table sits between the `fault-matrix` markers of docs/reliability.md; each row is one
test (parametrized cases grouped), its result is what this run of it on this machine gave.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "docs" / "reliability.md"  # the page holding the table
BEGIN, END = "<!-- fault-matrix:begin -->", "<!-- fault-matrix:end -->"
AREAS = {
    "test_render_quoting": "rendering",
    "test_input_limits": "input limits",
    "test_fuzz_cli": "fuzz",
    "test_lifecycle_safety": "lifecycle",
    "test_api_keys": "API keys",
    "test_disk_faults": "disk faults",
    "test_doctor_bundle": "bug bundle",
    "test_watchdog": "memory watchdog",
    "test_docker_safety": "docker runtime",
    "test_persist_native": "persist (systemd)",
    "test_ctrl_c_stages": "Ctrl-C",
    "test_double_ctrl_c": "Ctrl-C",
    "test_bench_up_interrupt": "Ctrl-C",
    "test_key_every_route": "API keys",
    "test_identity": "process identity",
    "test_damaged_state": "damaged state",
}


def run() -> Path:
    xml = Path(tempfile.mkdtemp()) / "junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/safety",
            "tests/docker/test_docker_safety.py",
            f"--junitxml={xml}",
        ],
        cwd=REPO,
        check=False,
    )
    return xml


def rows(xml: Path) -> list[tuple[str, str, str]]:
    grouped: OrderedDict[tuple[str, str], list[str]] = OrderedDict()
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = re.sub(r"\[.*\]$", "", case.get("name", ""))
        if case.find("skipped") is not None:
            result = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            result = "FAILED"
        else:
            result = "pass"
        grouped.setdefault((module, name), []).append(result)
    out = []
    for (module, name), results in grouped.items():
        n = len(results)
        passed = results.count("pass")
        if "FAILED" in results:
            verdict = f"FAILED ({n - passed} of {n})"
        elif "skipped" in results and not passed:
            verdict = "skipped"
        else:
            verdict = "pass" if n == 1 else f"pass ({n} cases)"
        case_text = name.removeprefix("test_").replace("_", " ")
        out.append((AREAS.get(module, module), case_text, verdict))
    return out


def table(data: list[tuple[str, str, str]]) -> str:
    lines = ["| area | case | result |", "|---|---|---|"]
    lines += [f"| {a} | {c} | {r} |" for a, c, r in data]
    return "\n".join(lines)


def main() -> int:
    data = rows(run())
    text = table(data)
    if "--check" in sys.argv:
        print(text)
    else:
        readme = README.read_text()
        start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
        README.write_text(readme[:start] + "\n" + text + "\n" + readme[end:])
        print(f"wrote {len(data)} rows into {README}")
    return 1 if any(r.startswith("FAILED") for _, _, r in data) else 0


if __name__ == "__main__":
    sys.exit(main())
