"""pytorch/2.14.1-gpu (torch.distributed, no Horovod) through every export, for every shipped GPU site.

The exports are generic: nothing in ``hpcstack/`` names this recipe, and no line here names a site:
the sites are conftest's ``gpu_sites()``, and whether a site fits the recipe's wheels is what
hpcstack's preflight says (conftest's ``preflight_refusal``: the GPU architectures against
``toolchain.cuda.cc_list``, the CUDA against ``gpu.driver_version``), read from the site config.
Today cirrus's V100s (7.0) are refused (CUDA 13.0 wheels with SASS from sm_75) and the A100 sites
fit. Golden files ``tests/golden/pytorch-2.14.1-gpu-<site>-*`` hold, per site, the install (a site
that fits) or the preflight's refusal (``<site>-pytorch-2.14.1-gpu-preflight.txt``, its one line
per problem) and validation dry-runs
(the install script carries the constraints file and the modulefiles), the ReFrame check and
its settings (``validate --emit reframe``), the CycloneDX SBOM of a site that fits (``hpcstack
action sbom`` with the dry-run's own spec; the number of a component's hashes, not each) and the
Jupyter kernel (launcher and ``kernel.json``); for localhost the Dockerfile and Apptainer definition
(a refused site's are refused as its install is; a GPU site without a ``container`` section gets a
clear error). docs/recipe-pytorch-next.md lists every
golden file of the recipe (tests/test_docs_pages.py). The easyconfig reads PyPI: tests/test_pytorch_next_easyconfig.py.

Normalised before the comparison: the build id, hpcstack's data directory and version, the uv
binary, the validation's output directory, the SBOM's serial number and time stamp, and the
lock file's sha256 (checked here, not frozen). Regenerate with ``HPCSTACK_UPDATE_GOLDEN=1 pytest
tests/test_pytorch_next_exports.py`` (conftest's ``REGENERATE`` for a new site) and review the
diff of ``tests/golden/``.
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
from conftest import REPO, assert_golden, assert_site_golden, gpu_sites, hpcstack as run_hpcstack, preflight_refusal
from hpcstack import __version__

pytestmark = pytest.mark.unit

RECIPE = "pytorch/2.14.1-gpu"
GOLDEN = Path(__file__).parent / "golden"
LOCK = REPO / "recipes" / "pytorch" / "2.14.1-gpu.pypi.lock"
DATA_DIR = str(Path(hpcstack.__file__).resolve().parent / "data")
#: The shipped GPU sites (conftest's gpu_sites).
SITES = gpu_sites()


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


#: The sites whose GPUs and driver the recipe's torch wheels run on, as hpcstack's preflight says,
#: and those it refuses (today cirrus: V100, compute capability 7.0, below the wheels' sm_75).
FITTING = [site for site in SITES if not preflight_refusal(RECIPE, site)]
REFUSED = [site for site in SITES if site not in FITTING]


@pytest.fixture(scope="module")
def dry_runs() -> dict[tuple[str, str], str]:
    """``(site, command)``: the dry run's output; ``(site, "plan")``: the install's plan itself
    (``--on-login-node``: the same as ``install`` unless the site builds in a batch job, whose dry
    run shows the job step)."""
    runs = {(site, "validate"): ok("validate", RECIPE, "--site", site, "--dry-run") for site in SITES}
    for site in FITTING:
        runs[site, "install"] = ok("install", RECIPE, "--site", site, "--dry-run")
        runs[site, "plan"] = ok("install", RECIPE, "--site", site, "--dry-run", "--on-login-node")
    return runs


@pytest.mark.parametrize("site, command", [*((site, "install") for site in FITTING),
                                           *((site, "validate") for site in SITES)])
def test_dry_runs_match_the_golden_files(dry_runs, site, command):
    assert_site_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-{command}.sh", normalise(dry_runs[site, command]), site)


def test_the_sites_are_split_by_the_preflight():
    """At least one shipped GPU site fits the recipe (its install is tested here); each refusal
    names a key of the site config (its GPUs' compute capabilities or its driver) and the file."""
    assert FITTING, SITES
    for site in REFUSED:
        for line in preflight_refusal(RECIPE, site):
            assert ("toolchain.cuda.cc_list" in line or "gpu." in line) and f"{site}.yaml" in line, line


@pytest.mark.parametrize("site", REFUSED)
def test_a_refused_install_says_why_before_writing(site):
    """The GPU-architecture or driver preflight (e.g. cirrus's V100s, compute capability 7.0, and
    torch 2.14.1's CUDA 13.0 wheels with SASS from sm_75): the dry run says why in one line per
    problem and exits 2, as the install does before writing."""
    proc = run_hpcstack("install", RECIPE, "--site", site, "--dry-run")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: {line}" for line in preflight_refusal(RECIPE, site)]
    assert_site_golden(GOLDEN / f"{site}-pytorch-2.14.1-gpu-preflight.txt", normalise(proc.stderr), site)


@pytest.mark.parametrize("site", FITTING)
def test_install_has_no_source_build_and_no_horovod(dry_runs, site):
    script = dry_runs[site, "plan"]
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
    # (the fingerprint's collector reads HOROVOD_* settings where a job has them)
    assert "horovod" not in re.sub(r"python -c '.*?' \S*fingerprint\.json", "", script, flags=re.S).lower()


@pytest.mark.parametrize("site", REFUSED)
@pytest.mark.parametrize("fmt", ["docker", "apptainer", "easyconfig"])
def test_a_refused_sites_exports_are_refused_as_its_install_is(site, fmt, tmp_path):
    """An image of a refused site's nodes (cirrus's V100s), or an easyconfig for them, would
    install wheels its GPUs do not run: the export says why, as the install does, and writes nothing."""
    out = tmp_path / "spec"
    proc = run_hpcstack("export", RECIPE, "--site", site, "--format", fmt, "-o", str(out))
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    assert proc.stderr.splitlines() == [f"error: {line}" for line in preflight_refusal(RECIPE, site)]


@pytest.mark.parametrize("site, fmt, suffix", [("localhost", "docker", "Dockerfile"), ("localhost", "apptainer", "def")])
def test_container_specs_match_the_golden_files(site, fmt, suffix, tmp_path):
    out = tmp_path / f"spec.{suffix}"
    ok("export", RECIPE, "--site", site, "--format", fmt, "-o", str(out))
    text = out.read_text()
    assert hashlib.sha256(LOCK.read_bytes()).hexdigest() in text
    assert 'pytorch/2.14.1-gpu' in text.splitlines()[0]
    assert_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}.{suffix}", normalise(text))


def _without_container() -> str:
    """The first fitting GPU site whose config has no ``container`` section."""
    from hpcstack.site import load_site

    return next(site for site in FITTING if load_site(site).raw.get("container") is None)


@pytest.mark.parametrize("fmt", ["docker", "apptainer"])
def test_a_site_without_a_container_section_gets_one_line(fmt, tmp_path):
    out = tmp_path / "spec"
    proc = run_hpcstack("export", RECIPE, "--site", _without_container(), "--format", fmt, "-o", str(out))
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.count("\n") == 1 and "container: missing section" in proc.stderr


@pytest.mark.parametrize("site", SITES)
def test_reframe_check_and_settings_match_the_golden_files(site, tmp_path):
    out = tmp_path / site
    ok("validate", RECIPE, "--site", site, "--emit", "reframe", str(out))
    check = (out / "pytorch_2_14_1_gpu_check.py").read_text()
    assert "required_transport = variable(str, type(None), value='nccl')" in check
    assert_site_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-reframe-check.py", normalise(check), site)
    assert_site_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-reframe-settings.py",
                       normalise((out / "settings.py").read_text()), site)


def _sbom(script: str, path: Path) -> dict:
    line = next(l for l in script.splitlines() if l.startswith("hpcstack action sbom "))
    words = shlex.split(line)
    ok("action", "sbom", "--spec", words[words.index("--spec") + 1], str(path))
    return json.loads(path.read_text())


@pytest.mark.parametrize("site", FITTING)
def test_sbom_matches_the_golden_file(dry_runs, site, tmp_path):
    bom = _sbom(dry_runs[site, "plan"], tmp_path / "sbom.json")
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
    assert_site_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-sbom.json",
                       normalise(json.dumps(bom, indent=1, sort_keys=True) + "\n"), site)


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
    assert_site_golden(GOLDEN / f"pytorch-2.14.1-gpu-{site}-kernel.txt", normalise(text), site)


@pytest.mark.parametrize("site", FITTING)
def test_whatis_names_the_pins_of_the_sites_python(dry_runs, site):
    from hpcstack.site import load_site

    # the universal lock pins scikit-learn 1.7.2 for Python < 3.11 and 1.9.1 above: the site's python.version
    major, minor = map(int, load_site(site).python_version.split("."))
    sklearn = "1.9.1" if (major, minor) >= (3, 11) else "1.7.2"
    assert (f"Packages: torch 2.14.1, torchvision 0.29.2, torchmetrics 1.9.0, "
            f"tensorboard 2.21.0, scikit-learn {sklearn}, ipykernel 7.4.0") in dry_runs[site, "plan"]


@pytest.mark.parametrize("site", [*SITES, "localhost"])
def test_the_validation_file_requires_nccl_where_the_site_has_cuda(site):
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site
    from hpcstack.validate.validation import validation_settings

    s = load_site(site)
    transport = "nccl" if s.toolchain.has_cuda else None
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
