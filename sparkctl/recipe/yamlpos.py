"""YAML parsing that remembers where every key and value came from.

pydantic reports errors by path (`serve.max_model_len`); a user needs `file:line:column`. PyYAML's
composer keeps a start mark on every node, so we build plain Python data from the node graph and, on
the side, a map from each path to the mark of the key (or list item) that produced it. The map
survives `extends:` merges and `--set` overrides, so an error always points at the text that set the
offending value.

It is also the boundary against hostile or careless text: everything PyYAML can throw while resolving a
tag (`!!float abc`, `!!int 0x`, `!!bool maybe`) becomes a located UserError, and the size of what the
text expands to is bounded in bytes as well as in nodes, in nesting depth, and per value (a string's
length, an integer's magnitude, no NUL or lone surrogate that no process or file could carry).
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

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise UserError(f"{source}: {size:,} bytes of YAML; a recipe is at most {MAX_TEXT_BYTES:,}")
    # libyaml's composer when present (30x faster; `list` parses every built-in recipe)
    composer = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        node = yaml.compose(text, Loader=composer)
    except RecursionError:  # the pure-Python composer on deeply nested flow collections
        raise UserError(f"{source}: YAML nested deeper than {MAX_DEPTH} levels") from None
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
    return _Builder(source, positions).build(node, ()), positions


# Aliases let a few lines of YAML expand into an exponential tree; no recipe needs more than this.
MAX_NODES = 100_000
# ... or into a few very long strings repeated: a 110 KB anchor used 1000 times is 100 MB of output.
# The biggest built-in recipe expands to ~4 KB; a long inline chat template is ~20 KB.
MAX_EXPANDED_BYTES = 2 * 1024 * 1024
MAX_TEXT_BYTES = 1024 * 1024  # the YAML text itself (a recipe file, or one --set value)
MAX_STRING_CHARS = 256 * 1024  # one scalar
MAX_DEPTH = 64  # nested mappings/lists; a recipe is ~4 deep
MAX_INT = 2**63 - 1  # what any engine flag or size can hold; beyond is a typo or an attack
_INT_TAG = "tag:yaml.org,2002:int"


def _origin(node: Any, source: str) -> Origin:
    return Origin(source, node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Node graph -> plain data, recording each path's origin; refuses recursive or exploding aliases."""

    def __init__(self, source: str, positions: dict[Path_, Origin]) -> None:
        import yaml

        self.source = source
        self.positions = positions
        self.loader = yaml.SafeLoader("")
        self.count = 0
        self.bytes = 0
        self.ancestors: set[int] = set()

    def build(self, node: Any, path: Path_) -> Any:
        import yaml

        self.count += 1
        if self.count > MAX_NODES:
            raise UserError(f"{self.source}: YAML aliases expand to more than {MAX_NODES:,} values")
        if id(node) in self.ancestors:
            raise UserError(f"{_origin(node, self.source)}: recursive YAML alias")
        if len(path) > MAX_DEPTH:
            raise UserError(f"{_origin(node, self.source)}: YAML nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        self.ancestors.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            return self._sequence(node, path)
        finally:
            self.ancestors.discard(id(node))

    def _mapping(self, node: Any, path: Path_) -> dict[str, Any]:
        import yaml

        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            where = _origin(key_node, self.source)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise UserError(f"{where}: YAML merge keys (<<) are not supported; use extends:")
            if not isinstance(key_node, yaml.ScalarNode):
                raise UserError(f"{where}: keys must be strings, got a {key_node.id}")
            key = self.scalar(key_node)
            if not isinstance(key, str):
                raise UserError(f"{where}: keys must be strings, got {key!r}")
            if key in out:
                raise UserError(f"{where}: duplicate key {key!r}")
            child = (*path, key)
            self.positions[child] = where
            out[key] = self.build(value_node, child)
        return out

    def scalar(self, node: Any) -> Any:
        """A scalar through PyYAML's resolver, counted against the expansion budget (aliases included)."""
        self.bytes += len(node.value) + 1
        if self.bytes > MAX_EXPANDED_BYTES:
            raise UserError(
                f"{_origin(node, self.source)}: YAML expands to more than {MAX_EXPANDED_BYTES:,} bytes "
                "(an anchor repeated too often?)"
            )
        return _scalar(node, self.source, self.loader)

    def _sequence(self, node: Any, path: Path_) -> list[Any]:
        items = []
        for i, item in enumerate(node.value):
            child = (*path, i)
            self.positions[child] = _origin(item, self.source)
            items.append(self.build(item, child))
        return items


def _scalar(node: Any, source: str, loader: Any) -> Any:
    """Let PyYAML's safe constructor resolve ints, floats, bools and nulls, as yaml.safe_load would.

    The constructors raise bare ValueError/KeyError/OverflowError for a tag with a value it cannot
    have (`!!float abc`, `!!int 0x`, `!!bool maybe`): those are the user's text, so they are located.
    """
    import yaml

    where = _origin(node, source)
    raw = node.value
    if len(raw) > MAX_STRING_CHARS:
        raise UserError(f"{where}: a value of {len(raw):,} characters; at most {MAX_STRING_CHARS:,}")
    if node.tag == _INT_TAG and len(raw) > 40:  # before int(): 5000 digits is slow and then an error
        raise UserError(f"{where}: integer {_short(raw)} is out of range (at most {MAX_INT:,})")
    try:
        value = loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise UserError(f"{where}: {exc.problem}") from None
    except (ValueError, KeyError, TypeError, OverflowError, ArithmeticError):
        tag = node.tag.rsplit(":", 1)[-1]
        raise UserError(f"{where}: {_short(raw)} is not a valid !!{tag}") from None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise UserError(f"{where}: integer {_short(raw)} is out of range (at most {MAX_INT:,})")
    if isinstance(value, str):
        if "\0" in value:
            raise UserError(f"{where}: a NUL character (\\0) cannot be passed to a process or a file")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{where}: {_short(raw)} holds a lone surrogate, not text") from None
    return value


def _short(raw: str) -> str:
    """A value as an error message quotes it: repr, cut to a readable length."""
    text = repr(raw)
    return text if len(text) <= 42 else text[:30] + "..." + text[-8:]
