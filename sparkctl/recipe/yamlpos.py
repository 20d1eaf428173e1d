"""YAML parsing that remembers where every key and value came from.

pydantic reports errors by path (`serve.max_model_len`); a user needs `file:line:column`. PyYAML's
composer keeps a start mark on every node, so we build plain Python data from the node graph and, on
the side, a map from each path to the mark of the key (or list item) that produced it. The map
survives `extends:` merges and `--set` overrides, so an error always points at the text that set the
offending value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkctl.errors import UserError

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Origin:
    """Where a value was written: a file position, or a `--set` override."""

    source: str  # file path as the user gave it, or "--set"
    line: int = 0  # 1-based; 0 when not a file position
    column: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.source}:{self.line}:{self.column}"
        return self.source


def parse_yaml(text: str, source: str) -> tuple[Any, dict[Path_, Origin]]:
    """Parse one YAML document into plain data plus a path -> Origin map.

    Raises UserError with `file:line:column` for malformed YAML, duplicate keys (which PyYAML would
    otherwise resolve silently, last one wins) and non-string keys.
    """
    import yaml

    # libyaml's composer when present (30x faster; `list` parses every built-in recipe)
    composer = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        node = yaml.compose(text, Loader=composer)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or exc.context or "malformed YAML"
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:  # pragma: no cover - every PyYAML parse error is marked
        raise UserError(f"{source}: invalid YAML: {exc}") from None
    positions: dict[Path_, Origin] = {}
    if node is None:
        return None, positions
    positions[()] = _origin(node, source)
    loader = yaml.SafeLoader("")
    return _build(node, (), source, positions, loader), positions


def _origin(node: Any, source: str) -> Origin:
    return Origin(source, node.start_mark.line + 1, node.start_mark.column + 1)


def _build(node: Any, path: Path_, source: str, positions: dict[Path_, Origin], loader: Any) -> Any:
    import yaml

    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise UserError(
                    f"{_origin(key_node, source)}: YAML merge keys (<<) are not supported; use extends:"
                )
            key = _scalar(key_node, source, loader) if isinstance(key_node, yaml.ScalarNode) else key_node
            if not isinstance(key, str):
                raise UserError(f"{_origin(key_node, source)}: keys must be strings, got {key!r}")
            if key in out:
                raise UserError(f"{_origin(key_node, source)}: duplicate key {key!r}")
            child = (*path, key)
            positions[child] = _origin(key_node, source)
            out[key] = _build(value_node, child, source, positions, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            child = (*path, i)
            positions[child] = _origin(item, source)
            items.append(_build(item, child, source, positions, loader))
        return items
    return _scalar(node, source, loader)


def _scalar(node: Any, source: str, loader: Any) -> Any:
    """Let PyYAML's safe constructor resolve ints, floats, bools and nulls, as yaml.safe_load would."""
    import yaml

    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise UserError(f"{_origin(node, source)}: {exc.problem}") from None
