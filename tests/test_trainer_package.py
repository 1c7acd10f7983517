"""The trainer as a package (``trainer/hpcstack_train``) and the ``Trainer`` component that ships it.

- Its imports: nothing of hpcstack (it runs in the stack's python, where hpcstack is not
  installed), no hpcstack module imports it (torch is not in the tool's venv), horovod only inside
  a function (a stack without Horovod runs ``--backend ddp``), no cycle between its modules.
- Its torch-free modules (timing, report, launch, the collectives check's rules) run here, in the
  tool's python, without torch.
- The component's install step copies the entry script and every module, and declares every one of
  them as an input of the step (sorted), so an edited module redoes the step; run for real into a
  temporary prefix, the copy is the checkout's.
- With the installed stack's python (where there is one): the installed copy answers ``--help``,
  refuses ``--backend ddp`` without a launcher (exit status 2) without importing horovod, passes
  the component's own sanity check, and writes no bytecode into the prefix.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from hpcstack.install.components.base import PlanContext
from hpcstack.install.components.sanity import PythonCheck
from hpcstack.install.components.trainer import LIBRARY_DIR, PACKAGE, TRAINER, Trainer, trainer_sources
from hpcstack.fsutil import sha256_file
from hpcstack.install.actions import Run
from hpcstack.install.plan import INSTALL, SANITYCHECK, Step, data_neutral
from hpcstack.recipe import Recipe

pytestmark = pytest.mark.unit

TRAINER_DIR = REPO / "trainer"
PACKAGE_DIR = TRAINER_DIR / PACKAGE
#: Modules that must import without torch (their docstrings say so).
TORCH_FREE = ("errors", "timing", "report", "launch", "collective_cases")
#: What the package may import besides the standard library and itself.
THIRD_PARTY = {"torch", "torchvision", "sklearn", "horovod"}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(module, level, at module level)`` for every import statement of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level, id(node) in top))
    return found


def test_the_package_imports_only_itself_the_standard_library_and_the_training_stack():
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        for module, level, _ in _imports(path):
            root = module.split(".")[0]
            if level == 0 and root not in stdlib | THIRD_PARTY:
                wrong.append(f"{path.name}: imports {module}")
    assert not wrong, "\n".join(wrong)


def test_horovod_is_imported_only_inside_a_function_of_the_backends():
    places = [(path.name, top) for path in sorted(PACKAGE_DIR.glob("*.py"))
              for module, level, top in _imports(path) if module.split(".")[0] == "horovod"]
    assert places and all(name == "backends.py" and not top for name, top in places), places


def test_no_hpcstack_module_imports_the_trainer():
    package = REPO / "hpcstack"
    wrong = [str(path.relative_to(REPO)) for path in sorted(package.rglob("*.py"))
             if "data" not in path.relative_to(package).parts[:1]
             and any(module.split(".")[0] == PACKAGE for module, _, _ in _imports(path))]
    assert not wrong


def test_the_package_has_no_import_cycle():
    graph = {path.stem: {module.split(".")[0] for module, level, _ in _imports(path) if level == 1 and module}
             for path in PACKAGE_DIR.glob("*.py")}
    state: dict[str, int] = {}

    def visit(node: str, path: tuple[str, ...]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, " -> ".join((*path, node, nxt))
            if nxt not in state:
                visit(nxt, (*path, node))
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, ())


def test_the_torch_free_modules_import_without_torch():
    code = ("import sys; sys.dont_write_bytecode = True; sys.path.insert(0, sys.argv[1])\n"
            f"for name in {TORCH_FREE!r}: __import__('{PACKAGE}.' + name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod', 'numpy')))")
    done = subprocess.run([sys.executable, "-c", code, str(TRAINER_DIR)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def pure(tmp_path_factory):
    """The torch-free modules, imported from the checkout into this process."""
    import importlib

    sys.path.insert(0, str(TRAINER_DIR))
    written, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield {name: importlib.import_module(f"{PACKAGE}.{name}") for name in TORCH_FREE}
    finally:
        sys.path.remove(str(TRAINER_DIR))
        sys.dont_write_bytecode = written
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_mean_ci95_is_the_mean_and_196_population_sigmas(pure):
    mean, ci95 = pure["timing"].mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert ci95 == pytest.approx(1.96 * (2 / 3) ** 0.5)
    assert pure["timing"].mean_ci95([5.0]) == (5.0, 0.0)


def test_startup_seconds_count_from_the_process_start_and_mark_missing_points(pure):
    timing = pure["timing"]
    assert timing.startup_seconds({"process_start": 10.0, "imports_done": 12.5, "first_step": None}) == [2.5, -1.0]
    assert timing.startup_seconds({"process_start": 1.0, "imports_done": 1.5, "first_step": 4.0}) == [0.5, 3.0]
    # this process started before now, and after the boot
    assert 0 < timing.process_start_time() <= __import__("time").time()
    assert timing.STARTUP["process_start"] == timing.process_start_time()


def test_report_writes_json_lines_from_rank_0_only(pure, tmp_path, capsys):
    report = pure["report"]
    path = tmp_path / "records.jsonl"
    on = report.Report(True, str(path))
    on.record("config", backend="ddp", world_size=2)
    on.record("result", ok=True, reasons=[], wall_seconds=1.5)
    on.say("result: OK")
    on.close()
    off = report.Report(False, str(tmp_path / "other.jsonl"))
    off.record("config", backend="ddp")
    off.say("not said")
    off.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"record": "config", "backend": "ddp", "world_size": 2},
        {"record": "result", "ok": True, "reasons": [], "wall_seconds": 1.5}]
    assert not (tmp_path / "other.jsonl").exists()
    assert capsys.readouterr().err == "hpcstack-train-benchmark: result: OK\n"


def test_failure_reasons_name_each_failed_check(pure):
    report = pure["report"]
    good = {"initial_loss": 2.3, "final_loss": 0.5, "threshold": 1.0, "loss_fell": True,
            "below_threshold": True, "params_identical": True, "param_hashes": ["a", "a"]}
    assert report.failure_reasons(good) == []
    bad = dict(good, final_loss=2.4, loss_fell=False, below_threshold=False, params_identical=False,
               param_hashes=["a", "b"])
    assert report.failure_reasons(bad) == [
        "loss did not fall: 2.3000 -> 2.4000", "final loss 2.4000 not below threshold 1.0",
        "parameters differ between ranks: 2 distinct sha256 digests on 2 ranks"]
    assert report.failure_reasons(dict(good, final_loss=float("nan")))[0] == "final loss is nan"
    classifier = {"test_accuracy_per_rank": [0.97, 0.93], "threshold": 0.95, "test_images": 359,
                  "epochs": 20, "params_identical": True, "param_hashes": ["a", "a"]}
    assert report.classifier_reasons(classifier) == [
        "test accuracy 0.9300 below the threshold 0.95 (359 test images, 20 epoch(s))"]


def test_collectives_summary_and_skipped_ops_per_reason(pure):
    report, cases = pure["report"], pure["collective_cases"]
    skipped = ([{"op": op, "dtype": "bfloat16", "reason": "no bf16"} for op in cases.COLLECTIVES]
               + [{"op": "allreduce_average", "dtype": d, "reason": "no AVG"} for d in ("int32", "int64")])
    assert report.skipped_summary(skipped) == ["all ops on bfloat16: no bf16",
                                               "allreduce_average on int32, int64: no AVG"]
    record = {"checks": 356, "ops": ["allreduce_sum"] * 11, "dtypes": ["float32"] * 5, "sizes": ["1"] * 9,
              "device": "cpu", "seconds": 2.06, "ok": True, "failures": [], "skipped": skipped[:1]}
    assert report.collectives_summary(record) == (
        "collectives: 356 checks (11 ops x 5 dtypes x 9 sizes) on cpu in 2.1 s: OK; "
        "skipped allreduce_sum on bfloat16: no bf16")


def test_collective_cases_without_torch(pure):
    cases = pure["collective_cases"]
    assert cases.reduction_amplitudes(2, 2 ** 8) == (16, 1)
    assert cases.reduction_amplitudes(300, 2 ** 8) is None
    assert [cases.reducescatter_rows(5, 2, r) for r in range(2)] == [(0, 3), (3, 2)]
    assert [cases.alltoall_splits(17, 3, s) for s in range(3)] == [[5, 7, 6], [6, 5, 7], [7, 6, 5]]
    assert cases.mismatch_message("ddp", "allreduce_sum", "float32", 4913, 1, (1, 4912, 21.0, 20.0)) == (
        "ddp allreduce_sum float32 size 4913 on rank 1: element 4912 is 21, want 20 (1 of 4913 elements wrong)")
    assert sorted(["64x1..257", "1023", "17"], key=cases.size_key) == ["17", "1023", "64x1..257"]


def test_launch_env_without_torch(pure):
    launch = pure["launch"]
    found = launch.resolve_launch_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                                       "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (found.rank, found.world_size, found.master_addr, found.launcher) == (1, 2, "127.0.0.1", "openmpi")
    with pytest.raises(pure["errors"].UsageError, match="no launcher environment"):
        launch.resolve_launch_env({"PATH": "/usr/bin"})


def _context(tmp_path: Path, python: str | None = None) -> PlanContext:
    recipe = Recipe("pytorch", "2.3.1-gpu", "a stack with a trainer", directory=tmp_path)
    ctx = PlanContext(None, recipe, prefix=str(tmp_path / "sw"), stage_dir=str(tmp_path / "stage"),
                      cache_dir=str(tmp_path / "cache"), python_version="3.11", jobs=1,
                      modulefile=str(tmp_path / "mf"), stage_prefix=str(tmp_path / ".sw-1"))
    if python:  # the stage's venv python runs the stack's (a symbolic link would lose its venv)
        Path(ctx.python).parent.mkdir(parents=True)
        Path(ctx.python).write_text(f'#!/bin/sh\nexec {python} "$@"\n')
        Path(ctx.python).chmod(0o755)
    return ctx


def _install(ctx: PlanContext) -> dict[str, list]:
    steps = Trainer().contribute(ctx)
    for action in steps[INSTALL]:
        assert isinstance(action, Run) and not action.env and not action.prepend
        subprocess.run(action.argv, check=True, timeout=60)
    return steps


def test_the_install_step_ships_every_module_and_hashes_each_of_them(tmp_path):
    ctx = _context(tmp_path)
    steps = _install(ctx)
    entry, modules = trainer_sources()
    names = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert [m.name for m in modules] == names and {"cli.py", "__main__.py", "report.py"} <= set(names)
    # every file's content is an input of the step, in a fixed (sorted) order
    inputs = [p for a in steps[INSTALL] for p in a.inputs()]
    assert inputs == [*(str(m) for m in modules), str(entry)]
    step = Step(INSTALL, "install", steps[INSTALL])
    # by the file's sha256, under hpcstack's data directory written neutrally (plan.data_neutral)
    assert all(f"{data_neutral(m)}={sha256_file(m)}" in step.fingerprint() for m in inputs)
    installed = Path(ctx.build_prefix)
    assert (installed / "bin" / TRAINER).read_bytes() == entry.read_bytes()
    assert os.access(installed / "bin" / TRAINER, os.X_OK)
    package = installed / LIBRARY_DIR / PACKAGE
    assert sorted(p.name for p in package.iterdir()) == names
    assert all((package / m.name).read_bytes() == m.read_bytes() for m in modules)
    # the sanity check runs in the stack's python and imports torch
    (check,) = steps[SANITYCHECK]
    assert isinstance(check, PythonCheck) and check.python == ctx.python and "torch" in check.imports


@pytest.fixture(scope="module")
def stack_python(installed_stack: Path) -> str:
    """The python of the installed stack (conftest's ``installed_stack``)."""
    return str(installed_stack / "venv" / "bin" / "python")


class _ExecContext:
    def __init__(self):
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.log = io.StringIO()
        self.state_dir = None


@pytest.mark.e2e
def test_the_installed_copy_runs_in_the_stacks_python_and_writes_nothing(tmp_path, stack_python):
    ctx = _context(tmp_path, stack_python)
    steps = _install(ctx)
    program = Path(ctx.bin_dir) / TRAINER
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "PYTHON")) and k not in ("RANK", "WORLD_SIZE")}
    helped = subprocess.run([stack_python, str(program), "--help"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: hpcstack-train-benchmark") and "--backend {horovod,ddp,plain}" in helped.stdout
    # -X importtime lists every module imported: a DDP run never imports horovod
    refused = subprocess.run([stack_python, "-X", "importtime", str(program), "--backend", "ddp"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2
    assert "hpcstack-train-benchmark: error: no launcher environment" in refused.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in refused.stderr.splitlines() if "|" in line]
    assert "torch" in imported and "hpcstack_train.cli" in imported
    assert not [m for m in imported if m.split(".")[0] == "horovod"]
    # the component's own sanity check, in the stack's python
    (check,) = steps[SANITYCHECK]
    context = _ExecContext()
    check.execute(context)
    files = 1 + len(trainer_sources()[1])
    assert f"compiles: {files} files; imports: hpcstack_train.cli" in context.log.getvalue()
    assert not list(Path(ctx.build_prefix).rglob("__pycache__"))
