"""Site configs: the shipped ones validate; broken ones give one line per problem, exit 2, write nothing."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.errors import ConfigError
from hpcstack.site import load_site, check_config

pytestmark = pytest.mark.unit

SITES = sorted(p.stem for p in (REPO / "site-configs").glob("*.yaml"))


@pytest.mark.parametrize("name", SITES)
def test_shipped_site_configs_are_valid(name):
    site = load_site(name)
    assert site.name == name
    assert site.toolchain.cc and site.toolchain.cxx


def test_cirrus_is_faithful_to_the_instructions():
    site = load_site("cirrus")
    assert site.install_root == "/work/y07/shared/cirrus-software"
    assert site.modules.base == "python/3.12.1-gpu"
    assert "cmake/3.25.2" in site.modules.build
    tc = site.toolchain
    assert (tc.cc, tc.cxx, tc.fc) == ("mpicc", "mpicxx", "mpifort")
    assert tc.cuda_home == "${NVHPC_ROOT}/cuda/12.4" and tc.cuda_version == "12.4"
    assert tc.nccl_home == "${NVHPC_ROOT}/comm_libs/nccl"
    assert tc.cuda_cc_list == (70,)
    assert site.build_env["CUDA_PATH"] == "${NVHPC_ROOT}/cuda/12.4"
    assert site.slurm["partition"] == "gpu" and site.slurm["gpus_per_node"] == 4
    assert site.python_version == "3.12"


def test_juwels_booster_declares_its_module_hierarchy():
    """JSC's modules form a hierarchy (Stages resets MODULEPATH, GCC shows Python and the GCCcore
    modules, ParaStationMPI what is built with MPI): the base module loads only after it."""
    site = load_site("juwels-booster")
    assert site.modules.hierarchy == ["Stages/2024", "GCC/12.3.0", "ParaStationMPI/5.9.2-1"]
    assert site.modules.stack_modules() == ["Stages/2024", "GCC/12.3.0", "ParaStationMPI/5.9.2-1",
                                            "Python/3.11.3", "CUDA/12", "NCCL/default-CUDA-12"]
    assert site.modules.build_modules()[-1] == "CMake/3.26.3"
    # Slurm counts hardware threads there (SMT-2): 24 CPUs are 12 cores per rank
    assert site.slurm["cpus_per_task"] == 24
    assert "SLURM_MPI_TYPE" not in {**site.modules.env, **site.slurm.get("env", {})}
    assert site.slurm.get("mpi") is None         # ParaStationMPI's module sets SLURM_MPI_TYPE=pspmix


def test_sites_without_a_hierarchy_load_the_base_module_first():
    for name in ("cirrus", "localhost", "perlmutter"):
        modules = load_site(name).modules
        assert modules.hierarchy == [] and modules.stack_modules()[0] == modules.base, name


def test_perlmutter_needs_no_account_and_pins_cudatoolkit():
    site = load_site("perlmutter")
    assert site.slurm["account_required"] is False      # jobs go to the user's default project
    # the unversioned cudatoolkit moved to CUDA 13; the lock is chosen by toolchain.cuda.version
    assert "cudatoolkit/12.2" in site.modules.runtime and "cudatoolkit" not in site.modules.runtime
    assert site.toolchain.cuda_version == "12.2"
    assert "nccl/2.21.5" in site.modules.runtime and "comm_libs" not in site.toolchain.nccl_home
    assert site.modules.env == {"NCCL_SOCKET_IFNAME": "hsn", "MPICH_GPU_SUPPORT_ENABLED": "0"}


def test_cirrus_gives_the_tasks_shape_to_srun_and_hides_home():
    slurm = load_site("cirrus").slurm
    assert slurm["task_options"] == "srun" and slurm["srun_options"] == ["--hint=nomultithread"]
    assert slurm["login_only_paths"] == ["/home"] and slurm["exclusive"] is True
    assert slurm["account_required"] is True
    text = (REPO / "site-configs" / "cirrus.yaml").read_text()
    assert "8 December 2025" in text and "retired in October 2025" not in text


def test_a_site_holds_machine_facts_only():
    """What to build (Horovod's operations and flags, which lock) is the recipe's: a site config
    that still says it is refused with the key path."""
    data = _localhost()
    data["horovod"] = {"cpu_operations": "MPI", "required_flags": ["PyTorch"]}
    data["python"] = {"index": "cu121"}
    problems = check_config(data, "x.yaml")
    assert any("horovod: unknown key" in p for p in problems), problems
    assert any("python.index: unknown key" in p for p in problems), problems


def _localhost() -> dict:
    return yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d.update(colour="blue"), "colour: unknown key"),
    (lambda d: d["toolchain"].update(mpicc="mpicc"), "toolchain.mpicc: unknown key"),
    (lambda d: d["modules"].pop("base"), "modules.base: missing key"),
    (lambda d: d.pop("launcher"), "launcher: missing key"),
    (lambda d: d["launcher"].update(ranks="two"), "launcher.ranks: 'two' is not of type 'integer'"),
    (lambda d: d["toolchain"].update(cuda={"home": "/cuda", "version": "12.4", "cc_list": ["70"]}),
     "toolchain.cuda.cc_list.0: '70' is not of type"),
    (lambda d: d["toolchain"].update(cuda={"home": "/cuda"}), "toolchain.cuda.version: missing key"),
    (lambda d: d["modules"].update(tool="spack"), "modules.tool: 'spack' is not one of"),
    (lambda d: d["slurm"].update(time_limit="10 minutes"), "slurm.time_limit: '10 minutes' does not match"),
    (lambda d: d["slurm"].update(task_options="both"), "slurm.task_options: 'both' is not one of"),
    (lambda d: d["slurm"].update(srun_options=["--hint=nomultithread; rm -rf /"]), "slurm.srun_options.0:"),
    (lambda d: d["slurm"].update(srun_options="--hint=nomultithread"), "slurm.srun_options: '--hint"),
    (lambda d: d["slurm"].update(login_only_paths=["/home dir"]), "slurm.login_only_paths.0:"),
    (lambda d: d["modules"].update(hierarchy=["Stages/2024", "GCC 12.3.0"]), "modules.hierarchy.1:"),
    (lambda d: d["modules"].update(hierarchy="Stages/2024"), "modules.hierarchy: 'Stages/2024' is not of type"),
])
def test_each_problem_is_one_line_with_its_key_path(mutate, expected):
    data = copy.deepcopy(_localhost())
    mutate(data)
    problems = check_config(data, "x.yaml")
    assert len(problems) == 1, problems
    assert problems[0].startswith("x.yaml: ") and expected in problems[0]


def test_several_problems_give_several_lines():
    data = _localhost()
    data["colour"] = 1
    data["modules"]["syntax"] = "yaml"
    data["toolchain"]["cuda"] = {"version": "12"}
    assert len(check_config(data, "x.yaml")) == 4     # colour, syntax, cuda.home missing, cuda.version pattern


def test_broken_yaml_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodules: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_site(str(bad))
    assert "line" in err.value.problems[0] and "not valid YAML" in err.value.problems[0]


def test_cli_bad_site_exits_2_and_writes_nothing(tmp_path):
    data = _localhost()
    data["toolchain"]["cuda"] = {"home": "/usr/local/cuda", "version": "twelve"}
    data["launcher"]["nodes"] = 3
    bad = tmp_path / "broken.yaml"
    bad.write_text(yaml.safe_dump(data))
    prefix = tmp_path / "prefix"
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", str(bad), "--prefix", str(prefix),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert any("toolchain.cuda.version: 'twelve' does not match" in line for line in lines)
    assert any("launcher.nodes: unknown key" in line for line in lines)
    assert "Traceback" not in proc.stderr
    assert not prefix.exists() and not (tmp_path / "mf").exists()


def test_unknown_site_lists_the_known_ones():
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "nowhere", "--dry-run")
    assert proc.returncode == 2
    assert "unknown site 'nowhere'" in proc.stderr and "cirrus" in proc.stderr
