"""One line per problem from a JSON schema, with its key path (ReFrame's site-config style).

Site configs (:mod:`hpcstack.site`) and recipes' validation files
(:mod:`hpcstack.validate.workload`) are checked with it, so both say problems the same way:
``<file>: <key.path>: unknown key``, ``…: missing key``, or jsonschema's own message.
"""

from __future__ import annotations

import re

import jsonschema


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
    return lines
