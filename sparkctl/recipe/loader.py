"""Recipe name or file -> validated Recipe: `extends:` merging, `--set` overrides, located errors.

Resolution order: the base named by `extends:` (recursively), then the file itself (deep merge: mappings
merge key by key, anything else replaces), then each `--set key.path=value` in the order given. The
merged data is validated once; every pydantic error is reported at the file:line:column (or `--set`)
that wrote the offending key, with a difflib suggestion for unknown keys.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkctl.errors import UserError
from sparkctl.recipe.yamlpos import MAX_DEPTH, Origin, Path_, parse_yaml

MAX_EXTENDS_DEPTH = 16


def recipe_dirs() -> list[Path]:
    """Where built-in recipes live, first match wins.

    `SPARKCTL_RECIPES_DIR` (tests, users with their own catalog), then the checkout's `recipes/` (an
    editable install), then `<prefix>/share/sparkctl/recipes` (a wheel installs them there as data files).
    """
    dirs: list[Path] = []
    env = os.environ.get("SPARKCTL_RECIPES_DIR")
    if env:
        dirs.extend(Path(p) for p in env.split(os.pathsep) if p)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():  # a source checkout, not site-packages of an installed wheel
        dirs.append(root / "recipes")
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        dirs.append(Path(prefix) / "share" / "sparkctl" / "recipes")
    return [d for d in dirs if d.is_dir()]


def builtin_names() -> list[str]:
    names: dict[str, None] = {}
    for d in recipe_dirs():
        for f in sorted(d.glob("*.yaml")):
            names.setdefault(f.stem, None)
    return sorted(names)


def find_builtin(name: str) -> Path | None:
    for d in recipe_dirs():
        candidate = d / f"{name}.yaml"
        try:
            if candidate.is_file():
                return candidate
        except OSError:  # a name too long for a file name is no built-in's
            continue
    return None


def _looks_like_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or os.sep in name or "/" in name or name.startswith(".")


def resolve_source(name_or_path: str, *, relative_to: Path | None = None) -> Path:
    """A built-in recipe name or a YAML path -> the file, or a UserError listing the valid names."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        if not _is_file(path):
            raise UserError(f"recipe file not found: {path}")
        return path
    found = find_builtin(name_or_path)
    if found is not None:
        return found
    local = Path(name_or_path)
    if relative_to is None and _is_file(local):
        return local
    names = builtin_names()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserError(
        f"unknown recipe {name_or_path!r}; {hint}built-in recipes: {', '.join(names) or '(none found)'}",
        hint="pass a path to a .yaml file for your own recipe; `sparkctl list` shows the built-ins",
    )


def _is_file(path: Path) -> bool:
    """Path.is_file, with what the filesystem refuses to look up (a name past NAME_MAX or PATH_MAX, a
    directory we may not search) said as a recipe error instead of an OSError."""
    try:
        return path.is_file()
    except OSError as exc:
        raise UserError(f"cannot read recipe {path}: {exc.strerror or exc}") from None


def _read(path: Path) -> tuple[dict[str, Any], dict[Path_, Origin]]:
    from sparkctl.recipe.yamlpos import MAX_TEXT_BYTES

    try:
        with path.open("rb") as fh:  # bounded: a recipe path may name a huge file or /dev/zero
            blob = fh.read(MAX_TEXT_BYTES + 1)
        if len(blob) > MAX_TEXT_BYTES:
            raise UserError(f"{path}: larger than {MAX_TEXT_BYTES:,} bytes; not a recipe")
        text = blob.decode("utf-8")
    except OSError as exc:
        raise UserError(f"cannot read recipe {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    data, positions = parse_yaml(text, str(path))
    if data is None:
        raise UserError(f"{path}: empty recipe", hint="start from `sparkctl show tiny` or `sparkctl schema`")
    if not isinstance(data, dict):
        raise UserError(f"{path}:1:1: a recipe is a mapping of keys, got {type(data).__name__}")
    return data, positions


def _merge(
    base: Any, base_pos: dict[Path_, Origin], over: Any, over_pos: dict[Path_, Origin], path: Path_ = ()
) -> Any:
    """Deep-merge `over` onto `base`; positions of everything `over` sets replace those of `base`."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            child = (*path, key)
            if key in out:
                out[key] = _merge(out[key], base_pos, value, over_pos, child)
            else:
                out[key] = value
                _take_positions(base_pos, over_pos, child)
            if child in over_pos:
                base_pos[child] = over_pos[child]
        return out
    _drop_positions(base_pos, path)
    _take_positions(base_pos, over_pos, path)
    return over


def _take_positions(into: dict[Path_, Origin], src: dict[Path_, Origin], prefix: Path_) -> None:
    n = len(prefix)
    for p, origin in src.items():
        if p[:n] == prefix:
            into[p] = origin


def _drop_positions(into: dict[Path_, Origin], prefix: Path_) -> None:
    n = len(prefix)
    for p in [p for p in into if p[:n] == prefix and len(p) > n]:
        del into[p]


def _load_layers(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[Path_, Origin]]:
    """Read one file and, first, whatever it extends; detects cycles and runaway chains."""
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise UserError(f"extends cycle: {cycle}")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise UserError(f"{path}: extends chain deeper than {MAX_EXTENDS_DEPTH}")
    data, positions = _read(path)
    parent = data.pop("extends", None)
    origin = positions.pop(("extends",), Origin(str(path)))
    if parent is None:
        return data, positions
    if not isinstance(parent, str) or not parent:
        raise UserError(f"{origin}: extends must be a recipe name or a relative path to a .yaml file")
    try:
        parent_path = resolve_source(parent, relative_to=path.parent)
    except UserError as exc:
        raise UserError(f"{origin}: {exc}", hint=exc.hint) from None
    base, base_pos = _load_layers(parent_path, (*chain, resolved))
    # the child's name is its own: a variant never inherits the base's name
    base.pop("name", None)
    _drop_positions(base_pos, ("name",))
    base_pos.pop(("name",), None)
    merged = _merge(base, base_pos, data, positions)
    base_pos[()] = positions.get((), Origin(str(path)))
    return merged, base_pos


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`serve.max_model_len=32768` -> (("serve", "max_model_len"), 32768); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"{_set_label(text)}: expected key.path=value", hint="e.g. --set serve.port=8100")
    parts = tuple(key.split("."))
    if any(not p for p in parts):
        raise UserError(f"{_set_label(text)}: empty segment in key path")
    if len(parts) > MAX_DEPTH:
        raise UserError(f"{_set_label(text)}: key path deeper than {MAX_DEPTH} levels")
    if not raw.strip():
        return parts, ""
    # The same parser (and limits) as a recipe file: a tag with a bad value, a 5000-digit integer or an
    # anchor bomb in --set is one located line, like in a file.
    value, _ = parse_yaml(raw, _set_label(text))
    return parts, value


def _set_label(text: str) -> str:
    """How an error names a --set: in full, unless it is too long to read on one line."""
    if len(text) <= 120:
        return f"--set {text!r}"
    key = text.partition("=")[0][:60]
    return f"--set {key}=<{len(text) - len(key) - 1:,} characters>"


def apply_overrides(
    data: dict[str, Any], positions: dict[Path_, Origin], overrides: Sequence[str]
) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        label = _set_label(text)
        # where a validation error points: the plain text when it reads as one line, else its repr
        origin = Origin(label.replace(repr(text), text) if text.isprintable() else label)
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = {}
                node[part] = nxt
            elif not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise UserError(f"{_set_label(text)}: {where} is not a mapping, cannot set {'.'.join(parts)}")
            node = nxt
            positions.setdefault(parts[: i + 1], origin)
        _drop_positions(positions, parts)
        node[parts[-1]] = value
        for sub in _paths(value, parts):
            positions[sub] = origin
    return data


def _paths(value: Any, prefix: Path_) -> list[Path_]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def load_recipe(name_or_path: str, overrides: Sequence[str] = ()) -> Any:
    """A built-in recipe name or a YAML file path (+ `--set` overrides) -> a validated Recipe.

    Raises UserError pointing at file:line:column for anything wrong with the text.
    """
    path = resolve_source(name_or_path)
    data, positions = _load_layers(path, ())
    data = apply_overrides(data, positions, overrides)
    data.setdefault("name", path.stem)
    return validate_data(data, positions, str(path))


def validate_data(data: dict[str, Any], positions: dict[Path_, Origin], source: str) -> Any:
    from pydantic import ValidationError

    from sparkctl.recipe.schema import Recipe

    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": _engine_loc(tuple(e.get("loc", ())), data)} for e in exc.errors()]
        located = [_format_error(err, positions, source) for err in _merge_union_errors(errors, data)]
        located.sort(key=lambda item: item[0])
        lines = [one_line(text) for _, text in located]
        first, rest = lines[0], lines[1:]
        message = first if not rest else first + "".join(f"\n  {line}" for line in rest)
        raise UserError(message, hint="`sparkctl schema` prints every field with its description") from None


def one_line(text: str) -> str:
    """A message with the user's keys and values in it, kept to one line: a key holding a newline or a
    vertical tab must not start a second line that reads like another message."""
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode() for ch in text
    )


def _engine_loc(loc: Path_, data: Any) -> Path_:
    """Where an error in the engine block is in the file: past the tag pydantic adds for the engine union
    (`engine.llama.cpp.serve...`), and at `serve.llama_cpp...` when the recipe wrote its section that way."""
    from sparkctl.recipe.schema import LEGACY_SERVE_SECTIONS

    if len(loc) >= 2 and loc[0] == "engine" and loc[1] in {*LEGACY_SERVE_SECTIONS.values(), "vllm"}:
        loc = ("engine", *loc[2:])
    engine = data.get("engine") if isinstance(data, dict) else None
    serve = data.get("serve") if isinstance(data, dict) else None
    if loc[:2] == ("engine", "serve") and not (isinstance(engine, dict) and "serve" in engine):
        for key in LEGACY_SERVE_SECTIONS:
            if isinstance(serve, dict) and key in serve:
                return ("serve", key, *loc[2:])
    return loc


def _data_loc(loc: Path_, data: Any, kind: str) -> tuple[Path_, Path_]:
    """Split a pydantic loc into the path through the data and the union-branch tags pydantic appends
    (e.g. `env.A.str`, `env.A.int` for a `str | int` field): tags are segments past a scalar value."""
    path: list[str | int] = []
    tags: list[str | int] = []
    cur: Any = data
    present = True
    for seg in loc:
        in_dict = isinstance(cur, dict) and seg in cur
        in_list = isinstance(cur, list) and isinstance(seg, int) and seg < len(cur)
        if present and (in_dict or in_list):
            cur = cur[seg]
            path.append(seg)
        elif present and isinstance(cur, dict) and kind == "missing":
            path.append(seg)  # a required key that is absent: the error is about it
            present = False
        else:
            tags.append(seg)
    return tuple(path), tuple(tags)


def _merge_union_errors(errors: list[Any], data: Any) -> list[Any]:
    """One error per value: the branches of a failed union become a single 'expected a or b' error."""
    merged: dict[Path_, Any] = {}
    order: list[Path_] = []
    for err in errors:
        path, tags = _data_loc(tuple(err.get("loc", ())), data, err.get("type", ""))
        if not tags:
            merged[(*path, id(err))] = err
            order.append((*path, id(err)))
            continue
        if path in merged:
            merged[path]["_expected"].append(str(tags[0]))
            continue
        merged[path] = {**err, "loc": path, "type": "union", "_expected": [str(tags[0])]}
        order.append(path)
    out = []
    for key in order:
        err = merged[key]
        if err.get("type") == "union":
            kinds = " or ".join(dict.fromkeys(err["_expected"]))
            got = err.get("input")
            err = {**err, "msg": f"expected {kinds}, got {type(got).__name__} {got!r}"}
        out.append(err)
    return out


def _format_error(
    err: Any, positions: dict[Path_, Origin], source: str
) -> tuple[tuple[int, str, int, int], str]:
    """One pydantic error -> (sort key: file positions first, in text order; then --set) and its line."""
    loc: Path_ = tuple(err.get("loc", ()))
    origin = _closest_origin(loc, positions) or Origin(source)
    key = (0 if origin.line else 1, origin.source, origin.line, origin.column)
    return key, _error_text(err, loc, origin)


def _error_text(err: Any, loc: Path_, origin: Origin) -> str:
    dotted = ".".join(str(p) for p in loc) or "(recipe)"
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        parent = ".".join(str(p) for p in loc[:-1]) or "the top level"
        msg = f"unknown key {key!r} in {parent}"
        if close:
            msg += f"; did you mean {close[0]!r}?"
        elif known:
            msg += f" (valid: {', '.join(known)})"
        return f"{origin}: {msg}"
    if kind == "missing":
        return f"{origin}: {dotted}: required field is missing"
    message = err.get("msg", "invalid value")
    message = message.removeprefix("Value error, ")
    if kind in ("model_type", "dict_type") and "input" in err:
        message = f"expected a mapping, got {type(err['input']).__name__}"
    elif "input" in err and kind.endswith("_type"):
        message = f"{message}, got {type(err['input']).__name__} {err['input']!r}"
    if not loc:  # a rule about the whole recipe: its message names the fields
        return f"{origin}: {message}"
    return f"{origin}: {dotted}: {message}"


def _closest_origin(loc: Path_, positions: dict[Path_, Origin]) -> Origin | None:
    """The position of the deepest written prefix of `loc` (a missing key points at its parent)."""
    # pydantic puts the literal/union branch name in loc for some types; skip segments not in the data
    for n in range(len(loc), -1, -1):
        origin = positions.get(tuple(loc[:n]))
        if origin is not None:
            return origin
    return None


def _known_keys(loc: Path_) -> list[str]:
    """Field names (YAML spelling) of the model reached by walking `loc` from Recipe."""
    from pydantic import BaseModel

    from sparkctl.recipe.schema import Recipe

    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = _field_by_key(model, str(part))
        model = _model_of(field.annotation) if field is not None else None
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _field_by_key(model: Any, key: str) -> Any:
    for name, f in model.model_fields.items():
        if key in (name, f.alias):
            return f
    return None


def _model_of(annotation: Any) -> Any:
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
