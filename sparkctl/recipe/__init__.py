"""Recipes: YAML files describing one servable model, validated by a strict schema.

`load_recipe` and `list_recipes` are the entry points; the schema lives in `schema.py`. Importing this
package is cheap: pydantic is imported on first use, so `sparkctl --help` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkctl.recipe.catalog import RecipeEntry, list_recipes
from sparkctl.recipe.loader import builtin_names, load_recipe, recipe_dirs

if TYPE_CHECKING:
    from sparkctl.recipe.schema import Recipe

__all__ = ["Recipe", "RecipeEntry", "builtin_names", "list_recipes", "load_recipe", "recipe_dirs"]


def __getattr__(name: str) -> Any:
    if name == "Recipe":
        from sparkctl.recipe.schema import Recipe

        return Recipe
    raise AttributeError(name)
