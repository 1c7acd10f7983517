"""Property-based: generated site configs and command lines never give a traceback.

Whatever the input, ``hpcstack`` ends with exit status 0, 1 or 2 (or argparse's 2), prints its
problems as ``error:`` lines, and never reaches the last-resort handler ("internal error"). The
commands run in-process on temporary roots, always with ``--dry-run`` where a command could
change anything, so nothing is installed or removed.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from hpcstack.cli import main

pytestmark = pytest.mark.unit

BASE = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
BASE.setdefault("python", {})["version"] = "3.11"  # most examples need no module tool
TMP = Path(tempfile.mkdtemp(prefix="hpcstack-fuzz-"))


def _paths(node, prefix=()) -> list[tuple]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append(prefix + (key,))
            out += _paths(value, prefix + (key,))
    return out


def _get(path: tuple):
    node = BASE
    for key in path:
        node = node[key]
    return node


PATHS = _paths(BASE)
DICT_PATHS = [()] + [p for p in PATHS if isinstance(_get(p), dict)]

scalars = (st.none() | st.booleans() | st.integers(-3, 10**12) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12) | st.sampled_from(["", "~", "/", "..", "g+rwX", "o+w", "3.x", "\x00",
                                                    "nonexistent/0.0", "MPI", "tcl", "lua", "*:*"]))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=5)


def _apply(mutations) -> dict:
    import copy

    data = copy.deepcopy(BASE)
    for kind, path, value in mutations:
        parent = data
        for key in path[:-1]:
            if not isinstance(parent, dict) or key not in parent:
                break
            parent = parent[key]
        else:
            if not isinstance(parent, dict):
                continue
            if kind == "set" and path:
                parent[path[-1]] = value
            elif kind == "del" and path:
                parent.pop(path[-1], None)
            elif kind == "add":
                target = parent.get(path[-1]) if path else parent
                if isinstance(target, dict):
                    target[value if isinstance(value, str) and value else "extra"] = 1
    return data


mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS), values),
    st.tuples(st.just("del"), st.sampled_from(PATHS), st.none()),
    st.tuples(st.just("add"), st.sampled_from(DICT_PATHS), st.text(min_size=1, max_size=8)),
)
site_texts = st.one_of(
    st.lists(mutation, min_size=1, max_size=4).map(lambda m: yaml.safe_dump(_apply(m))),
    st.text(max_size=200),  # not even YAML, often
    st.sampled_from(["", "- a\n- b\n", "name: [", "{}", "null", "name: x\n" * 2, ":\n  - ]"]),
)


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse: usage error (2) or --help (0)
            status = exc.code if isinstance(exc.code, int) else 2
    return status, err.getvalue()


def _check(argv: list[str]) -> None:
    status, err = _run(argv)
    assert status in (0, 1, 2), (argv, status, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if status:
        assert err.strip(), (argv, "a failure must say why")


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=site_texts, command=st.sampled_from(["install", "uninstall", "show", "validate"]))
def test_generated_site_configs_never_give_a_traceback(text, command):
    site = TMP / "site.yaml"
    site.write_text(text)
    root = str(TMP / "root")
    argv = {
        "install": ["install", "pytorch/2.3.1-gpu", "--site", str(site), "--dry-run"],
        "uninstall": ["uninstall", "pytorch/2.3.1-gpu", "--site", str(site), "--dry-run"],
        "show": ["show", "pytorch/2.3.1-gpu", "--site", str(site)],
        "validate": ["validate", "pytorch/2.3.1-gpu", "--site", str(site), "--dry-run"],
    }[command]
    argv += ["--prefix", root] + (["--module-root", root] if command != "show" else [])
    _check(argv)


WORDS = ["pytorch/2.3.1-gpu", "tiny/1.0", "nope", "", "-", "--", "localhost", "cirrus", "nowhere", "0", "-1",
         "3", "build", "module", "fetch", "a/b/c", "../x", "x.py", "PyTorch,MPI", "1,2", "horovod", "ddp",
         str(TMP / "site.yaml"), str(TMP / "root"), str(TMP / "nothing"), "\x00", "é", "plan.json"]
OPTIONS = ["--site", "--prefix", "--module-root", "--dry-run", "--force", "--no-wait", "--json", "--stop-after",
           "--jobs", "-j", "--file", "--ranks", "--nodes", "--local", "--backend", "--require", "--output-dir",
           "--partition", "--version"]
#: Appended last (argparse keeps the last value): every command runs on temporary roots and
#: changes nothing.
SAFE = {
    "install": ["--dry-run", "--prefix", str(TMP / "root"), "--module-root", str(TMP / "root")],
    "uninstall": ["--dry-run", "--prefix", str(TMP / "root"), "--module-root", str(TMP / "root")],
    "validate": ["--dry-run", "--prefix", str(TMP / "root"), "--module-root", str(TMP / "root"),
                 "--output-dir", str(TMP / "out")],
    "show": ["--prefix", str(TMP / "root")],
    "list": [],
    "check-build": ["--horovodrun", str(TMP / "no-horovodrun")],
}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(command=st.sampled_from(sorted(SAFE) + ["bogus", ""]),
       words=st.lists(st.sampled_from(WORDS) | st.sampled_from(OPTIONS) | st.text(max_size=8), max_size=6))
def test_generated_command_lines_never_give_a_traceback(command, words):
    (TMP / "site.yaml").write_text(yaml.safe_dump(BASE))
    _check([command, *words, *SAFE.get(command, [])])
