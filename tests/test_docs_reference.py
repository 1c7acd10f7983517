"""The generated reference pages of the documentation site (docs/hooks/reference.py), without
MkDocs: every site-config key of the schema, every command and option of the parser, every
module of the components package; and the key descriptions name only keys the schema has.
tests/test_docs_site.py builds and renders the whole site."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _schema_keys() -> list[str]:
    from hpcstack.site import SCHEMA
    keys = []

    def walk(schema, prefix=""):
        for key, sub in schema.get("properties", {}).items():
            keys.append(prefix + key)
            walk(sub, prefix + key + ".")

    walk(SCHEMA)
    return keys


def test_every_schema_key_has_an_entry_with_its_type_default_example_and_users(reference):
    page = reference.PAGES["reference/site-config.md"]()
    for key in _schema_keys():
        assert f"`{key}` {{#{key.replace('.', '-').replace('_', '-')}}}" in page, key
    entry = page.split("`toolchain.cuda.cc_list`", 1)[1].split("\n#", 1)[0]
    for words in ("| type | list of integer |", "| default | `[]` |", "| used by | `jax/0.10.2-gpu`, `pytorch/2.14.1-gpu`, `pytorch/2.3.1-gpu`",
                  "From `cirrus.yaml`", "cc_list:\n    - 70"):
        assert words in entry, (words, entry)
    assert "| allowed | `environment-modules`, `lmod` |" in page


def test_the_key_descriptions_name_only_keys_of_the_schema():
    from hpcstack.site_keys import KEYS
    stale = sorted(set(KEYS) - set(_schema_keys()))
    assert not stale, f"hpcstack/site_keys.py describes keys the schema does not have: {stale}"


def _sections(page: str) -> dict[str, str]:
    """The command page cut at its headings: command name -> its own section's text (up to the
    next heading of any level, so a subcommand's options do not count for its parent); the text
    before the first command heading is ``hpcstack``'s."""
    import re
    parts = re.split(r"^#{2,6} `(hpcstack[^`]*)`$", page, flags=re.M)
    sections = {"hpcstack": parts[0]}
    for name, text in zip(parts[1::2], parts[2::2]):
        assert name not in sections, f"two sections for {name}"
        sections[name] = text
    return sections


def _parsers(reference):
    """Every (command name, its parser) of ``hpcstack``, the delegated parsers' verbs included."""
    import argparse
    import importlib

    from hpcstack.cli import build_parser

    def walk(parser, name):
        command = name.split(" ", 1)[1] if " " in name else ""
        if command in reference.DELEGATED:
            module, builder = reference.DELEGATED[command]
            importlib.import_module(module)
            where, function = builder.split(":")
            parser = getattr(importlib.import_module(where), function)()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from walk(sub, f"{name} {sub_name}")

    yield from walk(build_parser(), "hpcstack")


def test_every_command_and_option_is_in_its_own_section_of_the_command_page(reference):
    import argparse
    page = reference.PAGES["reference/cli.md"]()
    sections = _sections(page)
    seen = []
    for name, parser in _parsers(reference):
        seen.append(name)
        assert name in sections, f"no section for {name}"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            # an option in its row: `--name METAVAR` or `-s, --long`, in this command's own section
            words = action.option_strings or [action.metavar or action.dest]
            for word in words:
                assert f"`{word}" in sections[name] or f", {word}" in sections[name], (name, word)
    # the verbs of `hpcstack action` (the dry-run script's lines) are among them
    for verb in ("fetch", "unpack", "sbom", "reuse-wheel"):
        assert f"hpcstack action {verb}" in seen, seen
    assert "`--sha256 SHA256`" in sections["hpcstack action fetch"]
    assert "`--spec SPEC`" in sections["hpcstack action sbom"]
    assert set(sections) == set(seen), set(sections) ^ set(seen)


def test_an_option_on_another_commands_section_does_not_count(reference):
    # the check above is per section: --sha256 is on the page, but not in `hpcstack install`'s
    sections = _sections(reference.PAGES["reference/cli.md"]())
    assert "--sha256" in "".join(sections.values())
    assert "--sha256" not in sections["hpcstack install"]


def test_a_command_that_hands_its_words_on_must_be_delegated(reference, monkeypatch):
    monkeypatch.setattr(reference, "DELEGATED", {})
    with pytest.raises(reference.ReferenceProblems) as caught:
        reference.PAGES["reference/cli.md"]()
    assert caught.value.problems == [
        "hpcstack action hands its words to another parser: name it in DELEGATED "
        "(docs/hooks/reference.py) so that its verbs and options are listed"]


def test_every_schema_key_is_described_and_an_undescribed_one_is_a_problem(reference, monkeypatch):
    reference.PAGES["reference/site-config.md"]()           # raises on any problem
    from hpcstack import site_keys
    keys = dict(site_keys.KEYS)
    del keys["installer.index_url"], keys["modules.env"]
    monkeypatch.setattr(site_keys, "KEYS", keys)
    problems = []
    reference.PAGES["reference/site-config.md"](problems)
    assert problems == [f"site-config key {k} has no description: add it to hpcstack/site_keys.py"
                        for k in ("modules.env", "installer.index_url")], problems


def test_a_recipe_that_does_not_load_is_a_problem(reference, tmp_path, monkeypatch):
    recipe = tmp_path / "repo" / "recipes" / "broken" / "1.0.py"
    recipe.parent.mkdir(parents=True)
    recipe.write_text('"""A recipe that fails to load."""\n\n\ndef recipe(site):\n'
                      '    raise RuntimeError("no such component")\n')
    monkeypatch.setenv("HPCSTACK_PATH", str(tmp_path / "repo"))
    with pytest.raises(reference.ReferenceProblems) as caught:
        reference.PAGES["reference/site-config.md"]()
    assert len(caught.value.problems) == 1, caught.value.problems
    assert caught.value.problems[0].startswith("recipe broken/1.0 does not load for the localhost site: ")
    assert "no such component" in caught.value.problems[0]


def test_every_components_module_is_on_the_api_page(reference):
    import pkgutil

    import hpcstack.install.components as components
    page = reference.PAGES["reference/api.md"]()
    for module in pkgutil.iter_modules(components.__path__):
        assert f"::: hpcstack.install.components.{module.name}" in page
