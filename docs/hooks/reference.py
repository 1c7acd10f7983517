"""MkDocs hook: the reference pages, generated from the code at every build.

* ``reference/site-config.md``: every key of :data:`hpcstack.site.SCHEMA` with its type, allowed
  values, default, an example from the shipped site configs, what it is for
  (:mod:`hpcstack.site_keys`) and which recipes use it (the recipes on the search path, loaded
  for the ``localhost`` site, and the components they list);
* ``reference/cli.md``: every command and option of :func:`hpcstack.cli.build_parser`, and of the
  parsers that commands hand their words to (``hpcstack action``:
  :func:`hpcstack.install.verbs.build_parser`, :data:`DELEGATED`);
* ``reference/api.md``: the recipe API: the façade :mod:`hpcstack.recipe_api`, then one
  mkdocstrings block per module of ``hpcstack.install.components`` (the ``Validation`` component
  and its backends among them) and :mod:`hpcstack.recipe`.

A new key, command or component appears without an edit here. The pages are
``File.generated`` (MkDocs 1.6): nothing is written into ``docs/``. Run as a script, it prints
one page (``python docs/hooks/reference.py site-config``).

What the code does not say fails the build: a site-config key without a description in
:mod:`hpcstack.site_keys`, a recipe on the search path that does not load for ``localhost``, a
command that hands its words to a parser :data:`DELEGATED` does not name. Each is an error of
the ``mkdocs`` logger, which ``strict: true`` (mkdocs.yml, ``mkdocs build --strict``) turns into
a failed build, ``--quiet`` or not; a page function called without a ``problems`` list raises
:class:`ReferenceProblems` instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

import yaml

#: Generated page path (relative to docs/) -> function returning its Markdown; each takes
#: ``problems`` (a list to append to, or None: raise :class:`ReferenceProblems`).
PAGES = {}

#: Commands that hand their words to a parser of their own (``hpcstack action VERB …``): command
#: name -> (the module to import first, ``module:function`` returning that parser).
DELEGATED = {"action": ("hpcstack.install.components", "hpcstack.install.verbs:build_parser")}

log = logging.getLogger("mkdocs.hooks.reference")


class ReferenceProblems(Exception):
    """What the code does not document, one line each (:attr:`problems`).

    Args:
        problems (list[str]): the lines.
    """

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _report(found: list[str], problems: list[str] | None) -> None:
    """Hand ``found`` to the caller's ``problems`` list, or raise them when it gave none."""
    if problems is not None:
        problems.extend(found)
    elif found:
        raise ReferenceProblems(found)


def _page(path: str):
    def register(fn):
        PAGES[path] = fn
        return fn
    return register


# --- site-config keys ------------------------------------------------------------------------

def _walk(schema: dict, prefix: str = "", required: tuple = ()):
    """Yield ``(key path, its schema, required?)`` depth first, in the schema's order."""
    for key, sub in schema.get("properties", {}).items():
        path = prefix + key
        yield path, sub, key in schema.get("required", ())
        yield from _walk(sub, path + ".")


def _type(sub: dict) -> str:
    if "enum" in sub:
        return "one of the values"
    types = sub.get("type", "any")
    types = types if isinstance(types, list) else [types]
    words = []
    for t in types:
        if t == "array":
            words.append(f"list of {_type(sub.get('items', {}))}")
        elif t == "object" and isinstance(sub.get("additionalProperties"), dict):
            words.append(f"map of names to {_type(sub['additionalProperties'])}")
        elif t == "object":
            words.append("mapping")
        else:
            words.append(t)
    return " or ".join(words)


def _allowed(sub: dict) -> str:
    parts = []
    if "enum" in sub:
        parts.append(", ".join(f"`{v}`" for v in sub["enum"]))
    if "const" in sub:
        parts.append(f"`{sub['const']}`")
    if "pattern" in sub:
        parts.append(f"matches `{sub['pattern']}`")
    if "minimum" in sub:
        parts.append(f"≥ {sub['minimum']}")
    if "minLength" in sub and "pattern" not in sub:
        parts.append("not empty")
    items = sub.get("items")
    if isinstance(items, dict) and "minimum" in items:
        parts.append(f"each ≥ {items['minimum']}")
    return "; ".join(parts) or "any"


def _lookup(data, path: str):
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _shipped_sites() -> list[tuple[str, dict]]:
    """The built-in site configs, ``localhost`` first, as loaded YAML."""
    from hpcstack.repos import SITES, default_search_path
    entries = [e for e in default_search_path().entries(SITES) if e.repo.origin == "built-in"]
    entries.sort(key=lambda e: (e.name != "localhost", e.name))
    return [(e.name, yaml.safe_load(e.path.read_text())) for e in entries]


def _recipes_by_component(problems: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The recipes on the search path and, per component class name (with its bases), the recipes
    that list one. Each recipe is loaded for the localhost site; one that does not load is a
    problem (appended to ``problems``): the page would otherwise say less than the recipes do."""
    from hpcstack.recipe import load_recipe
    from hpcstack.repos import RECIPES, default_search_path
    from hpcstack.site import load_site
    site = load_site("localhost")
    names, users = [], {}
    for spec in [e.name for e in default_search_path().entries(RECIPES)]:
        try:
            recipe = load_recipe(spec, site)
        except Exception as exc:     # a recipe that does not load for localhost fails the build
            problems.append(f"recipe {spec} does not load for the localhost site: "
                            f"{type(exc).__name__}: {exc}".replace("\n", "; "))
            continue
        names.append(spec)
        for component in getattr(recipe, "components", ()):
            for cls in type(component).__mro__:
                users.setdefault(cls.__name__, [])
                if spec not in users[cls.__name__]:
                    users[cls.__name__].append(spec)
    return names, users


def _used_by(used: tuple, recipes: list[str], users: dict[str, list[str]]) -> str:
    found, words = [], []
    for what in used:
        if what in ("install", "export"):
            words.append({"install": "the install", "export": "`hpcstack export` (containers)"}[what])
            found += recipes
        elif what == "validate":
            words.append("`hpcstack validate` and its ReFrame check")
            found += users.get("Validation", [])
        else:
            words.append(f"`{what}`")
            found += users.get(what, [])
    found = sorted(set(found))
    return (", ".join(f"`{r}`" for r in found) or "none yet") + " (" + ", ".join(words) + ")"


def _example(path: str, sites: list[tuple[str, dict]]) -> str:
    for name, data in sites:
        try:
            value = _lookup(data, path)
        except KeyError:
            continue
        nested = value
        for part in reversed(path.split(".")):
            nested = {part: nested}
        text = yaml.safe_dump(nested, default_flow_style=False, sort_keys=False, width=88).rstrip()
        if len(text.splitlines()) > 12:
            text = "\n".join(text.splitlines()[:12] + ["# …"])
        return f"From `{name}.yaml`:\n\n```yaml\n{text}\n```"
    return "None of the shipped site configs sets it."


@_page("reference/site-config.md")
def site_config_page(problems: list[str] | None = None) -> str:
    """The site-config reference, every key of the schema.

    Args:
        problems (list[str] | None): where to append what is missing (an undescribed key, a
            recipe that does not load); None: raise them.

    Raises:
        ReferenceProblems: something is missing and ``problems`` is None.
    """
    from hpcstack.site import SCHEMA
    from hpcstack.site_keys import KEYS, REQUIRED

    found: list[str] = []
    sites = _shipped_sites()
    recipes, users = _recipes_by_component(found)
    out = ["# Site-config reference", "",
           "Generated from the schema in `hpcstack/site.py` and the descriptions in "
           "`hpcstack/site_keys.py` when this site was built. A site config is "
           "`site-configs/<site>.yaml`; `hpcstack install … --site FILE --dry-run` checks one "
           "(one line per problem, with its key path, exit status 2).", "",
           f"Shipped site configs: {', '.join(f'`{n}`' for n, _ in sites)}. "
           f"Recipes: {', '.join(f'`{r}`' for r in recipes) or 'none'}.", ""]
    body = []
    for path, sub, required in _walk(SCHEMA):
        doc = KEYS.get(path)
        description = sub.get("description") or (doc.description if doc else "")
        if not description.strip():
            found.append(f"site-config key {path} has no description: add it to hpcstack/site_keys.py")
        if "default" in sub:
            default = f"`{sub['default']}`"
        elif required:
            default = "required"
        elif doc and doc.default == REQUIRED:
            default = "required (in its section)"
        elif doc and doc.default is not None:
            default = f"`{doc.default}`"
        else:
            default = "none (the feature is off)"
        depth = path.count(".")
        heading = "#" * min(2 + depth, 6)
        anchor = path.replace(".", "-").replace("_", "-")
        body += [f"{heading} `{path}` {{#{anchor}}}", "", description, "",
                 "| | |", "|---|---|",
                 f"| type | {_type(sub)} |",
                 f"| allowed | {_allowed(sub)} |",
                 f"| default | {default} |",
                 f"| used by | {_used_by(doc.used_by if doc else ('install',), recipes, users)} |", "",
                 _example(path, sites), ""]
        for clause in sub.get("allOf", ()):
            cond = clause.get("if", {}).get("properties", {})
            then = clause.get("then", {}).get("properties", {})
            if cond and then:
                when = ", ".join(f"`{k}: {v.get('const')}`" for k, v in cond.items() if "const" in v)
                rule = "; ".join(f"`{k}` {_allowed(v)}" for k, v in then.items())
                body += [f"With {when}: {rule}.", ""]
    _report(found, problems)
    return "\n".join(out + body)


# --- commands --------------------------------------------------------------------------------

def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name), sub


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or action.metavar or action.dest
        if action.option_strings and action.nargs != 0:
            metavar = action.metavar or action.dest.upper()
            names += f" {metavar if isinstance(metavar, str) else ' '.join(metavar)}"
        extra = []
        if action.choices and not isinstance(action.choices, dict):
            extra.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if (action.default not in (None, False, [], "", argparse.SUPPRESS) and action.option_strings
                and "default" not in (action.help or "")):
            extra.append(f"default `{action.default}`")
        if action.required and action.option_strings:
            extra.append("required")
        text = (action.help or "").replace("%(default)s", str(action.default)).replace("%%", "%")
        text = text.replace("|", "\\|")
        rows.append(f"| `{names}` | {text}{' (' + '; '.join(extra) + ')' if extra else ''} |")
    return rows


def _delegated(name: str, parser: argparse.ArgumentParser, found: list[str]) -> argparse.ArgumentParser:
    """The parser that documents command ``name``: its own, or the one it hands its words to
    (:data:`DELEGATED`). A command whose only argument takes the rest of the line
    (``argparse.REMAINDER``) and that :data:`DELEGATED` does not name is a problem."""
    command = name.split(" ", 1)[1] if " " in name else name
    if command in DELEGATED:
        module, builder = DELEGATED[command]
        importlib.import_module(module)
        where, function = builder.split(":")
        return getattr(importlib.import_module(where), function)()
    if any(a.nargs == argparse.REMAINDER for a in parser._actions):
        found.append(f"{name} hands its words to another parser: name it in DELEGATED "
                     "(docs/hooks/reference.py) so that its verbs and options are listed")
    return parser


def _command_section(name: str, help_text: str | None, parser: argparse.ArgumentParser, level: int,
                     found: list[str]) -> list[str]:
    parser = _delegated(name, parser, found)
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines = [f"{'#' * level} `{name}`", ""]
    if help_text:
        lines += [help_text[:1].upper() + help_text[1:] + ("" if help_text.endswith(".") else "."), ""]
    lines += ["```text", usage, "```", ""]
    if parser.description and parser.description != help_text:
        lines += [parser.description, ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | |", "|---|---|", *rows, ""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    for sub_name, sub_help, sub in _subparsers(parser):
        lines += _command_section(f"{name} {sub_name}", sub_help, sub, min(level + 1, 6), found)
    return lines


@_page("reference/cli.md")
def cli_page(problems: list[str] | None = None) -> str:
    """The command reference, every command and option of the parser (and of the parsers of
    :data:`DELEGATED`), each command in a section of its own.

    Args:
        problems (list[str] | None): where to append what is missing; None: raise it.

    Raises:
        ReferenceProblems: a command hands its words to a parser not named in :data:`DELEGATED`.
    """
    from hpcstack.cli import build_parser
    found: list[str] = []
    parser = build_parser()
    lines = ["# Command reference", "",
             "Generated from the argument parsers in `hpcstack/cli/` when this site was built "
             "(`hpcstack COMMAND --help` prints the same). Bad input gets one line per problem and "
             "exit status 2, before anything is written.", "",
             "```text", parser.format_usage().strip().removeprefix("usage: "), "```", ""]
    if parser.description:
        lines += [parser.description, ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | |", "|---|---|", *rows, ""]
    lines += ["## Commands", ""]
    lines += [f"- [`hpcstack {name}`](#hpcstack-{name.replace(' ', '-')}): {h or ''}"
              for name, h, _ in _subparsers(parser)]
    lines.append("")
    for name, help_text, sub in _subparsers(parser):
        lines += _command_section(f"hpcstack {name}", help_text, sub, 2, found)
    _report(found, problems)
    return "\n".join(lines)


# --- components API --------------------------------------------------------------------------

@_page("reference/api.md")
def api_page(problems: list[str] | None = None) -> str:
    """The recipe components' API: one mkdocstrings block per module (mkdocstrings itself warns,
    and so fails the strict build, where a docstring does not parse).

    Args:
        problems (list[str] | None): unused; the pages share one signature.
    """
    import hpcstack.install.components as components
    modules = ["hpcstack.recipe_api", "hpcstack.recipe"]
    modules += sorted(f"{components.__name__}.{m.name}" for m in pkgutil.iter_modules(components.__path__))
    lines = ["# Recipe components API", "",
             "Generated from the docstrings (mkdocstrings). A recipe imports everything it uses from "
             "`hpcstack.recipe_api` and defines `recipe(site) -> Recipe`: an ordered list of these components. "
             "See [Recipe authoring](../recipes.md).", ""]
    for module in modules:
        importlib.import_module(module)
        lines += [f"## `{module}`", "", f"::: {module}", "    options:",
                  "      show_root_heading: false", "      heading_level: 3",
                  # the façade's names are documented where they are defined, below
                  *(["      members: false"] if module == "hpcstack.recipe_api" else []), ""]
    return "\n".join(lines)


# --- the hook --------------------------------------------------------------------------------

def on_files(files, config):
    """MkDocs event: add the generated pages to the build; log each problem as an error of the
    ``mkdocs`` logger, which fails the build under ``strict`` (mkdocs.yml)."""
    from mkdocs.structure.files import File
    for path, make in PAGES.items():
        problems: list[str] = []
        content = make(problems)
        for problem in problems:
            log.error("reference/%s: %s", path.rsplit("/", 1)[-1], problem)
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "site-config"
    found: list[str] = []
    print(PAGES[f"reference/{name}.md"](found))
    for line in found:
        print(f"reference: {line}", file=sys.stderr)
    sys.exit(1 if found else 0)
