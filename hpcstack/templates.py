"""The package's one jinja2 environment, for every template hpcstack ships.

Templates live in the built-in data (:func:`hpcstack.data_root`) and are named by their path
there: ``modulefiles/modulefile.tcl.j2``, ``templates/extend-venv-activate.j2``,
``templates/slurm-job.sh.j2``. They render with ``trim_blocks`` and ``lstrip_blocks`` (as Spack's
module templates do), ``StrictUndefined`` (a misspelt variable is an error, not an empty string),
the trailing newline kept and no HTML escaping (https://jinja.palletsprojects.com/en/3.1.x/api/,
"Environment").

Every value a template writes goes through the filter of the language it lands in, so that no
value, whatever it holds, is read as code there (a site value ``python [exec touch /tmp/x]`` in a
Tcl modulefile, ``$(touch x)`` in a job script, ``"; os.system(...)`` in a ReFrame check):

- ``pyrepr``: a Python literal (:func:`repr`), for generated Python (ReFrame checks and settings,
  easyconfigs, ``extend-venv-activate``);
- ``sh_quote``: one bash word (:func:`shlex.quote`), for job scripts and kernel launchers;
- ``eb_shell``: one bash word inside an easyconfig's shell strings (``preinstallopts``), which
  EasyBuild expands as ``%(name)s`` templates before the shell sees them: ``sh_quote`` with ``%``
  doubled;
- ``comment``: the text of a comment line in any of these languages: control characters
  (newlines included) written as escapes (``\\n``), backslashes doubled (a Tcl comment ending in a
  backslash continues on the next line), so the comment stays one line;
- ``tcl_quote``, ``lua_quote``, ``lua_long_string``: Tcl and Lua, added by the modulefile syntaxes
  with :func:`add_filters` when they register (:mod:`hpcstack.modules.syntax`), so a new syntax
  brings its filters in its own file.

Values are checked before they get here too (the site schema, the recipe loader, the command
line): the filters are what makes a value that slipped through harmless.
"""

from __future__ import annotations

import re
import shlex
from typing import Callable

import jinja2

from hpcstack import data_root

#: Characters a comment may not hold as they are: they end a line (or hide text) in some language.
_COMMENT_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\\]")


def sh_quote(value) -> str:
    """Quote ``value`` as one bash word (:func:`shlex.quote`: single quotes where needed).

    Args:
        value (object): converted with :func:`str`.

    Returns:
        str: the word; ``''`` for an empty string; a plain word (``/usr/bin``) stays as it is.
    """
    return shlex.quote(str(value))


#: A ``${NAME}`` reference to the build environment, left live in a bash word.
_VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def bash_word(value: str) -> str:
    """Quote ``value`` as one bash word, keeping ``${NAME}`` references live.

    Args:
        value (str): text; ``${NAME}`` references are left for bash to expand.

    Returns:
        str: ``shlex.quote(value)`` when there is no reference, else a double-quoted word.
    """
    if not _VAR_REF.search(value):
        return shlex.quote(value)
    return '"' + _dq_live(value) + '"'


def _dq_live(value: str) -> str:
    """Escape ``value`` for use inside bash double quotes, keeping ``${NAME}`` references live."""
    out, last = [], 0
    for m in _VAR_REF.finditer(value):
        out.append(re.sub(r'([\\"`$])', r"\\\1", value[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(re.sub(r'([\\"`$])', r"\\\1", value[last:]))
    return "".join(out)


def eb_shell(value) -> str:
    """Quote ``value`` as one bash word for an easyconfig's shell strings (``preinstallopts``,
    ``postinstallcmds``), as hpcstack's own build quotes it
    (:func:`bash_word`: ``${NAME}`` references to the build environment
    stay live, nothing else expands), then ``%`` doubled, since EasyBuild fills in
    ``%(installdir)s``-style templates in those strings before the shell runs them.

    Args:
        value (object): converted with :func:`str`.
    """
    return bash_word(str(value)).replace("%", "%%")


def comment(value) -> str:
    """The text of ``value`` for a comment line (``#`` in bash, Python and Tcl, ``--`` in Lua):
    one line, whatever the value holds.

    Control characters are written as Python's escapes (a newline as ``\\n``), Unicode line
    separators as ``\\u2028``, and backslashes doubled: a Tcl comment line that ends in a
    backslash would continue on the next line.

    Args:
        value (object): converted with :func:`str`.
    """
    return _COMMENT_UNSAFE.sub(lambda m: "\\\\" if m.group() == "\\" else repr(m.group())[1:-1],
                               str(value))


#: Filters every template may use, by name; :func:`add_filters` adds more.
_FILTERS: dict[str, Callable] = {"pyrepr": repr, "sh_quote": sh_quote, "eb_shell": eb_shell,
                                 "comment": comment}
_ENVIRONMENT: jinja2.Environment | None = None


def add_filters(filters: dict[str, Callable]) -> None:
    """Make ``filters`` available to every template.

    Args:
        filters (dict[str, Callable]): filter name -> function of the value (e.g.
            ``{"tcl_quote": tcl_quote}``).

    Raises:
        ValueError: a name already taken by a different function (two syntaxes must not
            quietly redefine each other's quoting).
    """
    for name, function in filters.items():
        if _FILTERS.get(name, function) is not function:
            raise ValueError(f"template filter {name!r} is defined twice")
        _FILTERS[name] = function
        if _ENVIRONMENT is not None:
            _ENVIRONMENT.filters[name] = function


def environment() -> jinja2.Environment:
    """Return the jinja2 environment (made on first use, then shared, so templates compile once).

    Returns:
        jinja2.Environment: loads templates from :func:`hpcstack.data_root` by relative path.

    Raises:
        RuntimeError: hpcstack's data is not a directory (see :func:`hpcstack.data_root`).
    """
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(data_root())),
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            # HTML and XML templates (status.html.j2: reasons and names come from reports and
            # users) are escaped; modulefiles, scripts and recipes are not HTML (their own quoting
            # filters: tcl_quote, lua_quote, shell quoting)
            autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2", "htm.j2", "xml.j2", "html", "xml"),
                                                default_for_string=False, default=False))
        env.filters.update(_FILTERS)
        _ENVIRONMENT = env
    return _ENVIRONMENT


def render(template: str, **variables) -> str:
    """Render one template.

    Args:
        template (str): its path under the built-in data, e.g. ``"modulefiles/modulefile.lua.j2"``.
        **variables: what the template sees (nothing else: undefined names are errors).

    Returns:
        str: the rendered text.

    Raises:
        jinja2.TemplateNotFound: no such template.
        jinja2.UndefinedError: the template uses a variable not given.
    """
    return environment().get_template(template).render(**variables)
