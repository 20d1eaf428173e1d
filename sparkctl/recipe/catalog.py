"""The built-in recipe catalog as rows a table or a script can use."""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.errors import UserError


@dataclass(frozen=True)
class RecipeEntry:
    """One line of `sparkctl list`; `error` is set (and the rest mostly empty) for a broken recipe file."""

    name: str
    path: str
    model: str = ""
    format: str = ""
    quant: str = ""
    size_bytes: int | None = None
    size_is_estimate: bool = False
    engine: str = ""
    runtime: str = ""
    device: str = ""
    nodes: int = 1
    description: str = ""
    error: str | None = None


def list_recipes() -> list[RecipeEntry]:
    """Every built-in recipe, validated; a broken one is listed with its error instead of aborting."""
    from sparkctl.recipe.loader import builtin_names, find_builtin, load_recipe

    entries: list[RecipeEntry] = []
    for name in builtin_names():
        path = find_builtin(name)
        try:
            recipe = load_recipe(name)
        except UserError as exc:
            entries.append(RecipeEntry(name=name, path=str(path), error=str(exc).splitlines()[0]))
            continue
        m = recipe.model
        size, estimate = m.expected_bytes, False
        if size is None and recipe.memory.weights_bytes is not None:
            size, estimate = recipe.memory.weights_bytes * recipe.cluster.nodes, True
        if m.repo:
            source = m.repo + (f"@{m.revision}" if m.revision else "")
        elif m.path:
            source = m.path
        else:
            source = f"generated: {m.generate}"
        entries.append(
            RecipeEntry(
                name=recipe.name,
                path=str(path),
                model=source,
                format=m.format,
                quant=m.quant or "",
                size_bytes=size,
                size_is_estimate=estimate,
                engine=recipe.engine.name + (f" {recipe.engine.version}" if recipe.engine.version else ""),
                runtime=recipe.runtime,
                device=recipe.engine.device,
                nodes=recipe.cluster.nodes,
                description=recipe.description,
            )
        )
    return entries
