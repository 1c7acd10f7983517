"""One line per problem from a JSON schema, with its key path (ReFrame's site-config style).

Site configs (:mod:`hpcstack.site`) and recipes' validation files
(:mod:`hpcstack.validate.workload`) are checked with it, so both say problems the same way:
``<file>: <key.path>: unknown key``, ``…: missing key``, or jsonschema's own message.
"""

from __future__ import annotations

import re

import jsonschema
import yaml


def problems(schema: dict, data: object, where: str, hints: dict[str, str] | None = None,
             moved: dict[str, str] | None = None) -> list[str]:
    """Validate ``data`` against a draft 2020-12 JSON schema and describe every problem in one line.

    Args:
        schema (dict): the JSON schema.
        data (object): what ``yaml.safe_load`` returned.
        where (str): the file name, to start each line with.
        hints (dict[str, str] | None): for ``patternProperties`` patterns, what a key must look
            like (``"'<site>:<partition>', '*' for any"``), added to "unknown key" lines.
        moved (dict[str, str] | None): key paths that used to be valid, and a note where their
            content went, added to "unknown key" lines.

    Returns:
        list[str]: ``"<where>: <key.path>: <message>"`` lines, sorted by key path; empty when valid.
    """
    hints, moved = hints or {}, moved or {}
    validator = jsonschema.Draft202012Validator(schema)
    lines = []
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        if err.validator == "additionalProperties":
            patterns = list(err.schema.get("patternProperties", {}))
            extra = sorted(str(k) for k in set(err.instance) - set(err.schema.get("properties", {}))
                           if not any(re.search(p, str(k)) for p in patterns))
            for name in extra:
                full = f"{key}.{name}" if err.absolute_path else name
                hint = "".join(f" (expected {hints[p]})" for p in patterns if p in hints)
                lines.append(f"{where}: {full}: unknown key{hint}{moved.get(full, '')}")
            continue
        if err.validator == "required":
            missing = err.message.split("'")[1]
            full = f"{key}.{missing}" if err.absolute_path else missing
            lines.append(f"{where}: {full}: missing key")
            continue
        lines.append(f"{where}: {key}: {err.message}")
    # each problem is one line, whatever the file's keys and values hold
    return [CONTROL.sub(lambda m: repr(m.group())[1:-1], line) for line in lines]


# ------------------------------------------------------------------------------ strict YAML

#: At most this many values (scalars, lists and mappings, each alias counted again at every
#: place it is used) in one loaded file: a few KB of nested aliases ("billion laughs") would
#: otherwise expand to hundreds of MB when the config is copied or written as JSON.
MAX_NODES = 100_000
#: At most this many levels of nested lists and mappings.
MAX_DEPTH = 64
#: Characters no value or key of a config may hold: C0 and C1 control characters (newline, NUL,
#: carriage return, escape, ...) and Unicode line and paragraph separators. Each ends a line or
#: hides text in some generated file (a modulefile, a job script, a comment).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice (the safe loader keeps
    the last one silently) and nesting deeper than :data:`MAX_DEPTH`."""

    def compose_node(self, parent, index):  # noqa: D401 - PyYAML's hook
        depth = getattr(self, "_hpcstack_depth", 0)
        if depth >= MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
        self._hpcstack_depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._hpcstack_depth = depth

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:        # an unhashable key: the base class says so
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key {key!r} (the file gives it twice)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def count_nodes(data: object, limit: int = MAX_NODES) -> int:
    """Count the values in ``data`` as a JSON dump would write them (shared objects again at each
    use), stopping at ``limit + 1``.

    Args:
        data (object): loaded YAML or JSON.
        limit (int): stop counting above this.

    Returns:
        int: the count, at most ``limit + 1``.
    """
    count, todo = 0, [data]
    while todo and count <= limit:
        item = todo.pop()
        count += 1
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return count


def load_yaml(path, what: str = "file"):
    """Read a YAML file strictly: UTF-8 text, no duplicate keys, no deeper than
    :data:`MAX_DEPTH`, no more than :data:`MAX_NODES` values once aliases are expanded.

    Args:
        path (str | pathlib.Path): the file.
        what (str): what the file is, for messages (``"site config"``).

    Returns:
        object: what the file holds (``None`` for an empty file).

    Raises:
        ConfigError: unreadable, not UTF-8, not valid YAML (with line and column), a duplicate
            key, too deep or too large; one line naming the file.
    """
    from hpcstack.errors import ConfigError

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not a UTF-8 text file (byte {exc.start}): a {what} is YAML text"]) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)   # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}: {loc}not valid YAML: {' '.join(str(problem).split())}"]) from None
    except RecursionError:
        raise ConfigError([f"{path}: not valid YAML: nested too deeply"]) from None
    except ValueError as exc:      # e.g. an integer of more than 4300 digits
        raise ConfigError([f"{path}: not a usable value: {' '.join(str(exc).split())[:120]}"]) from None
    if count_nodes(data) > MAX_NODES:
        raise ConfigError([f"{path}: more than {MAX_NODES} values once its aliases are expanded "
                           "(aliases nested in aliases?); write the values out"])
    return data


def value_problems(data: object, where: str, path: tuple = (), text_keys: bool = True) -> list[str]:
    """Lines for every key or string value that holds a control character (:data:`CONTROL`),
    for data nested deeper than :data:`MAX_DEPTH`, and (``text_keys``) for keys that are not
    text (YAML reads ``1:`` or ``true:`` as a number or a boolean, which JSON schema's
    ``propertyNames`` does not check).

    Args:
        data (object): loaded YAML or JSON.
        where (str): the file name, to start each line with.
        text_keys (bool): refuse keys that are not strings.

    Returns:
        list[str]: ``"<where>: <key.path>: ..."`` lines; empty when every value is clean.
    """
    lines, todo = [], [(data, path)]
    while todo:
        item, at = todo.pop()
        key = ".".join(str(p) for p in at) or "(top level)"
        if len(at) > MAX_DEPTH:
            lines.append(f"{where}: {key}: nested more than {MAX_DEPTH} levels deep")
            continue
        if isinstance(item, str):
            if CONTROL.search(item):
                lines.append(f"{where}: {key}: {_short(item)}: holds a control character (newline, "
                             "NUL, ...); values are one line of printable text")
        elif isinstance(item, dict):
            for k, v in item.items():
                if text_keys and not isinstance(k, str):
                    lines.append(f"{where}: {key}: key {_short(str(k))}: a {type(k).__name__}; keys are "
                                 "text (quote it)")
                    continue
                if isinstance(k, str) and CONTROL.search(k):
                    lines.append(f"{where}: {key}: key {_short(k)}: holds a control character")
                    continue
                todo.append((v, (*at, k)))
        elif isinstance(item, (list, tuple)):
            todo.extend((v, (*at, i)) for i, v in enumerate(item))
    return sorted(lines)


def _short(text: str, limit: int = 60) -> str:
    """``repr`` of ``text``, cut to about ``limit`` characters (one line, whatever it holds)."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + "...'"
