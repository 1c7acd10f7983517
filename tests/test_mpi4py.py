"""The mpi4py/4.1.2 recipe: a second stack through the same machinery, with no line of its own
under hpcstack/.

* dry runs for every shipped GPU site (conftest's ``gpu_sites()``: the cluster sites, which state
  their Python, so a dry run loads no module) of the install plan and the validation job scripts,
  against golden files (conftest's ``REGENERATE`` makes them; review the diff of ``tests/golden/``);
  the build is checked with the site's own ``toolchain.cc``;
* a real install on localhost into a temporary prefix, under Environment Modules (site
  ``localhost``) and Lmod (site ``localhost-lmod``, the same prefix: the second install takes the
  first one's wheel from the build cache), its sanity check and ``module load``;
* its validation: Slurm jobs on the local 2-node cluster (1 and 2 nodes) and ``--local``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

import hpcstack as package
from conftest import assert_site_golden, gpu_sites, hpcstack, two_node_cluster, user_writable_dir
from hpcstack.fsutil import current_user
from moduletools import TOOLS, require, tool_params

pytestmark = pytest.mark.integration

RECIPE = "mpi4py/4.1.2"
GOLDEN = Path(__file__).parent / "golden"
DATA_DIR = str(Path(package.__file__).resolve().parent / "data")


def normalise(text: str) -> str:
    """The dry-run as the golden files hold it: hpcstack's data directory, the validation
    directory, uv's path, build ids and the installing user (the permissions step hands that
    user's files over to the site's mode) written as placeholders."""
    text = text.replace(DATA_DIR, "@HPCSTACK_DATA@")
    text = text.replace(f" -user {current_user()} ", " -user @USER@ ")
    text = re.sub(r"[^\s=]*/hpcstack-validate-mpi4py-4\.1\.2-\d{8}-\d{6}", "@VALIDATION_DIR@", text)
    text = re.sub(r"(?<=\s)[^\s=]*/uv(?= pip | build )", "@UV@", text)
    return re.sub(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])", "@BUILD@", text)


@pytest.mark.unit  # a dry-run of sites that state their Python: no module tool, nothing installed
@pytest.mark.parametrize("site", gpu_sites())
@pytest.mark.parametrize("command", ["install", "validate"])
def test_dry_run_matches_the_golden_file(site, command):
    from hpcstack.site import load_site

    proc = hpcstack(command, RECIPE, "--site", site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    got = normalise(proc.stdout)
    assert_site_golden(GOLDEN / f"mpi4py-{site}-{command}.sh", got, site)
    if command == "install":
        # the plan itself, also where the site builds in a batch job (build.batch_job: the dry
        # run above shows the job step): the sdist checked, built with the site's wrapper, the
        # sanity program, the module
        plan = hpcstack(command, RECIPE, "--site", site, "--dry-run", "--on-login-node")
        assert plan.returncode == 0, plan.stderr
        assert "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02" in plan.stdout
        wrapper = load_site(site).toolchain.cc
        assert f"MPICC={wrapper}" in plan.stdout and f"mpi4py-sanity {wrapper}" in plan.stdout
        assert "mpi4py-validate" in plan.stdout
    else:
        assert "module load mpi4py/4.1.2" in got
        assert "/bin/mpi4py-validate --ring-bytes 1 --ring-loops 1000" in got
        assert "hpcstack-train-benchmark" not in got and "MASTER_PORT" not in got


def machine_cache_site(name: str, root: Path) -> Path:
    """The built-in site NAME as a file under ``root`` with the machine's cache as its
    ``cache_dir`` (an install with ``--prefix`` keeps a cache of its own under the prefix
    otherwise): the localhost sites share that cache, so mpi4py is compiled (about 3 minutes on
    2 cores) on the machine's first run only, and its build key decides (test_three_deliveries.py
    compiles it from empty caches, twice)."""
    import yaml

    from hpcstack.site import default_cache_dir

    site = yaml.safe_load((Path(package.data_root()) / "site-configs" / f"{name}.yaml").read_text())
    site.update(cache_dir=default_cache_dir())
    site_file = root / f"{name}.yaml"
    site_file.write_text(yaml.safe_dump(site))
    return site_file


@pytest.fixture(scope="module")
def installed(localhost_ready):
    """mpi4py installed for the localhost site (Environment Modules) with the machine's cache:
    (root, process, install args). The root is readable by all: the Slurm jobs run as the site's
    submit user."""
    root = Path(tempfile.mkdtemp(prefix="hpcstack-mpi4py-", dir="/var/tmp"))
    root.chmod(0o755)
    site_file = machine_cache_site("localhost", root)
    args = ["--site", str(site_file), "--prefix", str(root / "sw"), "--module-root", str(root / "mf-tcl")]
    proc = hpcstack("install", RECIPE, *args, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    yield root, proc, args
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def installed_lmod(installed):
    """The same recipe for localhost-lmod, with an install root and module root of its own (one
    stack per name and module tool: an install of another site over a published stack is
    refused); its cache is the first install's, so the build comes from the build cache."""
    require(next(t for t in TOOLS if t.name == "lmod"))
    root = installed[0]
    site_file = machine_cache_site("localhost-lmod", root)
    args = ["--site", str(site_file), "--prefix", str(root / "sw-lmod"), "--module-root", str(root / "mf-lua")]
    proc = hpcstack("install", RECIPE, *args, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return root, proc, args


def test_the_install_ran_the_sanity_check(installed):
    _, proc, _ = installed
    assert "] sanitycheck:" in proc.stderr or "sanitycheck done" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("tool", tool_params())
def test_module_load_gives_mpi4py_built_with_the_sites_mpicc(request, tool):
    require(tool)
    root, _, _ = request.getfixturevalue("installed_lmod" if tool.name == "lmod" else "installed")
    roots = root / ("mf-lua" if tool.syntax == "lua" else "mf-tcl")
    proc = tool.bash("module load mpi4py/4.1.2 || exit 1\n"
                     "python -c 'import mpi4py; from mpi4py import MPI; "
                     "print(mpi4py.__file__); print(mpi4py.get_config()); print(MPI.Get_library_version())'",
                     modulepath=f"{roots}:/opt/hpcstack/base-modulefiles")
    assert proc.returncode == 0, proc.stderr
    prefix = root / ("sw-lmod" if tool.name == "lmod" else "sw")
    assert os.path.realpath(proc.stdout.splitlines()[0]).startswith(os.path.realpath(prefix / "mpi4py"))
    assert "'mpicc': '/usr/bin/mpicc'" in proc.stdout and "Open MPI" in proc.stdout
    assert (roots / "mpi4py" / ("4.1.2.lua" if tool.syntax == "lua" else "4.1.2")).is_file()


def test_local_validation_passes_with_startup_figures(installed):
    _, _, args = installed
    proc = hpcstack("validate", RECIPE, *args, "--local", "--ranks", "2", timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "latency 1 B:" in proc.stdout and "start-up over 2 rank(s)" in proc.stdout
    assert "PASS" in proc.stdout


def test_slurm_validation_on_one_and_two_nodes(installed):
    _, _, args = installed
    with two_node_cluster():
        for out in user_writable_dir("hpcstack-test", "hpcstack-mpi4py-"):
            proc = hpcstack("validate", RECIPE, *args, "--nodes", "1,2", "--output-dir", str(out / "v"),
                            "--json", timeout=1800)
            report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            runs_ = {r["nodes"]: r for r in report["runs"]}
            assert set(runs_) == {1, 2} and all(r["backend"] == "mpi" for r in runs_.values())
            for r in runs_.values():
                assert r["ok"], r
                assert r["figures"]["latency"]["unit"] == "us" and r["figures"]["latency"]["value"] > 0
                assert r["startup"]["ranks"] == r["ranks"] and r["startup"]["first_step_s"]["max"] > 0
            print(json.dumps({n: {name: f["value"] for name, f in r["figures"].items()}
                              for n, r in runs_.items()}))
            md = (out / "v" / "report.md").read_text()
            assert "latency 1 B" in md and "Start-up per rank" in md
