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


def test_every_command_and_option_is_on_the_command_page(reference):
    import argparse

    from hpcstack.cli import build_parser
    page = reference.PAGES["reference/cli.md"]()

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    assert f"## `{name} {sub_name}`" in page or f"### `{name} {sub_name}`" in page, sub_name
                    walk(sub, f"{name} {sub_name}")
            for option in action.option_strings:
                assert option in page, (name, option)

    walk(build_parser(), "hpcstack")


def test_every_components_module_is_on_the_api_page(reference):
    import pkgutil

    import hpcstack.install.components as components
    page = reference.PAGES["reference/api.md"]()
    for module in pkgutil.iter_modules(components.__path__):
        assert f"::: hpcstack.install.components.{module.name}" in page
