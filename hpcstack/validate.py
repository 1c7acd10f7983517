"""``hpcstack validate`` with the local launcher: train on ranks under the stack's module.

The training program (``<prefix>/bin/hpcstack-train-benchmark``, from
``scripts/hpcstack-train-benchmark.py``) trains a small model on synthetic data with Horovod,
checks that the loss falls and that the parameters are identical on all ranks after training, and
writes JSON lines; we print img/s per rank and in total and judge the run by its result record.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from . import modsys
from .components.tools import TRAINER
from .errors import HpcstackError
from .modules import modulefile_path


def launcher_argv(site, prefix: str, ranks: int, output: str) -> list[str]:
    """Return the command that starts the training program on ``ranks`` local ranks.

    Args:
        site (hpcstack.site.Site): gives the launcher and the training sizes.
        prefix (str): the stack's prefix.
        ranks (int): number of ranks (processes) on this host.
        output (str): JSON-lines file the program writes.

    Returns:
        list[str]: e.g. ``["horovodrun", "-np", "2", "-H", "localhost:2", "python", …]``.
    """
    v = site.validation
    program = ["python", os.path.join(prefix, "bin", TRAINER), "--backend", "horovod",
               "--model", str(v.get("model", "tiny")), "--image-size", str(v.get("image_size", 32)),
               "--batch-size", str(v.get("batch_size", 16)), "--precision", v.get("precision", "fp32"),
               "--output", output]
    cmd = site.launcher.command
    if cmd == "horovodrun":
        return ["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}", *program]
    if cmd == "mpirun":
        return ["mpirun", "-np", str(ranks), *program]
    return ["srun", "--mpi=pmix", "-n", str(ranks), *program]


def read_records(path: Path) -> list[dict]:
    """Read the JSON-lines output of the training program (lines that are not JSON are skipped)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def local_validation(site, recipe, ranks: int | None = None, dry_run: bool = False,
                     as_json: bool = False) -> int:
    """Load the stack's module, run the training program on ``ranks`` ranks, report.

    Args:
        site (hpcstack.site.Site): the site.
        recipe (hpcstack.recipe.Recipe): the installed recipe.
        ranks (int | None): default the site's ``launcher.ranks``.
        dry_run (bool): print the commands instead.
        as_json (bool): print the records as JSON instead of a summary.

    Returns:
        int: 0 when the run passed its checks, 1 otherwise.

    Raises:
        HpcstackError: the stack is not installed, the module does not load, or the launcher fails.
    """
    ranks = ranks or site.launcher.ranks
    prefix = os.path.join(site.install_root, recipe.name, recipe.version)
    modulefile = modulefile_path(site.module_root, recipe.name, recipe.version, site.modules.syntax)
    use = [*site.modules.use, site.module_root]
    with tempfile.TemporaryDirectory(prefix="hpcstack-validate-") as tmp:
        output = os.path.join(tmp, "records.jsonl") if not dry_run else "records.jsonl"
        argv = launcher_argv(site, prefix, ranks, output)
        if dry_run:
            lines = [f"module use {shlex.quote(d)}" for d in use]
            lines += [f"module load {recipe.full_name}"]
            lines += [f"export {k}={shlex.quote(v)}" for k, v in site.launcher.env.items()]
            print("\n".join(lines + [shlex.join(argv)]))
            return 0
        if not os.path.isfile(modulefile):
            raise HpcstackError(f"{recipe.full_name} is not installed for site {site.name} "
                                f"(no {modulefile}); run: hpcstack install {recipe.full_name} --site {site.name}")
        env = modsys.build_environment(site.modules.tool, site.modules.command, use, [recipe.full_name])
        env.update(site.launcher.env)
        print(f"==> validate {recipe.full_name}: {shlex.join(argv)}", file=sys.stderr)
        try:
            proc = subprocess.run(argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=1800)
        except FileNotFoundError:
            raise HpcstackError(f"launcher {argv[0]} not found under module {recipe.full_name}")
        except subprocess.TimeoutExpired:
            raise HpcstackError("the training run took more than 30 minutes; stopped")
        records = read_records(Path(output)) if os.path.exists(output) else []
    return report(records, proc.returncode, proc.stdout + proc.stderr, as_json)


def report(records: list[dict], returncode: int, output: str, as_json: bool = False) -> int:
    """Print the figures of a training run and return its exit status (0 passed, 1 failed).

    Args:
        records (list[dict]): JSON-lines records of the training program.
        returncode (int): the launcher's exit status.
        output (str): the launcher's output (its tail is shown on failure).
        as_json (bool): print the records as one JSON document.
    """
    result = next((r for r in records if r.get("record") == "result"), None)
    ok = returncode == 0 and bool(result and result.get("ok"))
    if as_json:
        print(json.dumps({"ok": ok, "returncode": returncode, "records": records}, indent=1))
    else:
        for r in records:
            if r.get("record") == "throughput":
                print(f"rank {r['rank']}: {r['img_per_sec_mean']:.1f} ± {r['img_per_sec_ci95']:.1f} img/s")
            elif r.get("record") == "throughput_total":
                print(f"total: {r['img_per_sec']:.1f} img/s on {r['world_size']} ranks")
            elif r.get("record") == "convergence":
                print(f"loss {r['initial_loss']:.4f} -> {r['final_loss']:.4f} (threshold {r['threshold']}); "
                      f"parameters identical on all ranks: {r['params_identical']}")
    if not ok:
        reasons = "; ".join(result.get("reasons", [])) if result else "no result record"
        tail = "\n  | ".join(output.strip().splitlines()[-15:])
        print(f"FAIL: exit status {returncode}: {reasons}\n  | {tail}", file=sys.stderr)
        return 1
    print("PASS")
    return 0
