"""Hostile values in every generated file: each template rendered with values that try to run a
command in its target language, then parsed and run by that language's own interpreter.

Every value is quoted for its target language by one filter (hpcstack/templates.py and
hpcstack/modules/syntax.py): ``tcl_quote``, ``lua_quote``, ``sh_quote``, ``eb_shell``, ``pyrepr``
and ``comment``. The values below try ``[exec touch M]`` (Tcl), ``$(touch M)`` and backquotes (bash),
``"; os.system(...)`` (Python), ``os.execute`` after ``]]`` (Lua), newlines that would start a
line of their own, quotes, backslashes and ``%(...)s`` templates (EasyBuild). For each template:

- every variable the template uses gets a hostile value (jinja2's own analysis of the template
  lists them, so a new variable without one fails here);
- the output parses (``tclsh``, ``lua5.3``, ``bash -n``, :func:`ast.parse`), and Python output has
  the same syntax tree as with plain values (string constants aside): no value added code;
- Tcl, Lua and bash output is run, with the module tool's commands as stubs that record their
  arguments: every value arrives as it was given, and no marker file appears.

The filters are also checked one by one on random text (hypothesis), each by its interpreter.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import jinja2.meta
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcstack import templates
from hpcstack.export.reframe import class_name
from hpcstack.install.components.validation import Figure
from hpcstack.modules import syntax  # noqa: F401 - registers tcl_quote, lua_quote
from hpcstack.export import easyconfig  # noqa: F401 - registers pywrap

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("*/*.j2"))


def hostile(marker: Path) -> list[str]:
    """Values that would create ``marker`` if a template wrote them unquoted, one per language."""
    m = str(marker)
    return [
        f"python [exec touch {m}]",
        f"$(touch {m})",
        f"`touch {m}`",
        f'"; import os; os.system("touch {m}") #',
        f"'; touch {m}; echo '",
        f"a\nexec touch {m}\nimport os; os.system('touch {m}')\ntouch {m}",
        f"}}\nexec touch {m}\n{{",
        "ends in a backslash\\",
        f"]]\nos.execute('touch {m}') --[[",
        f"\"]==] os.execute('touch {m}') --",
        f"%(installdir)s $HOME ${{HOME}} \\\" \\' ; & | < > # {{}} [] \r\x1a\x7f\u2028 end",
        f"|touch {m}",      # Tcl's open (and Perl's, Python's os.popen) runs a command for this
    ]


def _variables(template: str) -> set[str]:
    env = templates.environment()
    return jinja2.meta.find_undeclared_variables(env.parse((REPO / template).read_text()))


def _tool(*names: str) -> str:
    for name in names:
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip(f"needs {names[0]} (scripts/localhost-setup --with-test-tools installs it)")


def _hex(text: str) -> str:
    return text.encode().hex()


def _no_marker(marker: Path, output: str = "") -> None:
    assert not marker.exists(), f"a value ran a command: {marker} exists\n{output[-2000:]}"


# ---------------------------------------------------------------------------------- contexts

def module_context(v: str) -> dict:
    """Every variable of the modulefile templates, each holding ``v``."""
    changes = [SimpleNamespace(kind=kind, name=v, value=v)
               for kind in ("prepend-path", "append-path", "setenv")] + [SimpleNamespace(kind="unsetenv", name=v)]
    return dict(name=v, version=v, whatis=v, help_lines=[v, "", v], prefix=v, root_variable=v,
                depends_on=[v, v], changes=changes, recipe=v, site=v, hpcstack_version=v,
                load_requires=v, load_error=v, whatis_lines=[v, v], venv_fence=v, venv_warning=v,
                export_all=True, status_file=v, status_needle=v)


#: A date a deprecation names: the command line checks it is one (``--after YYYY-MM-DD``).
AFTER = "2030-01-31"


def deprecation_context(v: str) -> dict:
    """The block ``hpcstack module deprecate`` adds to a modulefile (and the module root's rc):
    its fence lines are comments, as the deprecation module writes them."""
    return dict(begin=f"# {v}", end=f"# {v}", line=v, retired=v, after=AFTER, module=v)


def lua_deprecation_context(v: str) -> dict:
    return {**deprecation_context(v), "begin": f"-- {v}", "end": f"-- {v}"}


def retired_context(v: str) -> dict:
    return dict(marker=f"# {v}", line=v)


def pip_context(v: str) -> dict:
    return dict(module=v, fence=v)


def default_context(v: str) -> dict:
    return dict(name=v, version=v, marker=v, site_option=v)


def job_context(v: str, init: str, status: str) -> dict:
    return dict(header=v, comments=[v, v], options=[f"--partition={v}", v], module_init=init,
                unset_bash_env=True, module_use=[v], module_load=[v], module_preloads=[v],
                module_use_after=[v], export_none=True,
                cpus_per_task=v, env=[("HOSTILE", v), (v, v)], setup=["true"],
                steps=[{"name": v, "command": "true", "status_file": status}])


def kernel_context(v: str, init: str, venv: str) -> dict:
    return dict(kernel_name=v, display_name=v, hpcstack_version=v, command=v, module=v,
                tool_title=v, module_init=init, unset_bash_env=True, module_use=[v],
                module_preloads=[v], module_use_after=[v], venv=venv,
                python=f"{venv}/bin/python")


def reframe_check_context(v: str) -> dict:
    return dict(hpcstack_version=v, command=v, class_name=class_name(SimpleNamespace(name=v, version=v)),
                recipe=v, site=v, system=v, module=v, nodes=[1, 2], backends=[v],
                argv={v: [v, v, v]}, references={1: {v: (1.0, -0.1, None, v)}}, tasks_per_node=4,
                cpus_per_task=8, gpus_per_node=1, time_limit=v, exclusive=True,
                launcher_options=[v], env={v: v}, setup=[v], required_transport=v, records=v,
                account_hint=True, workload={v: v}, check_file=v, module_root=v, every_rank=v,
                tags=[v, v], base=None,
                # figure names are Python identifiers (the validation file's schema: _FIGURE_NAME)
                figures={"throughput": Figure("throughput", v, record=v, field=v, per_rank=True),
                         "efficiency": Figure("efficiency", v, scaling_of="throughput")})


def reframe_settings_context(v: str) -> dict:
    return dict(hpcstack_version=v, command=v, site=v, description=v, partition=v, scheduler=v,
                modules_system=v, launcher=v, access=[v], prepare_cmds=[v], gpu_option=v,
                max_jobs=4, cc=v, cxx=v, ftn=v)


def easyconfig_context(v: str) -> dict:
    ext = dict(name=v, version=v, source_url=v, pypi_files=False, filename=v, download_filename=v,
               sha256=v, wheel=True)
    build = dict(name=v, version=v, pypi_files=True, source_url=v, filename=v, sha256=v,
                 patches=[{"file": v, "sha256": v}], preinstallopts=v)
    return dict(hpcstack_version=v, recipe=v, site=v, lock=v, name=v, version=v, versionsuffix=v,
                homepage=v, description=v, dependencies=[(v, v)], builddependencies=[(v, v, v)],
                extensions=[ext, {**ext, "pypi_files": True, "download_filename": None}], builds=[build],
                sanity_commands=[v], sanity_files=[v], modextrapaths={v: [v]}, modextravars={v: v},
                constraints=[v, v, v, v], left_out=[v], python_version=v, pypi_files=v)


def activate_context(v: str) -> dict:
    return dict(module_name=v, module_init={v: v}, python="/usr/bin/python3")


PY_CONTEXTS = {"templates/reframe-check.py.j2": reframe_check_context,
               "templates/reframe-settings.py.j2": reframe_settings_context,
               "templates/easyconfig.eb.j2": easyconfig_context,
               "templates/extend-venv-activate.j2": activate_context}
TCL = {"modulefiles/modulefile.tcl.j2": module_context, "modulefiles/version.tcl.j2": default_context,
       "modulefiles/deprecation.tcl.j2": deprecation_context,
       "modulefiles/modulerc-deprecation.tcl.j2": deprecation_context,
       "modulefiles/retired.tcl.j2": retired_context}
LUA = {"modulefiles/modulefile.lua.j2": module_context, "modulefiles/modulerc.lua.j2": default_context,
       "modulefiles/deprecation.lua.j2": lua_deprecation_context,
       "modulefiles/retired.lua.j2": lambda v: {**retired_context(v), "marker": v}}
SH = {"templates/slurm-job.sh.j2": job_context, "templates/jupyter-kernel.sh.j2": kernel_context}
#: Shell scripts run as they are (not sourced by a module tool): parsed and run with their values.
PLAIN_SH = {"templates/stack-pip.sh.j2": pip_context}


def status_page_context(v: str) -> dict:
    """The page of ``hpcstack status --html`` (hpcstack/validate/status.py, write_html): a FAILED
    row (its changed lines shown) and one whose verdict is the value itself."""
    row = dict(tier=v, verdict="FAILED", since=v, last_run=v, last_ok=v, trend=v, changed=[v, v], reasons=[v])
    return dict(site=v, generated=v, json_name=v, usage_days=v,
                stacks=[dict(name=v, users=v, images=[dict(src=v, alt=v)], rows=[row, {**row, "verdict": v}]),
                        dict(name=v, users=None, images=[], rows=[])])


HTML = {"templates/status.html.j2": status_page_context}


def test_every_template_is_covered_with_every_variable():
    """A template added (or a variable added to one) without a hostile context fails here."""
    contexts = {**PY_CONTEXTS, **TCL, **LUA, **SH, **PLAIN_SH, **HTML}
    assert sorted(contexts) == TEMPLATES
    for template, make in contexts.items():
        args = ("x", "/i", "/s") if template in SH else ("x",)
        assert _variables(template) <= set(make(*args)), template


# ----------------------------------------------------------------------------------------- Tcl

_TCL_STUBS = r"""
set out [open [lindex $argv 1] w]
proc record {name args} {
    global out
    set words [list $name]
    foreach a $args { lappend words [binary encode hex [encoding convertto utf-8 $a]] }
    chan puts $out [join $words " "]
}
foreach cmd {conflict depends-on setenv unsetenv prepend-path append-path module-whatis reportError
             module-tag module-forbid} {
    proc $cmd args "record $cmd {*}\$args"
}
proc module-info {args} { return $::load_mode }
foreach mode {0 1} {
    set ::load_mode $mode
    set rc [catch {source [lindex $argv 0]} msg]
    if {$rc != 0 && $rc != 3} { puts stderr "Tcl error: $msg"; exit 1 }
}
if {[info procs ModulesHelp] ne ""} {
    rename puts real_puts
    proc puts {args} { record puts [lindex $args end] }
    ModulesHelp
    rename puts ""
    rename real_puts puts
}
if {[info exists ModulesVersion]} { record ModulesVersion $ModulesVersion }
chan close $out
"""


def _run_tcl(text: str, tmp: Path) -> list[list[str]]:
    tclsh = _tool("tclsh", "tclsh8.6")
    (tmp / "file.tcl").write_text(text)
    (tmp / "stubs.tcl").write_text(_TCL_STUBS)
    proc = subprocess.run([tclsh, str(tmp / "stubs.tcl"), str(tmp / "file.tcl"), str(tmp / "calls")],
                          capture_output=True, text=True, cwd=tmp, timeout=60)
    assert proc.returncode == 0, proc.stderr + text
    return [line.split(" ") for line in (tmp / "calls").read_text().splitlines()]


@pytest.mark.parametrize("template", sorted(TCL))
def test_tcl_templates_take_hostile_values_as_data(template, tmp_path):
    marker = tmp_path / "pwned"
    for i, v in enumerate(hostile(marker)):
        work = tmp_path / str(i)
        work.mkdir()
        text = templates.render(template, **TCL[template](v))
        calls = _run_tcl(text, work)
        _no_marker(marker, text)
        # (the deprecation block only prints: its Tcl calls nothing the stubs record)
        assert calls or template.endswith("deprecation.tcl.j2"), text
        # every argument a command got is the value itself (or the whatis line around it)
        for name, *words in calls:
            for word in words:
                got = bytes.fromhex(word).decode()
                assert got in (v, "", f"Description: {v}", f"ERROR: {v}", "deprecated", AFTER,
                               "--after", "--message", "--nearly-message"), (name, got, text)
        names = [c[0] for c in calls]
        if template.endswith("modulefile.tcl.j2"):
            assert {"conflict", "depends-on", "setenv", "prepend-path", "append-path", "unsetenv",
                    "module-whatis", "puts", "reportError"} <= set(names), names
        elif template.endswith("version.tcl.j2"):
            assert names == ["ModulesVersion"]
        elif template.endswith("modulerc-deprecation.tcl.j2"):
            assert names == ["module-tag", "module-forbid"] * 2, names
        elif template.endswith("retired.tcl.j2"):
            assert "module-whatis" in names, names


# ----------------------------------------------------------------------------------------- Lua

_LUA_STUBS = r"""
local out = assert(io.open(arg[2], "w"))
local function hex(s) return (tostring(s):gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function recorder(name)
    return function(...)
        local words = {name}
        for _, a in ipairs({...}) do words[#words + 1] = hex(a) end
        out:write(table.concat(words, " "), "\n")
    end
end
for _, name in ipairs({"help", "whatis", "family", "depends_on", "setenv", "unsetenv", "prepend_path",
                       "append_path", "LmodError", "LmodMessage", "module_version", "add_property"}) do
    _G[name] = recorder(name)
end
lfs = {attributes = function() return "file" end}   -- Lmod's sandbox: every path a regular file
for _, m in ipairs({"load", "unload"}) do
    mode = function() return m end
    isFile = function() return false end
    dofile(arg[1])
end
out:close()
"""


@pytest.mark.parametrize("template", sorted(LUA))
def test_lua_templates_take_hostile_values_as_data(template, tmp_path):
    lua = _tool("lua5.3", "lua", "lua5.4")
    marker = tmp_path / "pwned"
    (tmp_path / "stubs.lua").write_text(_LUA_STUBS)
    for i, v in enumerate(hostile(marker)):
        text = templates.render(template, **LUA[template](v))
        (tmp_path / "file.lua").write_text(text)
        proc = subprocess.run([lua, str(tmp_path / "stubs.lua"), str(tmp_path / "file.lua"), str(tmp_path / "calls")],
                              capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 0, proc.stderr + text
        _no_marker(marker, text)
        calls = [line.split(" ") for line in (tmp_path / "calls").read_text().splitlines()]
        for name, *words in calls:
            for word in words:
                got = bytes.fromhex(word).decode()
                if name == "help":     # a Lua long string reads a carriage return as a newline
                    assert v.replace("\r", "\n") in got, (got, text)
                else:
                    assert got in (v, f"Description: {v}", f"{v}/{v}", "default", "state", "obsolete"), \
                        (name, got, text)
        names = {c[0] for c in calls}
        expected = {"modulefiles/modulefile.lua.j2": {"help", "whatis", "family", "depends_on", "setenv",
                                                      "prepend_path", "append_path", "unsetenv", "LmodError"},
                    "modulefiles/modulerc.lua.j2": {"module_version"},
                    "modulefiles/deprecation.lua.j2": {"add_property"},
                    "modulefiles/retired.lua.j2": {"whatis"}}[template]
        assert expected <= names, names


# ---------------------------------------------------------------------------------------- bash

def _fs_safe(v: str) -> str:
    """``v`` as a file name: NUL cannot be in one, ``/`` would make directories, and a name has at
    most 255 bytes (NAME_MAX; the values hold the marker's path, as long as the temporary
    directory's: cut, the name keeps the value's hostile characters, which come first)."""
    return v.replace("\x00", "").replace("/", "|").encode()[:255].decode(errors="ignore")


_INIT = """\
module () { printf '%s\\0' "module" "$@" >> "$HOSTILE_CALLS"; return 0; }
"""


@pytest.mark.parametrize("template", sorted(SH))
def test_shell_templates_take_hostile_values_as_data(template, tmp_path):
    bash = _tool("bash")
    marker = tmp_path / "pwned"
    for i, v in enumerate(hostile(marker)):
        work = tmp_path / str(i)
        hostile_dir = work / _fs_safe(v)
        hostile_dir.mkdir(parents=True)
        init = hostile_dir / "init.sh"
        init.write_text(_INIT)
        (hostile_dir / "bin").mkdir()
        (hostile_dir / "bin" / "activate").write_text("true\n")
        (hostile_dir / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")  # the kernel's interpreter
        (hostile_dir / "bin" / "python").chmod(0o755)
        status = hostile_dir / "status"
        if template.endswith("slurm-job.sh.j2"):
            text = templates.render(template, **job_context(v, str(init), str(status)))
        else:
            text = templates.render(template, **kernel_context(v, str(init), str(hostile_dir)))
        script = work / "script.sh"
        script.write_text(text)
        assert subprocess.run([bash, "-n", str(script)], capture_output=True).returncode == 0, text
        # run it: `module` records its arguments; `python` (the kernel's exec) is a stub too
        fake_bin = work / "fakebin"
        fake_bin.mkdir()
        (fake_bin / "python").write_text("#!/bin/sh\nexit 0\n")
        (fake_bin / "python").chmod(0o755)
        calls = work / "calls"
        env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOSTILE_CALLS": str(calls), "HOME": str(work)}
        proc = subprocess.run([bash, str(script), "connection.json"], capture_output=True, text=True,
                              cwd=work, env=env, timeout=60)
        _no_marker(marker, text + proc.stdout + proc.stderr)
        assert proc.returncode == 0, proc.stderr + text
        words = calls.read_bytes().decode().split("\0")[:-1]
        clean = v.replace("\x00", "")
        # the site's dirs, its module hierarchy, the stack's root, the stack: each value one word
        assert words == ["module", "use", clean, "module", "load", clean, "module", "use", clean,
                         "module", "load", clean], (words, text)
        if template.endswith("slurm-job.sh.j2"):
            assert status.read_text() == "0\n"


def test_job_script_exports_hostile_values_exactly(tmp_path):
    marker = tmp_path / "pwned"
    for v in hostile(marker):
        v = v.replace("\x00", "")
        out = tmp_path / "value"
        text = templates.render("templates/slurm-job.sh.j2", **{
            **job_context(v, "/dev/null", str(tmp_path / "status")),
            "module_use": [], "module_load": [], "module_preloads": [], "module_use_after": [],
            "steps": [{"name": "x", "command": f'printf %s "$HOSTILE" > {out}', "status_file": str(tmp_path / "s")}]})
        subprocess.run(["bash", "-c", text], capture_output=True, cwd=tmp_path, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
        _no_marker(marker, text)
        assert out.read_bytes().decode() == v


# -------------------------------------------------------------------------------------- Python

class _Blank(ast.NodeTransformer):
    """Every constant the same: what is left is the code's structure."""

    def visit_Constant(self, node):
        return ast.copy_location(ast.Constant(value=None), node)

    def visit_ClassDef(self, node):       # the check's class is named after the recipe
        node.name = "C"
        return self.generic_visit(node)

    def visit_JoinedStr(self, node):
        return ast.copy_location(ast.Constant(value=None), node)


def _structure(text: str) -> str:
    return ast.dump(_Blank().visit(ast.parse(text)))


@pytest.mark.parametrize("template", sorted(PY_CONTEXTS))
def test_python_templates_take_hostile_values_as_data(template, tmp_path):
    plain = _structure(templates.render(template, **PY_CONTEXTS[template]("plain")))
    for v in hostile(tmp_path / "pwned"):
        text = templates.render(template, **PY_CONTEXTS[template](v))
        try:
            tree = _structure(text)
        except SyntaxError as exc:
            raise AssertionError(f"{template} with {v!r}: {exc}\n{text}") from None
        assert tree == plain, f"{template}: the value {v!r} changed the code"


def test_extend_venv_activate_constants_are_the_values(tmp_path):
    for v in hostile(tmp_path / "pwned"):
        text = templates.render("templates/extend-venv-activate.j2", **activate_context(v))
        tree = ast.parse(text)
        found = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") in ("MODULE_NAME", "MODULE_INIT")}
        assert found == {"MODULE_NAME": v, "MODULE_INIT": {v: v}}


# -------------------------------------------------------------------------- the filters alone

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_TEXT, min_size=1, max_size=8))
def test_tcl_quote_round_trips_in_tclsh(values, tmp_path):
    tclsh = _tool("tclsh", "tclsh8.6")
    lines = [f"puts [binary encode hex [encoding convertto utf-8 {syntax.tcl_quote(v)}]]." for v in values]
    proc = subprocess.run([tclsh], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = [bytes.fromhex(h[:-1]).decode() for h in proc.stdout.split()]
    assert got == values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_TEXT, min_size=1, max_size=8))
def test_lua_quote_round_trips_in_lua(values, tmp_path):
    lua = _tool("lua5.3", "lua", "lua5.4")
    script = "local function hex(s) return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end)) end\n"
    script += "".join(f"print(hex({syntax.lua_quote(v)}) .. '.')\n" for v in values)
    script += "".join(f"print(hex({syntax.lua_long_string(v)}) .. '.')\n" for v in values)
    (tmp_path / "t.lua").write_text(script)
    proc = subprocess.run([lua, str(tmp_path / "t.lua")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = [bytes.fromhex(h[:-1]).decode() for h in proc.stdout.split()]
    assert got[:len(values)] == values
    # a long string (help text): Lua drops the newline after its opening bracket (hpcstack adds
    # one, and one before the closing bracket); it reads a carriage return as an end of line
    for v, g in zip(values, got[len(values):]):
        if "\r" not in v:
            assert g == v + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_TEXT.map(lambda s: s.replace("\x00", "")), min_size=1, max_size=8))
def test_shell_filters_round_trip_in_bash(values, tmp_path):
    marker = tmp_path / "pwned"
    script = "".join(f"printf '%s' {templates.sh_quote(v)} | od -An -tx1 | tr -d ' \\n'; echo\n" for v in values)
    # an easyconfig's shell string: EasyBuild fills in its %(name)s templates, then bash runs it
    script += "".join(f"printf '%s' {templates.eb_shell(v) % {}} | od -An -tx1 | tr -d ' \\n'; echo\n" for v in values)
    # ``${NAME}`` stays a live reference to the build environment (bash_word, by design): each
    # one named is set to its own text, so that the expansion gives the value back unchanged
    names = {m.group(1) for v in values for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", v)}
    env = {"PATH": os.environ["PATH"], **{n: "${" + n + "}" for n in names}}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    got = [bytes.fromhex(h).decode() for h in proc.stdout.split("\n")[:-1]]
    assert got == values + values
    _no_marker(marker)


@settings(max_examples=200, deadline=None)
@given(value=_TEXT)
def test_comment_is_one_line_in_every_language(value):
    text = templates.comment(value)
    assert text.splitlines() == ([text] if text else [])      # no character of any kind ends a line
    # backslashes doubled: an even run of them at the end never continues a Tcl comment line
    assert (len(text) - len(text.rstrip("\\"))) % 2 == 0
    ast.parse(f"# {text}\nx = 1\n")


# ------------------------------------------------- the install script (plan.to_bash, not a template)

def test_install_script_keeps_hostile_build_env_values_as_data(tmp_path, capsys):
    """Values a site config may hold (any one line of text) in ``build.env``: the dry-run script
    passes each to the build as one word, and running those words runs nothing."""
    import yaml

    from conftest import make_sdist, write_tiny_recipe
    from hpcstack.cli import main

    marker = tmp_path / "pwned"
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site["python"] = {"version": "3.11"}
    from hpcstack.schema import CONTROL

    # what the schema lets through (one line of text); ${NAME} references are live by design
    values = [v for v in hostile(marker) if not CONTROL.search(v) and "${" not in v]
    site["build"]["env"] = {f"HOSTILE_{i}": v for i, v in enumerate(values)}
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site))
    assert main(["install", str(recipe), "--site", str(tmp_path / "site.yaml"), "--prefix", str(tmp_path / "sw"),
                 "--module-root", str(tmp_path / "mf"), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    exports = [line.strip() for line in script.splitlines() if line.strip().startswith("export HOSTILE_")]
    assert len(exports) == len(values), script
    check = "\n".join(exports) + "\n" + "".join(
        f'printf "%s\\0" "$HOSTILE_{i}"\n' for i in range(len(values)))
    proc = subprocess.run(["bash", "-c", check], capture_output=True, cwd=tmp_path)
    _no_marker(marker, script)
    assert proc.stdout.decode().split("\0")[:-1] == values


@pytest.mark.parametrize("template", sorted(PLAIN_SH))
def test_plain_shell_scripts_take_hostile_values_as_data(template, tmp_path):
    """The stack's ``pip``: run outside any venv, it says in one line what to do, naming the
    module exactly as it was given, and runs nothing of it."""
    marker = tmp_path / "pwned"
    for i, v in enumerate(hostile(marker)):
        v = v.replace("\x00", "")
        script = tmp_path / f"pip{i}"
        script.write_text(templates.render(template, **PLAIN_SH[template](v)))
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        proc = subprocess.run(["sh", str(script), "install", "x"], capture_output=True, text=True, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=60)
        _no_marker(marker, script.read_text() + proc.stderr)
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        # (text mode reads a carriage return as a newline)
        assert v.replace("\r", "\n") in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------- HTML

#: Values aimed at an HTML page: a script element, leaving an attribute or an element, a comment.
HTML_HOSTILE = ['<script>alert(1)</script>', '"><img src=x onerror=alert(1)>', "' onmouseover='alert(1)",
                '</title><script>alert(1)</script>', '</td></tr></table><iframe src=//e>', '<!-- x',
                '&lt;script&gt; &amp; &#60;', 'javascript:alert(1)']


class _Events(HTMLParser):
    """The page as the browser's parser reads it: tags with their attributes, and text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.events: list = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.events.append(("start", tag, tuple(attrs)))

    def handle_endtag(self, tag):
        self.events.append(("end", tag))

    def handle_data(self, data):
        if self.events and self.events[-1][0] == "data":
            self.events[-1] = ("data", self.events[-1][1] + data)
        else:
            self.events.append(("data", data))

    def handle_comment(self, data):
        self.events.append(("comment", data))


def _with(events: list, plain: str, v: str) -> list:
    """``events`` with every ``plain`` in their texts and attribute values replaced by ``v``."""
    def sub(s):
        return s.replace(plain, v) if isinstance(s, str) else s
    return [(e[0], e[1], tuple((k, sub(x)) for k, x in e[2])) if e[0] == "start" else
            (e[0], sub(e[1])) for e in events]


@pytest.mark.parametrize("template", sorted(HTML))
def test_html_templates_take_hostile_values_as_data(template, tmp_path):
    """Escaped by autoescape: the page has the same elements and attributes as with a plain value,
    and every text and attribute value holds the value exactly as given."""
    plain = "PLAINVALUE"
    expected = _Events(templates.render(template, **HTML[template](plain))).events
    assert any(e[0] == "start" and e[1] == "img" for e in expected), expected
    for v in HTML_HOSTILE + hostile(tmp_path / "pwned"):
        text = templates.render(template, **HTML[template](v))
        got = _Events(text).events
        assert got == _with(expected, plain, v), text
