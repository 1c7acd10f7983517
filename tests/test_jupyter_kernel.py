"""``hpcstack kernel install | remove``: a Jupyter kernel that runs in the installed stack.

The kernel is started by the real ``jupyter_client`` (as JupyterLab and JupyterHub start it) from
the kernelspec hpcstack writes, under Environment Modules and under Lmod; it must load the
module, run ``import torch, horovod.torch`` in the stack's own Python (its ipykernel comes from
the recipe's lock) and shut down. A kernel whose module cannot load must die at once with the
module tool's message, not leave Jupyter waiting.

The stack is the one tests/test_e2e_pytorch.py installs (found through tests/moduletools.py's
INSTALL_TOPS; this file's name sorts after it, so in a full run the install comes first); used read
only. About 10 s per tool when it is there.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jupyter_client  # noqa: F401  (the test extras have it: a missing one is an error, not a skip)
import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.errors import ConfigError
from hpcstack.modules import kernel
from moduletools import ENVIRONMENT_MODULES, LMOD, find_installed_stack, require, tool_params

pytestmark = pytest.mark.unit

SITES = {"environment-modules": "localhost", "lmod": "localhost-lmod"}


def site_config(tmp_path: Path, tool, install_root: Path, module_root: Path) -> Path:
    """A copy of the localhost (or localhost-lmod) site config with the stack's roots."""
    data = yaml.safe_load((REPO / "site-configs" / f"{SITES[tool.name]}.yaml").read_text())
    data.update(name=f"kernel-{tool.short}", install_root=str(install_root), module_root=str(module_root))
    path = tmp_path / f"kernel-{tool.short}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start(kernels: Path, name: str, stderr_path: Path, env: dict | None = None):
    """Start the kernel ``name`` from ``kernels`` with jupyter_client; return (manager, client).

    The kernel's environment is this one without ``BASH_ENV``, ``MODULEPATH`` and
    ``LOADEDMODULES`` (as a Jupyter server started outside a module shell has it), plus ``env``."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    with open(stderr_path, "w") as err:
        km.start_kernel(stderr=err, env={**{k: v for k, v in os.environ.items()
                                            if k not in ("BASH_ENV", "MODULEPATH", "LOADEDMODULES")},
                                         **(env or {})})
    kc = km.client()
    kc.start_channels()
    return km, kc


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    found = find_installed_stack(tmp_path_factory.mktemp("lua-root"))
    if isinstance(found, str):
        pytest.skip(found)
    if not list((found.prefix / "venv" / "lib").glob("python3.*/site-packages/ipykernel")):
        pytest.skip(f"the stack at {found.prefix} has no ipykernel (installed from an older lock; "
                    "tests/test_e2e_pytorch.py reinstalls it)")
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("tool", tool_params())
def test_the_kernel_runs_torch_and_horovod_in_the_stack(tool, stack, tmp_path):
    require(tool)
    site = site_config(tmp_path, tool, stack.prefix.parent.parent, stack.roots[tool.syntax])
    jp = tmp_path / "jupyter"
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp))
    assert proc.returncode == 0, proc.stderr
    kernels = jp / "share" / "jupyter" / "kernels"
    spec = json.loads((kernels / "pytorch-2.3.1-gpu" / "kernel.json").read_text())
    assert spec["display_name"] == "PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard"
    assert spec["argv"][-1] == "{connection_file}" and spec["language"] == "python"
    launcher = (kernels / "pytorch-2.3.1-gpu" / "launch").read_text()
    assert f"source {tool.init('bash')}" in launcher and "module load pytorch/2.3.1-gpu" in launcher

    started = time.monotonic()
    km, kc = start(kernels, "pytorch-2.3.1-gpu", tmp_path / "stderr")
    try:
        kc.wait_for_ready(timeout=120)
        out = []
        reply = kc.execute_interactive(
            "import sys, torch, horovod.torch; print(torch.__version__); print(sys.executable)",
            timeout=120, output_hook=out.append)
        text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
        print(f"{tool.name}: kernel ready and import done in {time.monotonic() - started:.1f} s")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert reply["content"]["status"] == "ok", reply["content"]
    lines = text.split()
    assert lines[0].startswith("2.3.1"), text
    # the stack's own python (its venv), not the one running the tests
    assert Path(lines[1]).parent == stack.prefix.resolve() / "venv" / "bin" or \
        Path(lines[1]).parent == stack.prefix / "venv" / "bin", text
    assert not km.is_alive()

    proc = hpcstack("kernel", "remove", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp))
    assert proc.returncode == 0, proc.stderr
    assert not (kernels / "pytorch-2.3.1-gpu").exists()


@pytest.mark.integration
@pytest.mark.parametrize("tool", tool_params())
def test_a_kernel_whose_module_cannot_load_dies_with_the_tools_message(tool, tmp_path):
    """The stack was uninstalled after the kernel was written: the launcher's `module load` fails."""
    require(tool)
    module_root = tmp_path / "modulefiles"
    tool.write_module(module_root, "pytorch/2.3.1-gpu", setenv={"X": "1"})
    site = site_config(tmp_path, tool, tmp_path / "software", module_root)
    jp = tmp_path / "jupyter"
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp))
    assert proc.returncode == 0, proc.stderr
    for f in (module_root / "pytorch").iterdir():
        f.unlink()

    # The module path is the test's own (an empty directory), not the machine's: the README's main
    # command publishes a real pytorch/2.3.1-gpu in the module root that the tool's init puts on an
    # empty MODULEPATH, and the launcher would load that one.
    (tmp_path / "no-modules").mkdir()
    km, kc = start(jp / "share" / "jupyter" / "kernels", "pytorch-2.3.1-gpu", tmp_path / "stderr",
                   env={"MODULEPATH": str(tmp_path / "no-modules")})
    try:
        # wait_for_ready's timeout is a bound, not a measurement: a kernel that dies is seen at once
        with pytest.raises(RuntimeError, match="Kernel died"):
            kc.wait_for_ready(timeout=120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    err = (tmp_path / "stderr").read_text()
    # the tool's own words, then the launcher's line
    tool_says = "Unable to locate a modulefile" if tool is ENVIRONMENT_MODULES else "unknown"
    assert tool_says in err and "pytorch/2.3.1-gpu" in err, err
    assert "kernel pytorch-2.3.1-gpu: module load pytorch/2.3.1-gpu failed" in err, err


def fake_site(tmp_path: Path) -> tuple[Path, Path]:
    """A site whose module root holds a pytorch/2.3.1-gpu modulefile (no stack: files only)."""
    tool = ENVIRONMENT_MODULES
    module_root = tmp_path / "modulefiles"
    (module_root / "pytorch").mkdir(parents=True)
    (module_root / "pytorch" / "2.3.1-gpu").write_text("#%Module\n")
    return site_config(tmp_path, tool, tmp_path / "software", module_root), tmp_path / "jupyter"


@pytest.mark.integration
def test_install_then_remove_leaves_nothing_and_user_goes_to_jupyter_data_dir(tmp_path):
    site, _ = fake_site(tmp_path)
    env = {"JUPYTER_DATA_DIR": str(tmp_path / "data")}
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--user", "--name", "torch-a", env=env)
    assert proc.returncode == 0, proc.stderr
    kdir = tmp_path / "data" / "kernels" / "torch-a"
    assert sorted(p.name for p in kdir.iterdir()) == ["kernel.json", "launch"]
    assert os.access(kdir / "launch", os.X_OK)
    # a second install replaces it in place (no leftovers beside it)
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--user", "--name", "torch-a", env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in kdir.parent.iterdir()) == ["torch-a"]
    proc = hpcstack("kernel", "remove", "pytorch/2.3.1-gpu", "--site", str(site), "--user", "--name", "torch-a", env=env)
    assert proc.returncode == 0 and "removed kernel torch-a" in proc.stdout, proc.stderr
    assert list(kdir.parent.iterdir()) == []


@pytest.mark.integration
def test_the_venv_is_activated_after_the_module(tmp_path):
    site, jp = fake_site(tmp_path)
    venv = tmp_path / "myvenv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("# >>> hpcstack pytorch/2.3.1-gpu >>>\n# <<< hpcstack pytorch/2.3.1-gpu <<<\n")
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp), "--venv", str(venv))
    assert proc.returncode == 0, proc.stderr
    kdir = jp / "share" / "jupyter" / "kernels" / "pytorch-2.3.1-gpu"
    launcher = (kdir / "launch").read_text()
    assert launcher.index("module load pytorch/2.3.1-gpu") < launcher.index(f"source {venv}/bin/activate") \
        < launcher.index(f"exec {venv}/bin/python -m ipykernel_launcher")
    spec = json.loads((kdir / "kernel.json").read_text())
    assert spec["metadata"]["hpcstack"]["venv"] == str(venv) and str(venv) in spec["display_name"]


@pytest.mark.integration
@pytest.mark.parametrize("args, says", [
    (["--name", "my kernel"], "--name 'my kernel': a kernel name has only"),
    (["--venv", "/nonexistent-venv"], "--venv /nonexistent-venv: no /nonexistent-venv/bin/activate"),
    (["--venv", "PLAIN"], "not extended for pytorch/2.3.1-gpu"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, says):
    site, jp = fake_site(tmp_path)
    if "PLAIN" in args:
        (tmp_path / "plain" / "bin").mkdir(parents=True)
        (tmp_path / "plain" / "bin" / "activate").write_text("# a plain venv\n")
        args = ["--venv", str(tmp_path / "plain")]
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp), *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not jp.exists()


@pytest.mark.integration
def test_a_stack_that_is_not_installed_is_refused(tmp_path):
    site = site_config(tmp_path, ENVIRONMENT_MODULES, tmp_path / "software", tmp_path / "empty")
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(tmp_path / "jp"))
    assert proc.returncode == 2 and "is not installed for site kernel-modules" in proc.stderr, proc.stderr
    assert not (tmp_path / "jp").exists()


@pytest.mark.integration
def test_a_kernel_hpcstack_did_not_write_is_neither_replaced_nor_removed(tmp_path):
    site, jp = fake_site(tmp_path)
    foreign = jp / "share" / "jupyter" / "kernels" / "pytorch-2.3.1-gpu"
    foreign.mkdir(parents=True)
    (foreign / "kernel.json").write_text('{"argv": ["python"], "display_name": "mine", "language": "python"}')
    for action in ("install", "remove"):
        proc = hpcstack("kernel", action, "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp))
        assert proc.returncode == 2 and "a kernel that hpcstack did not write" in proc.stderr, proc.stderr
    assert json.loads((foreign / "kernel.json").read_text())["display_name"] == "mine"


@pytest.mark.integration
def test_lmod_gets_no_bash_env_unset_and_modules_does(tmp_path):
    """Environment Modules' launcher clears BASH_ENV (a site's Lmod profile would take over child
    shells); Lmod's keeps it."""
    lines = {}
    for tool in (ENVIRONMENT_MODULES, LMOD):
        module_root = tmp_path / tool.short
        tool.write_module(module_root, "pytorch/2.3.1-gpu")
        site = site_config(tmp_path, tool, tmp_path / "software", module_root)
        jp = tmp_path / f"jp-{tool.short}"
        proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(jp))
        assert proc.returncode == 0, proc.stderr
        lines[tool.short] = (jp / "share" / "jupyter" / "kernels" / "pytorch-2.3.1-gpu" / "launch").read_text()
    assert "unset BASH_ENV" in lines["modules"] and "unset BASH_ENV" not in lines["lmod"]
    assert "source /usr/share/lmod/lmod/init/bash" in lines["lmod"]


# ------------------------------------------------- the site a loaded stack recorded (kernel without --site)

def _loaded_stack(tmp_path, site="localhost"):
    """``<tmp>/sw/tiny/1.0 -> .1.0-abc`` with the records an install leaves in the build."""
    top = tmp_path / "sw" / "tiny"
    state = top / ".1.0-abc" / ".hpcstack"
    state.mkdir(parents=True)
    (state / "provenance.json").write_text(json.dumps({"site": {"name": site, "file": "/srv/s.yaml"}}))
    (state / "site.json").write_text(json.dumps({"install_root": str(tmp_path / "sw"),
                                                 "module_root": str(tmp_path / "mf")}))
    (top / "1.0").symlink_to(".1.0-abc")
    return top / "1.0", state


def test_the_site_a_loaded_stack_recorded_is_read_through_its_prefix_link(tmp_path):
    from hpcstack import trust

    prefix, _ = _loaded_stack(tmp_path)
    pol = trust.Policy(uid=os.geteuid())
    assert kernel.recorded_site("HPCSTACK_TINY_ROOT", str(prefix), "1.0", ["localhost"], pol) == (
        "localhost", {"install_root": str(tmp_path / "sw"), "module_root": str(tmp_path / "mf")})
    assert kernel.recorded_site("HPCSTACK_TINY_ROOT", str(prefix), "1.0", [], pol)[0] == "/srv/s.yaml"
    # not this stack's prefix, relative, missing or not hpcstack's records: inferred otherwise
    assert kernel.recorded_site("V", str(prefix), "2.0", ["localhost"], pol) is None
    assert kernel.recorded_site("V", "sw/tiny/1.0", "1.0", ["localhost"], pol) is None
    assert kernel.recorded_site("V", str(tmp_path / "none" / "1.0"), "1.0", ["localhost"], pol) is None
    (prefix / ".hpcstack" / "site.json").write_text("[1, 2]")
    assert kernel.recorded_site("V", str(prefix), "1.0", ["localhost"], pol) is None


@pytest.mark.parametrize("where", ["record", "directory"])
def test_a_recorded_site_another_account_can_change_is_refused(tmp_path, where):
    """The environment names the records (``HPCSTACK_<NAME>_ROOT``) and they choose the module
    root the kernel loads from: one that every user can write, or below a directory every user
    can write, is refused in one line naming the variable, the path and who can change it;
    --trust-writable (the control) reads it."""
    from hpcstack import trust

    prefix, state = _loaded_stack(tmp_path)
    if where == "record":
        (state / "site.json").chmod(0o666)
        said = f"{prefix / '.hpcstack' / 'site.json'}: writable by every user"
    else:
        (tmp_path / "sw").chmod(0o777)
        said = f"{tmp_path / 'sw'}: writable by every user"
    with pytest.raises(ConfigError) as exc:
        kernel.recorded_site("HPCSTACK_TINY_ROOT", str(prefix), "1.0", ["localhost"], trust.Policy(uid=os.geteuid()))
    [line] = exc.value.lines()
    assert line.startswith(f"HPCSTACK_TINY_ROOT={prefix}: ") and said in line and "--site" in line
    loose = trust.Policy(uid=os.geteuid(), trust_writable=True)
    assert kernel.recorded_site("HPCSTACK_TINY_ROOT", str(prefix), "1.0", ["localhost"], loose)[0] == "localhost"
