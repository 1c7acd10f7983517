"""examples/: the digits classifier and its Slurm batch scripts. The scripts
are checked as bash (``bash -n``) and for what they must name; the program itself is the one the
stack's trainer runs as ``--model digits`` (tests/test_train_benchmark.py), and it is run here
under horovodrun where a stack with Horovod and scikit-learn is found."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import STACK_TOP

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DIGITS = EXAMPLES / "digits"
STACK_BIN = STACK_TOP / "software" / "pytorch" / "2.3.1-gpu" / "venv" / "bin"


def sbatch_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", text, re.M))


@pytest.mark.integration
@pytest.mark.parametrize("script", ["cirrus.slurm", "localhost.slurm"])
def test_batch_scripts_are_bash_and_load_the_stack(script):
    path = DIGITS / script
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert re.search(r"^module load pytorch/2.3.1-gpu$", text, re.M)
    assert re.search(r'^ *(srun .*)?python "\$\{SLURM_SUBMIT_DIR\}/train_digits.py"', text, re.M)
    assert re.search(r"^srun ", text, re.M)


def test_cirrus_script_uses_the_gpu_partition_four_gpus_per_node():
    text = (DIGITS / "cirrus.slurm").read_text()
    opts = sbatch_options(text)
    assert (opts["partition"], opts["qos"], opts["gres"]) == ("gpu", "gpu", "gpu:4")
    # GPU jobs giving --ntasks/--cpus-per-task as #SBATCH options are rejected there; no --mem either
    assert not {"ntasks", "ntasks-per-node", "cpus-per-task", "mem"} & set(opts), opts
    assert re.search(r"^#SBATCH --exclusive$", text, re.M)
    assert re.search(r"^srun --ntasks=\S+ --ntasks-per-node=4 --cpus-per-task=10 --hint=nomultithread", text, re.M)
    assert "--device cuda" in text


@pytest.mark.integration
def test_localhost_script_uses_the_debug_partition_on_cpus():
    text = (DIGITS / "localhost.slurm").read_text()
    opts = sbatch_options(text)
    assert (opts["partition"], opts["nodes"]) == ("debug", "2")
    assert "gres" not in opts and "--device cpu" in text and "srun --mpi=pmix" in text


def test_readme_names_every_file():
    text = (EXAMPLES / "README.md").read_text()
    for name in ("train_digits.py", "cirrus.slurm", "localhost.slurm"):
        assert name in text


@pytest.mark.e2e
def test_the_example_trains_on_two_cpu_ranks(tmp_path):
    horovodrun = STACK_BIN / "horovodrun"
    if not horovodrun.exists():
        pytest.skip(f"no installed stack with Horovod at {STACK_BIN}")
    probe = subprocess.run([str(STACK_BIN / "python"), "-c", "import sklearn.datasets, horovod.torch"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{STACK_BIN}/python lacks scikit-learn or horovod.torch (re-install the stack): "
                    + (probe.stderr.strip().splitlines() or ["?"])[-1])
    env = dict(os.environ, PATH=f"{STACK_BIN}:{os.environ['PATH']}")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run([str(horovodrun), "-np", "2", "-H", "localhost:2", "python",
                           str(DIGITS / "train_digits.py")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    accuracy = float(re.search(r"test accuracy (\d\.\d+) \(", done.stdout).group(1))
    assert accuracy >= 0.95
    assert "on 2 CPU rank(s)" in done.stdout
