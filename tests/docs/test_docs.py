"""The README's command table and the documentation's links, checked against what they describe.

Why: the README is the first page a user reads and docs/ is where it sends them; a command added without its
line, a summary edited in one place only, or a page moved under a link would each go unnoticed until a reader
found it. Both checks read files and the click tree only (no process), so they run in `make test-fast`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import click
import pytest

from sparkctl.cli import COMMANDS, cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
# The pages whose links are checked: the README, every docs page, and the READMEs they hand over to.
PAGES = [README, *sorted(DOCS.glob("*.md")), REPO / "kernels" / "README.md", REPO / "docker" / "README.md"]
BEGIN, END = "<!-- commands:begin -->", "<!-- commands:end -->"


def command_rows() -> list[tuple[str, str]]:
    """(`sparkctl NAME [SUB]`, its --help summary) for every command and subcommand, in the CLI's order."""
    ctx = click.Context(cli)
    rows: list[tuple[str, str]] = []
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None, name
        rows.append((f"sparkctl {name}", command.get_short_help_str(limit=1000)))
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                subcommand = command.get_command(ctx, sub)
                assert subcommand is not None, f"{name} {sub}"
                rows.append((f"sparkctl {name} {sub}", subcommand.get_short_help_str(limit=1000)))
    return rows


def command_table() -> str:
    """The README's table between the commands markers, as the CLI's help makes it."""
    lines = ["| command | what it does |", "|---|---|"]
    for cmd, summary in command_rows():
        escaped = summary.replace("|", "\\|")  # a pipe in a summary would end the cell
        lines.append(f"| `{cmd}` | {escaped} |")
    return "\n".join(lines)


def test_the_readme_command_table_is_every_commands_help() -> None:
    text = README.read_text()
    assert BEGIN in text and END in text, f"README.md lost its {BEGIN} / {END} markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    expected = command_table()
    assert table == expected, (
        "README.md's command table and the commands' --help disagree; the table the help makes is:\n"
        + expected
    )


def test_the_command_table_knows_a_missing_command() -> None:
    """The comparison sees a command the table lacks (so the test above can fail)."""
    table = command_table()
    assert "`sparkctl up` | Start a recipe" in table
    assert table.replace("| `sparkctl sync` |", "| `sparkctl sink` |") != table


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())  # punctuation goes, `_` and `-` stay
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    fence = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.+)$", line)):
            anchors.add(_slug(m.group(1)))
    return anchors


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_docs_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ... are not checked offline
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: " + "; ".join(broken)


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _links(README)}
    orphans = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not orphans, f"docs pages no README link reaches: {orphans}"


def test_the_architecture_diagram_names_every_layer() -> None:
    """docs/architecture.md draws the import-linter contract; a layer added there must be drawn too."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "sparkctl-layers")
    diagram = (DOCS / "architecture.md").read_text()
    for layer in contract["layers"]:
        assert layer in diagram, f"docs/architecture.md does not draw the layer {layer!r}"


def test_readme_stays_short() -> None:
    lines = README.read_text().count("\n")
    assert lines < 200, f"README.md is {lines} lines: move detail into docs/ (the README is the one screen)"
