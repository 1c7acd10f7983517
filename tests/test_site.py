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


# ------------------------------------------- slurm.mem*, slurm.extra_options, gpu (issue 46)

def _shared_nodes_site(tmp_path, **slurm) -> str:
    """A copy of juwels-booster (its roots and validation directory under ``tmp_path``) with
    ``slurm`` keys set: a site whose nodes are shared, where jobs say how much memory they use."""
    from conftest import unit_site

    data = unit_site("juwels-booster", name="shared", roots=tmp_path / "roots")
    data["slurm"].update(output_root=str(tmp_path / "out"), **slurm)
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_memory_and_extra_options_reach_every_batch_job_hpcstack_writes(tmp_path):
    site = _shared_nodes_site(tmp_path, mem_per_gpu="120G", extra_options=["--reservation=maint", "--hint=nomultithread"])
    # the validation jobs: hpcstack's own lines, then the site's, one job per node count
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    jobs = proc.stdout.split("#!/bin/bash")[1:]
    assert len(jobs) >= 2
    for script in jobs:
        lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
        assert lines.count("#SBATCH --mem-per-gpu=120G") == 1, lines
        assert lines[-3:] == ["#SBATCH --export=NONE", "#SBATCH --reservation=maint", "#SBATCH --hint=nomultithread"]
    # the batch script of the stack's `module help`
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "--exclusive --mem-per-gpu=120G --reservation=maint --hint=nomultithread" in proc.stdout
    # the ReFrame export's partition (ReFrame writes its access as #SBATCH lines)
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", site, "--emit", "reframe", str(tmp_path / "rfm"))
    assert proc.returncode == 0, proc.stderr
    settings = (tmp_path / "rfm" / "settings.py").read_text()
    assert "'--mem-per-gpu=120G', '--reservation=maint', '--hint=nomultithread'" in settings


def test_a_memory_size_yaml_reads_as_a_number_is_megabytes(tmp_path):
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", _shared_nodes_site(tmp_path, mem=0), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --mem=0\n" in proc.stdout      # sbatch: all the memory of each node


@pytest.mark.parametrize("slurm, gpu, expected", [
    ({"mem": "64G", "mem_per_gpu": "120G"}, None,
     ["slurm.mem_per_gpu: give one of slurm.mem, slurm.mem_per_cpu, slurm.mem_per_gpu, not slurm.mem and "
      "slurm.mem_per_gpu (sbatch: --mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive, "
      "https://slurm.schedmd.com/sbatch.html)"]),
    ({"mem_per_cpu": "4 GB"}, None, ["slurm.mem_per_cpu: '4 GB' does not match"]),
    ({"mem": "64g"}, None, ["slurm.mem: '64g' does not match"]),
    ({"extra_options": ["--reservation=maint", "--constraint gpu", "-C", "--time=2:00:00", "--part=dev",
                        "--comment='x'", "--gres=gpu:4", "--mem-per-cpu=2G", "--output=/tmp/x",
                        "--hint=nomultithread"]}, None,
     ["slurm.extra_options.1: '--constraint gpu': an #SBATCH line cannot hold white space",
      "slurm.extra_options.2: '-C': not a long option",
      "slurm.extra_options.3: '--time=2:00:00': hpcstack sets --time itself: use slurm.time_limit",
      "slurm.extra_options.4: '--part=dev': hpcstack sets --part (sbatch reads it as --partition) itself: "
      "use slurm.partition",
      "slurm.extra_options.5: \"--comment='x'\": an #SBATCH line cannot hold white space, quotes",
      "slurm.extra_options.6: '--gres=gpu:4': hpcstack sets --gres itself: use slurm.gpus_per_node and slurm.gpu_request",
      "slurm.extra_options.7: '--mem-per-cpu=2G': hpcstack sets --mem-per-cpu itself: use slurm.mem_per_cpu",
      "slurm.extra_options.8: '--output=/tmp/x': hpcstack sets --output itself: use slurm.output_root"]),
    ({"extra_options": ["--comment=a\nb"]}, None, ["slurm.extra_options.0: '--comment=a\\nb': holds a control character"]),
    ({}, {"cuda_driver_api": 12.2}, ["gpu.cuda_driver_api: 12.2 is not of type 'string', 'null'"]),
    ({}, {"driver_version": "535"}, ["gpu.driver_version: '535' does not match"]),
])
def test_memory_extra_options_and_driver_values_sbatch_or_the_check_cannot_take_are_refused(tmp_path, slurm, gpu, expected):
    site = _shared_nodes_site(tmp_path, **slurm)
    if gpu is not None:
        data = yaml.safe_load(open(site))
        data["gpu"] = gpu
        open(site, "w").write(yaml.safe_dump(data))
    for command in (["validate", "pytorch/2.3.1-gpu", "--site", site, "--dry-run"],
                    ["install", "pytorch/2.3.1-gpu", "--site", site, "--prefix", str(tmp_path / "roots" / "p")]):
        proc = hpcstack(*command)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == len(expected), lines
        for line, words in zip(lines, expected):
            assert line.startswith(f"error: {site}: {words}"), (line, words)
        assert proc.stdout == ""
        assert not (tmp_path / "roots").exists() and not (tmp_path / "out").exists()
