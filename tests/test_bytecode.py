"""The venv's bytecode is reproducible (hpcstack/install/bytecode.py): the same files give the same
``.pyc`` bytes, whenever they were unpacked. Two deliveries of one stack (an online install, an
offline install from a bundle, an image) unpack the same wheels at other times; timestamp ``.pyc``
(Python's default, and pip's ``--compile``) hold the source's modification time and differ there.

Each test compiles one tree twice, the sources' modification times changed in between and the
``.pyc`` removed, through the product's own code: the compile action of the install step
(:func:`hpcstack.install.components.wheels.compile_run`, the pip backend and
``optimization_levels``) and uv's install action (:func:`~hpcstack.install.components.wheels.install_run`
with its ``--compile-bytecode`` environment); and the same with timestamp ``.pyc``, which differ
(the control: the tree's bytecode does depend on the times where the mode is wrong).
"""

from __future__ import annotations

import base64
import hashlib
import os
import py_compile
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcstack.install.components.wheels import compile_run, install_run
from hpcstack.site import InstallerConfig

pytestmark = pytest.mark.unit

#: A small package as wheels ship them: a package, constants and names that repeat, a module
#: with its own encoding, and Python 2 code that does not compile (left out, as pip and uv leave it).
TREE = {
    "tp/__init__.py": "from .mod import f, G\n__all__ = ['f', 'G']\n",
    "tp/mod.py": ("import os\n\nG = {'a': (1, 2.5, 'x' * 3), 'b': frozenset({'u', 'v'})}\n\n"
                  "def f(path=os.sep):\n    '''doc'''\n    return [path, G['a'], f'{path}!', b'bytes']\n\n"
                  "class C:\n    def m(self):\n        return f(self.__class__.__name__)\n"),
    "tp/latin.py": "# -*- coding: latin-1 -*-\nS = 'caf\xe9'\n",
    "tp/sub/__init__.py": "",
    "tp/sub/deep.py": "from ..mod import G\nH = sorted(G)\nassert __debug__\n",
    "tp/_vendor/py2.py": "print 'python 2'\n",
}


def write_tree(root: Path) -> None:
    for name, text in TREE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("latin-1" if "latin-1" in text else "utf-8"))


def pycs(root: Path) -> dict[str, bytes]:
    """``{path under root: bytes}`` of every ``.pyc`` under ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.pyc"))}


def retime(root: Path, when: int) -> None:
    """Remove the ``.pyc`` under ``root`` and set every source's times to ``when`` (s)."""
    for d in list(root.rglob("__pycache__")):
        shutil.rmtree(d)
    for p in root.rglob("*.py"):
        os.utime(p, (when, when))


def run(action, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a planned :class:`~hpcstack.install.actions.Run` as the install does: its argv in the
    environment it builds (:meth:`Run.command_env`), from ``/``."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(list(action.argv), env={**action.command_env(base), **(env or {})}, cwd="/",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_the_install_steps_compile_gives_the_same_bytes_for_sources_of_other_times(tmp_path):
    sp = tmp_path / "site-packages"
    write_tree(sp)
    action = compile_run(sys.executable, (str(sp),), (0, 1), jobs=2)
    assert action.argv[1:3] == ("-I", "-B") and action.argv[3].endswith("/install/bytecode.py")

    retime(sp, 1_000_000_000)
    first = run(action)
    before = pycs(sp)
    retime(sp, 1_300_000_000)
    run(action)
    after = pycs(sp)

    assert first.stdout.splitlines()[0] == "bytecode: 5 files compiled (unchecked-hash), levels 0, 1", first.stdout
    assert f"not compiled (left to Python at import): {sp / 'tp/_vendor/py2.py'}" in first.stdout
    tag = sys.implementation.cache_tag
    assert f"tp/__pycache__/mod.{tag}.pyc" in before and f"tp/sub/__pycache__/deep.{tag}.opt-1.pyc" in before
    assert len(before) == 10, sorted(before)  # 5 modules, 2 levels; not the Python 2 file
    assert {int.from_bytes(b[4:8], "little") for b in before.values()} == {1}  # PEP 552: unchecked hash
    assert after == before
    # and Python imports them as they are (it reads no source to check them)
    check = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(sp)!r}); "
                            "import tp, tp.latin, tp.sub.deep; print(tp.latin.S, tp.f()[1])"],
                           cwd="/", capture_output=True, text=True)
    assert check.stdout == "caf\xe9 (1, 2.5, 'xxx')\n", check.stderr
    assert pycs(sp) == before


def test_timestamp_bytecode_of_the_same_sources_differs_the_control(tmp_path):
    """What the mode prevents: Python's default ``.pyc`` of the same file, at other times."""
    src = tmp_path / "mod.py"
    src.write_text(TREE["tp/mod.py"])
    got = []
    for when in (1_000_000_000, 1_300_000_000):
        os.utime(src, (when, when))
        cfile = tmp_path / f"mod-{when}.pyc"
        py_compile.compile(str(src), cfile=str(cfile), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        got.append(cfile.read_bytes())
    assert got[0] != got[1] and got[0][16:] == got[1][16:]  # the header alone: the time


def _wheel(where: Path) -> Path:
    """``tp-1.0-py3-none-any.whl`` holding :data:`TREE`."""
    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    files = {name: text.encode("latin-1" if "latin-1" in text else "utf-8") for name, text in TREE.items()}
    files["tp-1.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: tp\nVersion: 1.0\n"
    files["tp-1.0.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    path = where / "tp-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        rows = []
        for name, data in files.items():
            z.writestr(name, data)
            rows.append(f"{name},{digest(data)},{len(data)}")
        z.writestr("tp-1.0.dist-info/RECORD", "\n".join(rows + ["tp-1.0.dist-info/RECORD,,"]) + "\n")
    return path


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["hpcstack", "timestamp"])
def test_uv_install_compiles_the_same_bytes_for_sources_of_other_times(tmp_path, mode):
    """uv's install action as hpcstack plans it (``--compile-bytecode`` in its environment), into
    one venv twice, the sources' times changed in between: the same ``.pyc`` bytes. The control
    (``timestamp``: the same action with ``PYC_INVALIDATION_MODE=TIMESTAMP``) differs."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, cwd="/")
    ctx = SimpleNamespace(site=SimpleNamespace(installer=InstallerConfig()), cache_dir=str(tmp_path / "cache"),
                          python=str(venv / "bin" / "python"))
    action = install_run(ctx, "--no-index", "--find-links", str(wheels), "tp==1.0", reinstall=("tp",))
    assert "--compile-bytecode" in action.argv and action.env == {"PYC_INVALIDATION_MODE": "UNCHECKED_HASH"}
    env = {"PYC_INVALIDATION_MODE": "TIMESTAMP"} if mode == "timestamp" else {}
    sp = next(venv.glob("lib/python3*/site-packages"))

    run(action, env)
    got = []
    for when in (1_000_000_000, 1_300_000_000):
        retime(sp / "tp", when)  # the venv's files are hard links to uv's cache: the same times there
        run(action, env)         # reinstalled from the cache, compiled again
        got.append(pycs(sp / "tp"))

    assert len(got[0]) == 5, sorted(got[0])
    if mode == "hpcstack":
        assert {int.from_bytes(b[4:8], "little") for b in got[0].values()} == {1}
        assert got[1] == got[0]
    else:
        assert {int.from_bytes(b[4:8], "little") for b in got[0].values()} == {0}
        assert all(got[1][name] != got[0][name] for name in got[0]), "timestamp .pyc did not change with the times"
