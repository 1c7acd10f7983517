"""hpcstack.templates: the one jinja2 environment every template renders with."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest

import hpcstack
from hpcstack import templates
from hpcstack.modules import syntax
from hpcstack.modules.activate import TEMPLATE_NAME, render_extend_venv_activate
from hpcstack.modules.writer import render_default

pytestmark = pytest.mark.unit


def test_templates_render_through_the_one_environment():
    """extend-venv-activate and the default files land in the shared environment's cache."""
    env = templates.environment()
    assert templates.environment() is env
    env.cache.clear()
    render_extend_venv_activate("pytorch/2.3.1-gpu", {}, "/usr/bin/python3")
    render_default("pytorch", "2.3.1-gpu", "lua")
    cached = {key[1] for key in env.cache.keys()}
    assert {TEMPLATE_NAME, syntax.Lua.default_template} <= cached


def test_no_other_module_builds_a_jinja_environment():
    package = Path(hpcstack.__file__).parent
    builders = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                      if re.search(r"jinja2\.(Environment|Template)\(", p.read_text()))
    assert builders == ["templates.py"]


def test_a_variable_the_template_is_not_given_is_an_error():
    with pytest.raises(jinja2.UndefinedError):
        templates.render(syntax.Tcl.default_template, name="pytorch")


def test_trailing_newline_kept_and_blocks_trimmed():
    text = render_default("pytorch", "2.3.1-gpu", "tcl")
    assert text.endswith("}\n") and "\n\n" not in text


def test_filters_of_the_syntaxes_are_there_and_cannot_be_redefined():
    env = templates.environment()
    assert env.filters["tcl_quote"] is syntax.tcl_quote and env.filters["lua_quote"] is syntax.lua_quote
    templates.add_filters({"tcl_quote": syntax.tcl_quote})   # the same function again: fine
    with pytest.raises(ValueError, match="'tcl_quote' is defined twice"):
        templates.add_filters({"tcl_quote": str})
    assert env.filters["tcl_quote"] is syntax.tcl_quote


def test_the_status_page_escapes_what_reports_and_users_wrote():
    """status.html.j2 renders with autoescape (selected by the template's .html.j2 extension): a
    <script> in a failure reason (a report's text) is shown, not run; modulefile templates are not
    HTML-escaped."""
    hostile = '<script>alert("x")</script>'
    row = {"tier": "full", "verdict": "FAILED", "since": None, "last_run": None, "trend": None,
           "last_ok": None, "changed": [], "reasons": [f"nccl: {hostile}"]}
    page = templates.render("templates/status.html.j2", site="s", generated="now", json_name="s.json",
                            usage_days=30, stacks=[{"name": "a/1", "rows": [row], "images": [], "users": 3}])
    assert "<script>" not in page and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
    assert "<h1>Stacks of s</h1>" in page and '<a href="s.json">s.json</a>' in page
    assert not templates.environment().autoescape(syntax.Lua.default_template)
