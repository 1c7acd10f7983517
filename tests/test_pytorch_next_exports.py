"""pytorch/2.14.1-gpu (torch.distributed, no Horovod) through every export, for cirrus and perlmutter.

The exports are generic: nothing in ``hpcstack/`` names this recipe. Golden files
``tests/golden/pytorch-2.14.1-gpu-<site>-*`` hold, per site, the install (perlmutter; cirrus is refused by
the GPU-architecture preflight: its one line is a golden file too) and validation dry-runs
(the install script carries the constraints file and the modulefiles), the ReFrame check and
its settings (``validate --emit reframe``), the CycloneDX SBOM (``hpcstack action sbom`` with the
dry-run's own spec; the number of a component's hashes, not each) and the Jupyter kernel (launcher and ``kernel.json``); for localhost the
Dockerfile and Apptainer definition (cirrus's are refused as its install is; perlmutter's site
config has no ``container`` section: a clear error). docs/recipe-pytorch-next.md lists every
golden file of the recipe (tests/test_docs_pages.py). The easyconfig reads PyPI: tests/test_pytorch_next_easyconfig.py.

Normalised before the comparison: the build id, hpcstack's data directory and version, the uv
binary, the validation's output directory, the SBOM's serial number and time stamp, and the
lock file's sha256 (checked here, not frozen). Regenerate with ``HPCSTACK_UPDATE_GOLDEN=1 pytest
tests/test_pytorch_next_exports.py`` and review the diff of ``tests/golden/``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

import hpcstack
from hpcstack.fsutil import current_user
from conftest import REPO, assert_golden, hpcstack as run_hpcstack
from hpcstack import __version__

pytestmark = pytest.mark.unit

RECIPE = "pytorch/2.14.1-gpu"
GOLDEN = Path(__file__).parent / "golden"
LOCK = REPO / "recipes" / "pytorch" / "2.14.1-gpu.pypi.lock"
DATA_DIR = str(Path(hpcstack.__file__).resolve().parent / "data")
SITES = ["cirrus", "perlmutter"]


def normalise(text: str) -> str:
    """What differs between machines and runs, replaced by @NAMES@."""
    text = text.replace(DATA_DIR, "@HPCSTACK_DATA@")
    text = text.replace(hashlib.sha256(LOCK.read_bytes()).hexdigest(), "@LOCK_SHA256@")
    text = re.sub(r"[^\s=\"']*/hpcstack-validate-pytorch-2\.14\.1-gpu-\d{8}-\d{6}", "@VALIDATION_DIR@", text)
    text = re.sub(r"(?<=\s)[^\s=]*/uv(?= pip | build )", "@UV@", text)
    text = text.replace(f" -user {current_user()} ", " -user @USER@ ")
    text = re.sub(r"hpcstack \d+\.\d+\.\d+[^\s:'\"]*", "hpcstack @VERSION@", text)
    text = text.replace(__version__, "@VERSION@")
    return re.sub(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])", "@BUILD@", text)


def ok(*args: str) -> str:
    proc = run_hpcstack(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


#: The sites whose GPUs the recipe's torch wheels run on (cirrus's V100s are refused: below).
FITTING = ["perlmutter"]


@pytest.fixture(scope="module")
def dry_runs() -> dict[tuple[str, str], str]:
    return {(site, cmd): ok(cmd, RECIPE, "--site", site, "--dry-run")
            for site in SITES for cmd in ("install", "validate") if cmd == "validate" or site in FITTING}


@pytest.mark.parametrize("site, command", [("perlmutter", "install"), ("cirrus", "validate"),
                                           ("perlmutter", "validate")])
def test_dry_runs_match_the_golden_files(dry_runs, site, command):
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-{command}.sh", normalise(dry_runs[site, command]))


def test_the_cirrus_install_is_refused_by_the_gpu_architecture_preflight():
    """cirrus's V100s (compute capability 7.0) and torch 2.14.1's CUDA 13.0 wheels (SASS from
    sm_75): the dry run says why in one line and exits 2, as the install does before writing."""
    proc = run_hpcstack("install", RECIPE, "--site", "cirrus", "--dry-run")
    assert proc.returncode == 2 and proc.stdout == ""
    assert_golden(GOLDEN / "cirrus-pytorch-2.14.1-gpu-preflight.txt", normalise(proc.stderr))


@pytest.mark.parametrize("site", FITTING)
def test_install_has_no_source_build_and_no_horovod(dry_runs, site):
    script = dry_runs[site, "install"]
    assert "--require-hashes -r @HPCSTACK_DATA@/recipes/pytorch/2.14.1-gpu.pypi.lock" in normalise(script)
    for word in ("HOROVOD_", "horovodrun --check-build", "horovod==", "--no-build-isolation", "step build"):
        assert word not in script, word
    # the constraints file pins torch and the CUDA 13 libraries the torch wheel requires
    assert "\ntorch==2.14.1\n" in script and "\nnvidia-nccl-cu13==2.30.7" in script


@pytest.mark.parametrize("site", SITES)
def test_validation_trains_ddp_only_with_nccl_on_the_gpus(dry_runs, site):
    script = dry_runs[site, "validate"]
    runs = [l for l in script.splitlines() if "hpcstack-train-benchmark" in l and l.lstrip().startswith("srun")]
    assert runs and all("--backend ddp" in l and "--device cuda" in l for l in runs)
    assert "horovod" not in script.lower()


@pytest.mark.parametrize("fmt", ["docker", "apptainer", "easyconfig"])
def test_cirrus_exports_are_refused_as_its_install_is(fmt, tmp_path):
    """An image of cirrus's V100 nodes, or an easyconfig for them, would install wheels without
    sm_70: the export says why, as the install does, and writes nothing."""
    out = tmp_path / "spec"
    proc = run_hpcstack("export", RECIPE, "--site", "cirrus", "--format", fmt, "-o", str(out))
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    assert normalise(proc.stderr) == (GOLDEN / "cirrus-pytorch-2.14.1-gpu-preflight.txt").read_text()


@pytest.mark.parametrize("site, fmt, suffix", [("localhost", "docker", "Dockerfile"), ("localhost", "apptainer", "def")])
def test_container_specs_match_the_golden_files(site, fmt, suffix, tmp_path):
    out = tmp_path / f"spec.{suffix}"
    ok("export", RECIPE, "--site", site, "--format", fmt, "-o", str(out))
    text = out.read_text()
    assert hashlib.sha256(LOCK.read_bytes()).hexdigest() in text
    assert 'pytorch/2.14.1-gpu' in text.splitlines()[0]
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}.{suffix}", normalise(text))


@pytest.mark.parametrize("fmt", ["docker", "apptainer"])
def test_a_site_without_a_container_section_gets_one_line(fmt, tmp_path):
    out = tmp_path / "spec"
    proc = run_hpcstack("export", RECIPE, "--site", "perlmutter", "--format", fmt, "-o", str(out))
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.count("\n") == 1 and "container: missing section" in proc.stderr


@pytest.mark.parametrize("site", SITES)
def test_reframe_check_and_settings_match_the_golden_files(site, tmp_path):
    out = tmp_path / site
    ok("validate", RECIPE, "--site", site, "--emit", "reframe", str(out))
    check = (out / "pytorch_2_14_1_gpu_check.py").read_text()
    assert "required_transport = variable(str, type(None), value='nccl')" in check
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-reframe-check.py", normalise(check))
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-reframe-settings.py",
                  normalise((out / "settings.py").read_text()))


def _sbom(script: str, path: Path) -> dict:
    line = next(l for l in script.splitlines() if l.startswith("hpcstack action sbom "))
    words = shlex.split(line)
    ok("action", "sbom", "--spec", words[words.index("--spec") + 1], str(path))
    return json.loads(path.read_text())


@pytest.mark.parametrize("site", FITTING)
def test_sbom_matches_the_golden_file(dry_runs, site, tmp_path):
    bom = _sbom(dry_runs[site, "install"], tmp_path / "sbom.json")
    names = {c["name"]: c.get("version") for c in bom["components"]}
    assert names["torch"] == "2.14.1" and "horovod" not in names
    bom["serialNumber"] = "@SERIAL@"
    bom["metadata"]["timestamp"] = "@TIME@"
    # every file's sha256 is the lock's; the golden keeps how many each package has
    for c in bom["components"]:
        props = c.get("properties", [])
        files = [p for p in props if p["name"] == "hpcstack:allowed-file-sha256"]
        assert all(re.fullmatch(r"[0-9a-f]{64}", p["value"]) for p in files)
        if files:
            c["properties"] = [p for p in props if p not in files] + [
                {"name": "hpcstack:allowed-file-sha256", "value": f"{len(files)} files"}]
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-sbom.json",
                  normalise(json.dumps(bom, indent=1, sort_keys=True) + "\n"))


@pytest.mark.parametrize("site", SITES)
def test_kernel_matches_the_golden_file(site, tmp_path):
    from hpcstack.modules import kernel, writer
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    module_root = tmp_path / "modulefiles"
    s = load_site(site, module_root=str(module_root))
    recipe = load_recipe(RECIPE, s)
    stub = Path(writer.modulefile_path(str(module_root), recipe.name, recipe.version, s.modules.syntax))
    stub.parent.mkdir(parents=True)
    stub.write_text("#%Module\n")     # make_kernel requires the stack's modulefile
    spec = kernel.make_kernel(s, recipe, prefix=str(tmp_path / "jupyter"), command=f"hpcstack kernel install {RECIPE}")
    text = (json.dumps(spec.kernel_json, indent=1, sort_keys=True) + "\n" + spec.launcher)
    text = text.replace(str(tmp_path), "@TMP@")
    assert "pytorch/2.14.1-gpu" in text
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-kernel.txt", normalise(text))


def test_whatis_names_the_pins_of_the_sites_python(dry_runs):
    # the universal lock pins scikit-learn 1.7.2 for Python < 3.11 and 1.9.1 above: perlmutter has 3.11
    assert ('whatis("Packages: torch 2.14.1, torchvision 0.29.2, torchmetrics 1.9.0, '
            'tensorboard 2.21.0, scikit-learn 1.9.1, ipykernel 7.4.0")') in dry_runs["perlmutter", "install"]


@pytest.mark.parametrize("site, transport", [("cirrus", "nccl"), ("perlmutter", "nccl"), ("localhost", None)])
def test_the_validation_file_requires_nccl_where_the_site_has_cuda(site, transport):
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site
    from hpcstack.validate.validation import validation_settings

    s = load_site(site)
    assert validation_settings(s, load_recipe(RECIPE, s)).required_transport == transport


def test_cuda_transport_must_name_something(tmp_path):
    from hpcstack.errors import ConfigError
    from hpcstack.install.components.validation import Validation

    text = (LOCK.parent / "2.14.1-gpu.validation.yaml").read_text()
    (tmp_path / "v.yaml").write_text(text.replace("cuda_transport: nccl", 'cuda_transport: ""'))
    with pytest.raises(ConfigError) as err:
        Validation("v.yaml").load(tmp_path)
    assert "sanity.cuda_transport" in str(err.value)


def test_local_runs_ddp_under_mpirun_where_the_site_names_horovodrun():
    # localhost's launcher.command is horovodrun, which a stack without Horovod does not have
    out = ok("validate", RECIPE, "--site", "localhost", "--local", "--dry-run")
    run = out.strip().splitlines()[-1]
    assert run.startswith("mpirun -np 2 ") and "--backend ddp --model tiny" in run
