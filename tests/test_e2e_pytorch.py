"""The real thing on localhost: the stack pytorch/2.3.1-gpu that the README's main command installed
(real torch download, real Horovod build) under /opt/hpcstack; load its module, check the build,
validate on 2 ranks, extend a user's venv. The stack comes from the ``installed_stack`` fixture
(tests/conftest.py), which runs the README's install command: the test run's one real install.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from conftest import STACK_MODULES, STACK_PREFIX, STACK_TOP, bash_modules, hpcstack

pytestmark = pytest.mark.e2e

E2E_ROOT = STACK_TOP
ARGS = ["--site", "localhost"]
PREFIX = STACK_PREFIX
USE = f"module use /opt/hpcstack/base-modulefiles {STACK_MODULES}"


@pytest.fixture(scope="module")
def installed(installed_stack):
    return installed_stack


def test_install_records_every_step(installed):
    steps = {p.stem for p in (PREFIX / ".hpcstack" / "steps").glob("*.json")}
    assert steps == {"fetch", "venv", "wheels", "patch", "build", "install", "sanitycheck", "permissions", "module"}
    assert (E2E_ROOT / "modulefiles" / "pytorch" / "2.3.1-gpu").is_file()


def sbom_sample(files: dict[str, list[dict]], spread: int = 20, shared: int = 4) -> list[tuple[str, str, str]]:
    """``(distribution, path, sha256)`` of ``spread`` file components taken at even steps over the
    SBOM's files (in its order) and of ``shared`` ``.so`` files taken likewise over the ``.so``
    files (at least one: the stack has compiled code)."""
    flat = [(dist, f["name"], f["hashes"][0]["content"]) for dist, fs in files.items() for f in fs if f.get("hashes")]
    libs = [entry for entry in flat if entry[1].endswith(".so") or ".so." in entry[1]]
    assert len(flat) >= spread and libs, f"{len(flat)} files, {len(libs)} shared libraries in the SBOM"
    picked = {flat[i * len(flat) // spread] for i in range(spread)}
    picked |= {libs[i * len(libs) // shared] for i in range(min(shared, len(libs)))}
    return sorted(picked)


def test_the_stack_carries_its_constraints_and_sbom(installed):
    """The stack says what is in it: the install writes constraints.txt and the CycloneDX SBOM next to the provenance,
    the modulefile names the constraints, and `hpcstack show` points to the SBOM."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    state = PREFIX / ".hpcstack"
    constraints = (state / "constraints.txt").read_text().splitlines()
    assert "horovod==0.28.1" in constraints and "torch==2.3.1" in constraints
    doc = json.loads((state / "sbom.cdx.json").read_text())
    # every file of every distribution, each a file component with its sha256 (torch: ~10,000);
    # the schema is checked on the first 20 files of each (the validator takes minutes on all
    # 25,000, and every file component has this one shape: checked below)
    files = {c["name"]: c.get("components", []) for c in doc["components"] if c.get("purl")}
    assert len(files["torch"]) > 9000 and any(f["name"] == "torch/__init__.py" for f in files["torch"])
    # every file has its one SHA-256 (a wheel holds no links), but those the install removes on
    # purpose (ipykernel's kernelspec of the build's venv, StackTools): marked missing, and gone
    site_packages = next(PREFIX.glob("venv/lib/python3*/site-packages"))
    assert all(f["type"] == "file" for fs in files.values() for f in fs)
    unhashed = [(dist, f) for dist, fs in files.items() for f in fs if not f.get("hashes")]
    assert all([h["alg"] for h in f["hashes"]] == ["SHA-256"] for fs in files.values() for f in fs if f.get("hashes"))
    for dist, f in unhashed:
        assert {"name": "hpcstack:missing", "value": "true"} in f.get("properties", []), (dist, f)
        assert f["name"].startswith("../../../share/jupyter/kernels/"), f"{dist}: {f['name']} has no hash"
        assert not os.path.lexists(site_packages / f["name"]), (dist, f["name"])
    assert len(unhashed) < 10, [f["name"] for _, f in unhashed]
    # and the hashes are those of the files on disk: a sample spread over the SBOM, with .so files
    for dist, path, digest in sbom_sample(files):
        on_disk = hashlib.sha256((site_packages / path).resolve().read_bytes()).hexdigest()
        assert on_disk == digest, f"{dist}: {path}: sha256 {on_disk} on disk, {digest} in the SBOM"
    for c in doc["components"]:
        if c.get("components"):
            c["components"] = c["components"][:20]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc)) is None
    names = {c["name"] for c in doc["components"]}
    assert {"torch", "horovod", "horovod-0.28.1-cxx17.patch", "C compiler"} <= names
    modulefile = (E2E_ROOT / "modulefiles" / "pytorch" / "2.3.1-gpu").read_text()
    assert f"setenv PIP_CONSTRAINT {{{PREFIX}/.hpcstack/constraints.txt}}" in modulefile
    assert "setenv PYTHONNOUSERSITE {1}" in modulefile
    assert os.access(PREFIX / "bin" / "hpcstack-doctor", os.X_OK)
    # what users meet: a pip that says where packages go, the examples, the exact base module,
    # and no kernelspec of the stack's own venv (ipykernel's python3, under the build's path)
    assert os.access(PREFIX / "bin" / "pip", os.X_OK) and (PREFIX / "bin" / "pip3").is_symlink()
    assert (PREFIX / "examples" / "digits" / "train_digits.py").is_file()
    assert not (PREFIX / "venv" / "share" / "jupyter" / "kernels").exists()
    assert "depends-on python/3." in modulefile and "module-whatis {Packages: torch 2.3.1" in modulefile
    show = hpcstack("show", str(PREFIX))
    assert f"sbom:          {os.path.realpath(PREFIX)}/.hpcstack/sbom.cdx.json" in show.stdout, show.stdout


def test_module_load_gives_torch_and_horovod_and_unload_restores(installed):
    proc = bash_modules(f"""
    {USE}
    filter() {{ env | sort | grep -v -E '^(_|SHLVL|OLDPWD|LOADEDMODULES|_LMFILES_|__MODULES_[A-Z_]*)='; }}
    before=$(filter)
    module load pytorch/2.3.1-gpu || exit 1
    python -c 'import torch, torchvision, torchaudio, torchmetrics, torchtext, horovod.torch as hvd; print("TORCH", torch.__version__, torch.__file__)'
    python -c 'import sys, json; print("SYSPATH", json.dumps(sys.path))'
    module unload pytorch/2.3.1-gpu
    [ "$before" = "$(filter)" ] && echo RESTORED
    """)
    assert "TORCH 2.3.1" in proc.stdout, proc.stderr
    assert "RESTORED" in proc.stdout
    # the stack's modules by their real path in the published build (one realpath per import of
    # torch walks no symbolic link), and sys.path a plain venv's: site-packages once, after the
    # standard library (venv/lib/.../00-hpcstack-paths.pth)
    torch_file = re.search(r"^TORCH 2\.3\.1\S* (\S+)$", proc.stdout, re.M).group(1)  # version 2.3.1+cu121
    build = os.path.realpath(PREFIX)
    assert torch_file.startswith(build + "/venv/") and os.path.realpath(torch_file) == torch_file
    sys_path = json.loads(proc.stdout.split("SYSPATH ")[1].splitlines()[0])
    site_packages = [p for p in sys_path if p.endswith("site-packages")]
    assert site_packages == [str(Path(torch_file).parent.parent)], sys_path
    stdlib = next(i for i, p in enumerate(sys_path) if re.search(r"/lib/python3\.\d+$", p))
    assert sys_path.index(site_packages[0]) > stdlib, sys_path


def test_check_build_under_the_module_shows_pytorch_mpi_gloo(installed):
    proc = bash_modules(f"{USE}; module load pytorch/2.3.1-gpu && horovodrun --check-build")
    assert proc.returncode == 0, proc.stderr
    from hpcstack.install.components.checkbuild import missing_flags, parse_check_build

    flags = parse_check_build(proc.stdout)
    assert missing_flags(flags, ["PyTorch", "MPI", "Gloo"]) == []
    assert flags["Operations"]["NCCL"] is False  # CPU operations only on localhost


def test_rerun_is_up_to_date(installed):
    mf = E2E_ROOT / "modulefiles" / "pytorch" / "2.3.1-gpu"
    before = mf.stat().st_mtime_ns
    start = time.monotonic()
    proc = hpcstack("install", "pytorch/2.3.1-gpu", *ARGS)
    print(f"up-to-date re-run: {time.monotonic() - start:.2f} s")
    assert proc.returncode == 0 and "up to date" in proc.stderr, proc.stderr
    assert mf.stat().st_mtime_ns == before


def test_validate_trains_on_two_ranks(installed):
    # --local: two ranks on this host with the site's launcher (without it, localhost validates
    # through Slurm jobs: tests/test_validate_slurm.py)
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", *ARGS, "--local", "--json", timeout=900)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    assert result["ok"] is True
    records = result["records"]
    ranks = {r["rank"] for r in records if r["record"] == "throughput"}
    assert ranks == {0, 1}
    conv = next(r for r in records if r["record"] == "convergence")
    assert conv["loss_fell"] and conv["params_identical"]


def test_extend_venv_activate_loads_and_unloads_the_module(installed, tmp_path):
    venv = tmp_path / "my venv"
    proc = bash_modules(f"""
    {USE}
    /usr/bin/python3 -m venv "{venv}"
    module load pytorch/2.3.1-gpu
    extend-venv-activate "{venv}" || exit 1
    module unload pytorch/2.3.1-gpu
    source "{venv}/bin/activate"
    echo "LOADED=$LOADEDMODULES"
    echo "PYTHON=$(command -v python)"
    python -c 'import torch, horovod.torch; print("OK", torch.__version__)'
    echo "PP=$PYTHONPATH"
    deactivate
    echo "AFTER=$LOADEDMODULES"
    """)
    out = proc.stdout
    assert "pytorch/2.3.1-gpu" in out.split("LOADED=")[1].splitlines()[0], proc.stderr
    assert f"PYTHON={venv}/bin/python" in out
    assert "OK 2.3.1" in out
    pp = out.split("PP=")[1].splitlines()[0]
    assert "" not in pp.split(":"), pp
    assert "pytorch" not in out.split("AFTER=")[1].splitlines()[0]
