"""What a command line changes in a recipe: `--set KEY.PATH=VALUE` strings and typed flags (`--port`, `--runtime`).

`--set` values are YAML and are applied to the recipe's data before validation, so an error points at the
flag like a file error points at its line (loader.apply_overrides). The typed flags are already parsed by
click; they are applied to the validated Recipe model and the result validated again (a `--runtime docker`
for a recipe with no container.image is refused), never turned back into text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkctl.errors import UserError


@dataclass(frozen=True)
class Overrides:
    """Every change a command makes to a recipe; the one value that crosses from the CLI to the core."""

    sets: tuple[str, ...] = ()  # --set KEY.PATH=VALUE, in order (a later one wins)
    port: int | None = None  # --port N; 0 (any free port) is resolved to a real one by `up` first
    runtime: str | None = None  # --runtime native|docker

    @property
    def port_asked(self) -> bool:
        """Did the user name a port (`--port N`, `--set serve.port=N`) rather than take the recipe's?"""
        if self.port is not None:
            return self.port != 0  # 0: any free port will do
        return any(s.split("=", 1)[0].strip() == "serve.port" for s in self.sets)


def load(source: str, overrides: Overrides | Sequence[str] = ()) -> Any:
    """A recipe name or file with every override applied: the validated Recipe the planner takes."""
    from sparkctl.recipe.loader import load_recipe

    ov = overrides if isinstance(overrides, Overrides) else Overrides(sets=tuple(overrides))
    return apply(load_recipe(source, ov.sets), ov)


def apply(recipe: Any, overrides: Overrides) -> Any:
    """The Recipe with the typed flags applied and validated again."""
    from pydantic import ValidationError

    from sparkctl.recipe.schema import Recipe

    changed: list[str] = []
    data = recipe.model_dump(by_alias=True, exclude_unset=True)
    if overrides.runtime is not None:
        data["runtime"] = overrides.runtime
        changed.append(f"--runtime {overrides.runtime}")
    if overrides.port is not None:
        data.setdefault("serve", {})["port"] = overrides.port
        changed.append(f"--port {overrides.port}")
    if not changed:
        return recipe
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise UserError(
            f"recipe {recipe.name} with {' '.join(changed)}: {where + ': ' if where else ''}{msg}",
            hint="`sparkctl schema` prints every field with its description",
        ) from None
