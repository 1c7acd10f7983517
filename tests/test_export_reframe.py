"""``hpcstack validate … --emit reframe DIR``: the validation as a ReFrame check.

* Golden files: the cirrus check and ReFrame site configuration (``tests/golden/cirrus-reframe-
  check.py``, ``cirrus-reframe-settings.py``; the hpcstack version normalised to ``@VERSION@``;
  regenerate with ``HPCSTACK_UPDATE_GOLDEN=1``), and the key values asserted one by one.
* ReFrame itself (reframe-hpc, test extras) loads the emitted files and lists the tests with their
  dependencies (``reframe -l``; about 3 s).
* Real runs on the local 2-node Slurm with the installed localhost stack (as
  test_validate_slurm.py finds it): ``reframe -C settings.py -c DIR -r`` passes on 1 and 2 nodes,
  and fails with ReFrame's own messages when a reference is out of reach and when the trainer's
  sanity fails. The runs use the Horovod backend, the localhost ``cpu`` workload (tiny model,
  about 10-30 s of training per job on 2 busy cores); about 2-3 minutes in all.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import yaml

from conftest import assert_golden, MODULES_INIT, hpcstack, two_node_cluster, unit_site
from test_validate_slurm import STACK, STACK_ARGS

pytestmark = pytest.mark.unit

RECIPE = "pytorch/2.3.1-gpu"
GOLDEN = Path(__file__).parent / "golden"
REFRAME = shutil.which("reframe", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
CHECK = "pytorch_2_3_1_gpu_check.py"
#: The localhost site's base modules and the installed stack's module root.
MODULE_USE = ("/opt/hpcstack/base-modulefiles", str(STACK / "modulefiles"))


def normalise(text: str) -> str:
    return re.sub(r"hpcstack \d+\.\d+\.\d+[^\s:]*", "hpcstack @VERSION@", text)


def emit(directory: Path, *args: str, site: str = "cirrus") -> subprocess.CompletedProcess:
    return hpcstack("validate", RECIPE, "--site", site, *args, "--emit", "reframe", str(directory))


@pytest.fixture(scope="module")
def cirrus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reframe") / "cirrus"
    proc = emit(out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out / CHECK}" in proc.stdout and f"wrote {out / 'settings.py'}" in proc.stdout
    assert f"run it: reframe -C {out / 'settings.py'} -c {out / CHECK} -r" in proc.stdout
    return out


@pytest.mark.parametrize("name, golden", [(CHECK, "cirrus-reframe-check.py"),
                                          ("settings.py", "cirrus-reframe-settings.py")])
def test_cirrus_files_match_the_golden_files(cirrus, name, golden):
    got = normalise((cirrus / name).read_text())
    path = GOLDEN / golden
    assert_golden(path, got)


def _constant(source: str, name: str):
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == name)
    return ast.literal_eval(node.value)


@pytest.mark.integration
def test_cirrus_check_runs_the_validation_trainer_with_its_settings_and_references(cirrus):
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site
    from hpcstack.validate.validation import trainer_argv, validation_settings

    source = (cirrus / CHECK).read_text()
    site = load_site("cirrus")
    settings = validation_settings(site, load_recipe(RECIPE, site))
    trainer = _constant(source, "PROGRAM")
    prefix = "/work/y07/shared/cirrus-software/pytorch/2.3.1-gpu"
    for backend in ("horovod", "ddp"):
        assert trainer[backend] == trainer_argv(settings.workload, prefix, backend, "records.jsonl", 10)
    assert "--model resnet50 --image-size 224 --batch-size 32" in " ".join(trainer["horovod"])
    refs = _constant(source, "REFERENCES")
    assert refs[1]["throughput_total"] == (1468.0, -0.25, 0.15, "img/s")
    assert refs[2]["throughput_total"] == (2855.0, -0.25, 0.15, "img/s")
    assert refs[2]["scaling_efficiency"] == (0.9, -0.1, 0.12, "")
    assert refs[1]["throughput_per_rank"] == (367.0, -0.25, 0.15, "img/s")
    assert _constant(source, "NODES") == [1, 2]
    for line in ("class HpcstackPytorch_2_3_1_gpu(rfm.RunOnlyRegressionTest):", "valid_systems = ['cirrus:gpu']",
                 "modules = [{'name': 'pytorch/2.3.1-gpu', 'path': '/work/y07/shared/cirrus-modulefiles'}]", "num_tasks_per_node = 4", "num_cpus_per_task = 10",
                 "num_gpus_per_node = 4", "time_limit = '20m'", "value='nccl')", "@sanity_function",
                 "@performance_function('img/s')", "'NCCL_DEBUG': 'WARN'", "-J account=BUDGET"):
        assert line in source, line
    config = (cirrus / "settings.py").read_text()
    for line in ("'modules_system': 'envmod'", "'scheduler': 'slurm'", "'launcher': 'srun'",
                 "'access': ['--partition=gpu', '--qos=gpu']", "'--gres=gpu:{num_gpus_per_node}'",
                 "'source /usr/share/Modules/init/bash',\n", "'module use /work/y07/shared/cirrus-modulefiles',\n"):
        assert line in config, line
    compile(source, CHECK, "exec")
    compile(config, "settings.py", "exec")


def test_perlmutter_asks_for_gpus_per_node_and_its_constraint(tmp_path):
    proc = emit(tmp_path, "--account", "m0000", site="perlmutter")
    assert proc.returncode == 0, proc.stderr
    config = (tmp_path / "settings.py").read_text()
    assert "'--gpus-per-node={num_gpus_per_node}'" in config and "--constraint=gpu" in config
    assert "--account=m0000" in config


@pytest.mark.parametrize("args, message", [
    (["--emit", "spack", "DIR"], "--emit spack: unknown format (known: reframe)"),
    (["--emit", "reframe", "DIR", "--local"], "--local: not used with --emit"),
    (["--emit", "reframe", "DIR", "--dry-run"], "--dry-run: not used with --emit"),
    (["--emit", "reframe", "DIR", "--nodes", "0"], "--nodes: '0' is not"),
])
def test_bad_command_lines_exit_2_and_write_nothing(tmp_path, args, message):
    args = [str(tmp_path / "out") if a == "DIR" else a for a in args]
    proc = hpcstack("validate", RECIPE, "--site", "cirrus", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_emit_writes_through_the_gate_and_refuses_a_directory_another_account_can_change(tmp_path, monkeypatch):
    """validate --emit reframe DIR writes through hpcstack.gate (issue 45): DIR, or a directory
    above it, that an account the policy does not trust can change, or a link such an account
    could have put on the way, is refused in one line and nothing is written; a link only a
    trusted account can have made is followed (a root-owned /scratch -> /lustre/scratch)."""
    from hpcstack import trust
    from hpcstack.errors import ConfigError
    from hpcstack.export import reframe
    from hpcstack.fsutil import write_atomic

    monkeypatch.setattr(reframe, "reframe_files", lambda site, recipe, **options: {
        "x_check.py": "check\n", "settings.py": "settings\n"})
    pol = trust.Policy(uid=os.geteuid())
    victim = tmp_path / "victim"
    victim.mkdir()
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    (open_ / "out").symlink_to(victim)
    # positive control: by name (the write emit_reframe made before), the link decides where it goes
    write_atomic(open_ / "out" / "control", "x")
    assert (victim / "control").exists()
    (victim / "control").unlink()
    for directory, problem in ((open_ / "out", f"{open_ / 'out'}: a symbolic link"),
                               (open_ / "out" / "sub", f"{open_ / 'out'}: a symbolic link"),
                               (open_ / "new", f"{open_}: writable by every user"),
                               (open_, f"{open_}: writable by every user")):
        with pytest.raises(ConfigError) as info:
            reframe.emit_reframe(None, None, str(directory), pol=pol)
        (line,) = info.value.lines()
        assert line.startswith("--emit reframe: ") and problem in line, line
    assert list(victim.iterdir()) == [] and sorted(p.name for p in open_.iterdir()) == ["out"]
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        reframe.emit_reframe(None, None, str(tmp_path / "file"), pol=pol)
    # this account's own link in its own directory is followed; the files are new, 0644
    (tmp_path / "mine").symlink_to(victim)
    paths = reframe.emit_reframe(None, None, str(tmp_path / "mine" / "rfm"), pol=pol)
    assert paths == [str(tmp_path / "mine" / "rfm" / "x_check.py"), str(tmp_path / "mine" / "rfm" / "settings.py")]
    assert (victim / "rfm" / "settings.py").read_text() == "settings\n"
    assert oct((victim / "rfm" / "x_check.py").stat().st_mode & 0o777) == oct(0o644)


def test_a_site_without_slurm_is_refused(tmp_path):
    import yaml

    data = yaml.safe_load((Path(__file__).parents[1] / "site-configs" / "localhost.yaml").read_text())
    del data["slurm"]
    site = tmp_path / "noslurm.yaml"
    site.write_text(yaml.safe_dump(data))
    proc = hpcstack("validate", RECIPE, "--site", str(site), "--emit", "reframe", str(tmp_path / "out"))
    assert proc.returncode == 2 and "slurm: missing key (the ReFrame check runs Slurm jobs)" in proc.stderr
    assert not (tmp_path / "out").exists()


def _reframe(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 900,
             module_use: tuple = ()) -> subprocess.CompletedProcess:
    """Run ReFrame the way an admin does: in a shell with the module tool initialised and the
    stack's module root on MODULEPATH (ReFrame looks the check's module up itself)."""
    full = {k: v for k, v in os.environ.items() if k != "BASH_ENV"}
    full.update(env or {})
    use = "".join(f"module use {d} && " for d in module_use)
    command = " ".join(["source", str(MODULES_INIT), "&&", use, "exec", REFRAME, "--nocolor", *args])
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", command], capture_output=True, text=True,
                          cwd=cwd, env=full, timeout=timeout)


@pytest.fixture(scope="module")
def reframe_tool():
    if REFRAME is None:
        pytest.skip("reframe missing (pip install reframe-hpc; the test extras have it)")
    if not MODULES_INIT.is_file():
        pytest.skip(f"Environment Modules missing ({MODULES_INIT}); run scripts/localhost-setup")


@pytest.mark.integration
def test_reframe_loads_the_check_with_one_test_per_node_count_and_backend(reframe_tool, cirrus):
    proc = _reframe(["-C", "settings.py", "-c", CHECK, "--system", "cirrus:gpu", "-l"], cirrus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for nodes, backend in ((1, "horovod"), (2, "horovod"), (1, "ddp"), (2, "ddp")):
        assert f"HpcstackPytorch_2_3_1_gpu %num_nodes={nodes} %backend={backend}" in proc.stdout
    assert "Found 4 check(s)" in proc.stdout
    # the 2-node tests depend on the 1-node ones (scaling efficiency)
    assert re.search(r"%num_nodes=2 %backend=horovod .*\n\s+\^HpcstackPytorch_2_3_1_gpu %num_nodes=1 "
                     r"%backend=horovod", proc.stdout), proc.stdout


def references_from_status(tmp_path: Path, system: str, by_nodes: dict) -> Path:
    """The YAML of ``hpcstack status --reframe-refs`` for a site whose history holds one OK run of
    RECIPE on ``system`` with ``by_nodes`` ({nodes: {figure: [value, lower, upper, unit]}}) as
    its references (the history is written by hpcstack.validate.history, the file by the
    command)."""
    from contextlib import closing
    from types import SimpleNamespace

    from hpcstack.validate import history
    from historydata import FP, day, report

    roots = tmp_path / "history-site"
    site_file = tmp_path / "histsite.yaml"
    site_file.write_text(yaml.safe_dump(unit_site("localhost", name="histsite", roots=roots)))
    doc = report(generated=day(1))
    doc["system"] = system
    doc["runs"] = [{"backend": "horovod", "nodes": n, "ok": True, "sanity": [],
                    "figures": {name: {"value": ref[0], "unit": ref[3], "ok": True, "reference": ref}
                                for name, ref in figures.items()}} for n, figures in by_nodes.items()]
    site = SimpleNamespace(name="histsite", install_root=str(roots / "software"), raw={})
    with closing(history.open_history(history.history_path(site))) as conn:
        history.record_report(conn, RECIPE, RECIPE, "install", doc, started=day(1), fingerprint=FP)
    out = tmp_path / "refs.yaml"
    proc = hpcstack("status", "--site", str(site_file), "--reframe-refs", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.integration
def test_reframe_takes_the_references_of_hpcstack_status_with_references_file(reframe_tool, cirrus, tmp_path):
    """One source of references (issue 47): the check reads the YAML of ``hpcstack status
    --reframe-refs`` (-S references_file=FILE) instead of the recipe's, per node count; a file
    without the check's system makes ReFrame skip the test with hpcstack's line."""
    by_nodes = {1: {"throughput_per_rank": [400.0, -0.2, None, "img/s"]},
                2: {"throughput_per_rank": [390.0, -0.2, None, "img/s"],
                    "scaling_efficiency": [0.95, -0.1, None, ""]}}
    refs = references_from_status(tmp_path, "cirrus:gpu", by_nodes)
    assert yaml.safe_load(refs.read_text()) == {RECIPE: {"cirrus:gpu": by_nodes}}
    proc = _reframe(["-C", "settings.py", "-c", CHECK, "--system", "cirrus:gpu", "-S",
                     f"references_file={refs}", "--describe"], cirrus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = json.loads(proc.stdout[proc.stdout.index("["):])
    assert len(tests) == 4
    for test in tests:
        assert test["reference"] == {"cirrus:gpu": by_nodes[test["num_nodes"]]}, test["reference"]
    # without the option, the recipe's (Cirrus: 367 img/s per rank)
    proc = _reframe(["-C", "settings.py", "-c", CHECK, "--system", "cirrus:gpu", "--describe"], cirrus)
    assert {t["reference"]["cirrus:gpu"]["throughput_per_rank"][0]
            for t in json.loads(proc.stdout[proc.stdout.index("["):])} == {367.0}
    (tmp_path / "other").mkdir()
    other = references_from_status(tmp_path / "other", "archer2:gpu", by_nodes)
    proc = _reframe(["-C", "settings.py", "-c", CHECK, "--system", "cirrus:gpu", "-S",
                     f"references_file={other}", "-l"], cirrus)
    out = proc.stdout + proc.stderr
    assert f"{other}: no references of {RECIPE} on cirrus:gpu" in out and "Found 0 check(s)" in out, out


# ----------------------------------------------------------------------------- real Slurm jobs

@pytest.fixture(scope="module")
def localhost_stack(reframe_tool, installed_stack):
    """The roots of the installed stack (conftest's ``installed_stack``), with the local cluster up."""
    with two_node_cluster():
        yield STACK


@pytest.fixture
def workdir():
    """A directory under /tmp that both Slurm "nodes" see (pytest's tmp_path may not be)."""
    d = Path(tempfile.mkdtemp(prefix="hpcstack-reframe-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_localhost(workdir: Path, *emit_args: str, reframe_args: tuple = ()) -> subprocess.CompletedProcess:
    proc = emit(workdir / "rfm", *STACK_ARGS, "--backend", "horovod", *emit_args, site="localhost")
    assert proc.returncode == 0, proc.stderr
    return _reframe(["-C", str(workdir / "rfm" / "settings.py"), "-c", str(workdir / "rfm"), *reframe_args,
                     "-r"], workdir, env={"HOME": str(workdir)}, module_use=MODULE_USE)


@pytest.mark.e2e
def test_reframe_run_passes_on_one_and_two_nodes(localhost_stack, workdir):
    proc = run_localhost(workdir, "--nodes", "1,2")
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert proc.returncode == 0, out[-5000:]
    assert "[  PASSED  ] Ran 2/2 test case(s) from 2 check(s) (0 failure(s)" in out
    for nodes in (1, 2):
        assert re.search(rf"\[\s+OK \] \(\d/2\) HpcstackPytorch_2_3_1_gpu %num_nodes={nodes} %backend=horovod", out)
    assert re.search(r"P: throughput_per_rank: [0-9.]+ img/s \(r:500\.0, l:-0\.9, u:None\)", out), out
    assert re.search(r"P: scaling_efficiency: [0-9.]+ +\(r:0\.5, l:-0\.96, u:None\)", out), out


@pytest.mark.e2e
def test_reframe_run_fails_with_reframes_message_when_the_reference_is_out_of_reach(localhost_stack, workdir):
    """The reference comes from the site's history (``hpcstack status --reframe-refs``), read
    back by ReFrame's run of the check (-S references_file=FILE)."""
    proc = emit(workdir / "rfm", *STACK_ARGS, "--backend", "horovod", "--nodes", "1", site="localhost")
    assert proc.returncode == 0, proc.stderr
    check = workdir / "rfm" / CHECK
    assert "'throughput_per_rank': (500.0, -0.9, None, 'img/s')" in check.read_text()
    refs = references_from_status(workdir, "localhost:debug", {1: {"throughput_per_rank": [1e9, -0.1, None, "img/s"]}})
    proc = _reframe(["-C", str(workdir / "rfm" / "settings.py"), "-c", str(check), "-S",
                     f"references_file={refs}", "-r"], workdir, env={"HOME": str(workdir)}, module_use=MODULE_USE)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-5000:]
    assert "failed to meet reference(s): throughput_per_rank=" in out, out[-5000:]
    assert re.search(r"throughput_per_rank=[0-9.]+ img/s, expected 1000000000\.0 \(l=9", out), out[-5000:]


@pytest.mark.e2e
def test_reframe_run_fails_with_reframes_message_when_the_trainers_sanity_fails(localhost_stack, workdir):
    proc = run_localhost(workdir, "--nodes", "1", reframe_args=(
        "-S", "program_extra_opts=--loss-threshold,0.0001,--convergence-steps,5"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-5000:]
    assert "sanity error: the program reported failure (its result record is not ok)" in out, out[-5000:]


def test_juwels_booster_jobs_load_the_module_hierarchy_before_the_module_root(tmp_path):
    """JSC's Stages/2024 resets MODULEPATH: the check's jobs load the site's hierarchy first, then
    put the stack's module root on MODULEPATH (prepare_cmds run before ReFrame loads the module)."""
    proc = emit(tmp_path / "jb", site="juwels-booster")
    assert proc.returncode == 0, proc.stderr
    prepare = _constant((tmp_path / "jb" / "settings.py").read_text(), "site_configuration")[
        "systems"][0]["partitions"][0]["prepare_cmds"]
    assert prepare[1:] == ["module load Stages/2024", "module load GCC/12.3.0",
                           "module load ParaStationMPI/5.9.2-1",
                           "module use /p/project/PROJECT/hpcstack/modulefiles"], prepare
    assert prepare[0].startswith("source ")
