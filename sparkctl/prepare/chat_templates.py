"""Chat templates shipped with sparkctl, by name (templates/NAME.jinja); kept import-light for the schema."""

from __future__ import annotations

from pathlib import Path

from sparkctl.errors import UserError

TEMPLATES_DIR = Path(__file__).parent / "templates"


def shipped_templates() -> list[str]:
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))


def template_text(name: str) -> str:
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        raise UserError(
            f"model.prepare.chat_template: no shipped template {name!r}",
            hint=f"valid: {', '.join(shipped_templates()) or 'none'}",
        )
    return path.read_text()
