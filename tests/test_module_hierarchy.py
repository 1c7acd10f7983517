"""A site's module hierarchy (``modules.hierarchy``) with the real Lmod: JUWELS Booster's config,
its module names laid out in a hierarchy as JSC's Stages build it (``Stages/2024`` resets
MODULEPATH to its Core; ``GCC/12.3.0`` shows ``Python/3.11.3``, ``CUDA``, ``NCCL``, ``CMake`` and
``ParaStationMPI/5.9.2-1``, which sets ``SLURM_MPI_TYPE=pspmix``), stand-in modulefiles that only
set variables. What hpcstack writes for the site (the install plan's module loads, the stack's
modulefile with its ``depends_on`` lines, the validation job's module block, all from the dry
runs) is run by Lmod in a clean bash: each loads, in the hierarchy's order. The control: the base
module loaded first, as hpcstack did before the site declared its hierarchy, fails.

Sources: JSC's environment page, https://apps.fz-juelich.de/jsc/hps/juwels/environment.html
(Lmod, Stages, the hierarchy), and the easyconfigs of the Stages,
https://github.com/easybuilders/JSC (branches 2024 and 2025). Skips, with the reason, where Lmod is missing
(``scripts/localhost-setup --with-test-tools``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack
from moduletools import LMOD, require

pytestmark = pytest.mark.integration

RECIPE = "pytorch/2.3.1-gpu"
HIERARCHY = ["Stages/2024", "GCC/12.3.0", "ParaStationMPI/5.9.2-1"]


def _lua(path: Path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _jsc_like_modules(root: Path) -> Path:
    """Stand-ins for JSC's Stages/2024 hierarchy under ``root``; returns the directory on the
    default MODULEPATH (the Stages)."""
    stages, core = root / "stages", root / "2024" / "Core"
    gcc, mpi = root / "2024" / "Compiler" / "GCC" / "12.3.0", root / "2024" / "MPI" / "psmpi"
    # a Stage resets MODULEPATH: every directory but the Stages goes, its Core comes
    _lua(stages / "Stages" / "2024.lua",
         f'local keep = "{stages}"',
         'for dir in (os.getenv("MODULEPATH") or ""):gmatch("[^:]+") do',
         '    if dir ~= keep then remove_path("MODULEPATH", dir) end',
         'end',
         f'prepend_path("MODULEPATH", "{core}")')
    _lua(core / "GCC" / "12.3.0.lua", f'prepend_path("MODULEPATH", "{gcc}")', 'setenv("HIER_GCC", "12.3.0")')
    for name in ("Python/3.11.3", "CUDA/12", "NCCL/default-CUDA-12", "CMake/3.26.3"):
        key = "HIER_" + re.sub(r"\W", "_", name.split("/")[0]).upper()
        _lua(gcc / f"{name}.lua", f'setenv("{key}", "{name}")')
    _lua(gcc / "ParaStationMPI" / "5.9.2-1.lua", f'prepend_path("MODULEPATH", "{mpi}")',
         'setenv("SLURM_MPI_TYPE", "pspmix")')
    return stages


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    require(LMOD)
    root = tmp_path_factory.mktemp("jsc")
    stages = _jsc_like_modules(root)
    config = yaml.safe_load((REPO / "site-configs" / "juwels-booster.yaml").read_text())
    config["install_root"] = str(root / "sw")
    config["module_root"] = str(root / "sw" / "modulefiles")
    config["cache_dir"] = str(root / "cache")
    config["modules"]["init"] = {"bash": str(LMOD.init("bash"))}
    site = root / "juwels-booster.yaml"
    site.write_text(yaml.safe_dump(config, sort_keys=False))
    install = hpcstack("install", RECIPE, "--site", str(site), "--dry-run")
    assert install.returncode == 0, install.stderr
    validate = hpcstack("validate", RECIPE, "--site", str(site), "--nodes", "1", "--dry-run",
                        "--output-dir", str(root / "validation"))
    assert validate.returncode == 0, validate.stderr
    # the stack's modulefile as the install writes it, at its place, and the prefix it checks
    lua = re.search(r"<<'HPCSTACK_EOF'\n(-- pytorch/2\.3\.1-gpu:.*?)\nHPCSTACK_EOF\n", install.stdout, re.S).group(1)
    modulefile = Path(config["module_root"]) / "pytorch" / "2.3.1-gpu.lua"
    modulefile.parent.mkdir(parents=True)
    modulefile.write_text(lua + "\n")
    venv = root / "sw" / "pytorch" / "2.3.1-gpu" / "venv"
    venv.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return {"stages": str(stages), "install": install.stdout, "validate": validate.stdout,
            "module_root": config["module_root"], "site": str(site)}


def _run(twin, script: str):
    return LMOD.bash(script + '\necho "LOADED=$LOADEDMODULES"\necho "MPI=${SLURM_MPI_TYPE:-}"',
                     modulepath=twin["stages"])


def _loaded(proc) -> list[str]:
    return re.search(r"^LOADED=(.*)$", proc.stdout, re.M).group(1).split(":")


def test_the_base_module_is_hidden_until_the_hierarchy_is_loaded(twin):
    # the order hpcstack used before modules.hierarchy: Python/3.11.3 first
    proc = _run(twin, "module load Python/3.11.3 || exit 3")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "cannot be loaded as requested" in proc.stderr, proc.stderr       # Lmod's words


def test_the_install_plan_loads_the_build_environment(twin):
    head = twin["install"].split("set -euo pipefail\n", 1)[1].split("\n\n", 1)[0]
    cd, *preamble = head.splitlines()
    assert cd.startswith("cd / "), cd  # the script runs in a directory of root's
    assert all(l.startswith("module load ") for l in preamble), preamble
    assert preamble[:4] == [f"module load {m}" for m in [*HIERARCHY, "Python/3.11.3"]], preamble
    proc = _run(twin, "set -e\n" + "\n".join(preamble))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _loaded(proc) == [*HIERARCHY, "Python/3.11.3", "CUDA/12", "NCCL/default-CUDA-12", "CMake/3.26.3"]
    assert "MPI=pspmix" in proc.stdout                 # from the MPI module, not from hpcstack


def test_the_job_loads_the_hierarchy_then_the_stack(twin):
    script = twin["validate"].split("#!/bin/bash\n", 1)[1]
    start = script.index("\nsource ") + 1
    block = script[start:script.index("\n\n", start)]
    assert block.index("module load Stages/2024") < block.index(f"module use {twin['module_root']}")
    proc = _run(twin, block)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _loaded(proc) == [*HIERARCHY, "Python/3.11.3", "CUDA/12", "NCCL/default-CUDA-12", RECIPE]
    assert "MPI=pspmix" in proc.stdout


def test_the_module_root_used_before_the_stage_is_dropped(twin):
    """Why the jobs put the module root on MODULEPATH after the hierarchy: Stages resets it."""
    proc = _run(twin, f"module use {twin['module_root']}\nmodule load Stages/2024\n"
                      f"module load GCC/12.3.0 ParaStationMPI/5.9.2-1\nmodule load {RECIPE} || exit 3")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "unknown" in proc.stderr and RECIPE in proc.stderr, proc.stderr


def test_the_modulefile_loads_its_hierarchy_by_itself_in_order(twin):
    """The stack's depends_on lines name the hierarchy first, in order: a user who put the
    module root on MODULEPATH after loading Stages/2024 alone gets the rest from the modulefile."""
    proc = _run(twin, f"module load Stages/2024\nmodule use {twin['module_root']}\n"
                      f"module load {RECIPE} || exit 3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _loaded(proc) == [*HIERARCHY, "Python/3.11.3", "CUDA/12", "NCCL/default-CUDA-12", RECIPE]


def test_the_build_environment_loads_the_hierarchy_and_records_the_exact_names(twin):
    """A real install loads the same modules in python mode (hpcstack.modules.modsys), and the
    modulefile depends on the names Lmod loaded, hierarchy first."""
    from hpcstack.install.resolve import build_modules, loaded_modules
    from hpcstack.modules import modsys
    from hpcstack.site import load_site
    from moduletools import clean_env

    site = load_site(twin["site"])
    # what hpcstack.install.resolve.build_environment does, from a clean login environment
    built = modsys.build_environment(site.modules.tool, str(LMOD.command), site.modules.use,
                                     build_modules(site), env=clean_env(MODULEPATH=twin["stages"]))
    assert built["LOADEDMODULES"].split(":") == [*HIERARCHY, "Python/3.11.3", "CUDA/12",
                                                 "NCCL/default-CUDA-12", "CMake/3.26.3"]
    assert built.get("SLURM_MPI_TYPE") == "pspmix"
    assert loaded_modules(site, built) == (*HIERARCHY, "Python/3.11.3", "CUDA/12", "NCCL/default-CUDA-12")
