"""The runners of a :class:`~hpcstack.validate.plan.ValidationPlan`: the ``--local`` run, and the
Slurm jobs' writing, submission, waiting and reading back. They return outcome objects and print
nothing; :mod:`hpcstack.validate.render` reports, and callbacks (``on_start``, ``on_submit``,
``on_change``) let the caller show progress.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack import gate, trust
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import makedirs_no_follow, open_dir_no_follow, read_no_follow, write_no_follow
from hpcstack.modules import modsys
from hpcstack.site import MAX_NODES
from hpcstack.validate.plan import ValidationJob, ValidationPlan
from hpcstack.validate.scheduler import get_scheduler
from hpcstack.validate.settings import ValidationSettings, settings_record


def read_records(path: Path) -> list[dict]:
    """Read the JSON-lines output of the validation program (lines that are not JSON are skipped)."""
    return parse_records(path.read_text())


def parse_records(text: str) -> list[dict]:
    """The records of JSON-lines text (lines that are not JSON are skipped)."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


@dataclass(frozen=True)
class LocalOutcome:
    """What a ``--local`` run gave.

    Attributes:
        argv (list[str]): the launcher's command line.
        returncode (int): its exit status.
        output (str): its stdout and stderr.
        records (list[dict]): the program's JSON-lines records.
    """

    argv: list
    returncode: int
    output: str
    records: list


def run_local(site, recipe, plan: ValidationPlan, on_start=None, timeout: int = 1800) -> LocalOutcome:
    """Load the stack's module and run the plan's local run in a temporary directory.

    Args:
        site (hpcstack.site.Site): the site (its module tool, roots, profiles and hierarchy).
        recipe (hpcstack.recipe.Recipe): the stack.
        plan (ValidationPlan): a ``local`` plan.
        on_start (Callable[[list[str]], None] | None): called with the argv before it runs.
        timeout (int): seconds before the run is stopped.

    Raises:
        HpcstackError: the module does not load, or the launcher fails.
    """
    run = plan.local
    scheduler = get_scheduler(plan.settings.local.scheduler)()
    with tempfile.TemporaryDirectory(prefix="hpcstack-validate-") as tmp:
        output = os.path.join(tmp, "records.jsonl")
        argv = run.argv(output)
        # the site's profiles and hierarchy first (they may reset MODULEPATH), then the module root and the stack
        env = modsys.build_environment(site.modules.tool, site.modules.command, site.modules.use,
                                       site.modules.preloads)
        env = modsys.build_environment(site.modules.tool, site.modules.command, [site.module_root],
                                       [recipe.full_name], env=env)
        env.update(run.env)
        if on_start:
            on_start(argv)
        try:
            proc = scheduler.run(argv, env=env, cwd=tmp, timeout=timeout)
        except HpcstackError as exc:
            raise HpcstackError(f"validate {recipe.full_name} (launcher {run.launcher}): {exc}")
        records = read_records(Path(output)) if os.path.exists(output) else []
    return LocalOutcome(argv, proc.returncode, proc.stdout + proc.stderr, records)


#: What a job leaves in its directory that a new run must not read back as its own: the
#: backends' records and their exit statuses, the ranks' NCCL logs.
STALE_SUFFIXES = (".jsonl", ".exit", ".log")


def remove_stale(directory: Path, under: Path) -> list[str]:
    """Remove the records a previous run left in a job's directory (:data:`STALE_SUFFIXES`), by
    descriptor: the directory is opened from ``under`` down with ``O_DIRECTORY|O_NOFOLLOW``
    (:func:`hpcstack.fsutil.makedirs_no_follow`'s walk), listed through that descriptor, and each
    entry is removed with ``unlinkat(2)`` relative to it (:func:`hpcstack.gate.unlink`): an entry
    itself, a link as a link, never what a link points to, never a directory. The directory may
    belong to ``slurm.submit_as``, who can swap its entries, or the directory itself, at any
    moment: a directory swapped for a link is not entered (``ELOOP``), and a name swapped between
    the listing and the removal is still a name of the directory opened.

    Args:
        directory (Path): the job's directory (``<out>/n<nodes>``).
        under (Path): the validation's directory, from which no link is followed.

    Returns:
        list[str]: the names removed.

    Raises:
        OSError: a component from ``under`` down is a link (``ELOOP``) or not a directory.
    """
    removed = []
    fd = open_dir_no_follow(directory, under)
    try:
        for name in sorted(os.listdir(fd)):
            if not name.endswith(STALE_SUFFIXES):
                continue
            try:
                gate.unlink(fd, name)
            except (FileNotFoundError, HpcstackError):     # gone meanwhile, or a directory: left
                continue
            removed.append(name)
    finally:
        os.close(fd)
    return removed


def write_jobs(plan: ValidationPlan) -> None:
    """Write the plan's job scripts into their directories (stale records removed,
    :func:`remove_stale`). An output directory given again may be a user's (``slurm.submit_as``):
    no link is followed in it, and nothing is removed by a name that a link could redirect."""
    out = plan.output_dir
    for j in plan.jobs:
        makedirs_no_follow(j.directory, out)
        remove_stale(j.directory, out)
        write_no_follow(j.script_path, j.script, 0o755, under=out)


def submit_jobs(jobs: list[ValidationJob], scheduler, on_submit=None) -> list[ValidationJob]:
    """Submit every job (the script on stdin: no path to swap); on a refusal, cancel those
    submitted and raise.

    Args:
        jobs (list[ValidationJob]): written jobs; each gets its ``job_id``.
        scheduler (hpcstack.validate.scheduler.JobScheduler): submits.
        on_submit (Callable[[ValidationJob], None] | None): called after each submission.

    Raises:
        HpcstackError: the scheduler refused a job.
    """
    submitted: list[ValidationJob] = []
    try:
        for j in jobs:
            j.job_id = scheduler.submit(j.script_path, content=j.script)
            submitted.append(j)
            if on_submit:
                on_submit(j)
    except HpcstackError:
        scheduler.cancel([j.job_id for j in submitted])
        raise
    return submitted


def write_jobs_file(out: Path, site, recipe, settings: ValidationSettings, jobs: list[ValidationJob]) -> None:
    """Write ``jobs.json`` (:data:`JOBS_SCHEMA`) for a later ``--collect``."""
    from hpcstack.validate.history import now_iso

    data = {"site": site.name, "recipe": recipe.full_name, "partition": settings.slurm.partition,
            "submitted": now_iso(),
            "scheduler": settings.slurm.scheduler, "settings": settings_record(settings),
            "jobs": [{"job_id": j.job_id, "nodes": j.nodes, "ranks": j.ranks, "backends": j.backends,
                      "directory": str(j.directory)} for j in jobs]}
    write_no_follow(out / "jobs.json", json.dumps(data, indent=1) + "\n")  # out may be submit_as's


#: ``jobs.json`` of a validation directory (:func:`write_jobs_file`), as :func:`read_jobs_file` accepts it.
JOBS_SCHEMA = {
    "type": "object",
    "required": ["site", "recipe", "jobs"],
    "properties": {
        "site": {"type": "string"},
        "recipe": {"type": "string"},
        "partition": {"type": ["string", "null"]},
        "scheduler": {"type": "string"},
        "settings": {"type": ["object", "null"]},
        "submitted": {"type": "string", "maxLength": 64},      # when (ISO 8601): a collected run's start
        "jobs": {"type": "array", "maxItems": 1000, "items": {
            "type": "object",
            "required": ["job_id", "nodes", "ranks", "backends", "directory"],
            "additionalProperties": False,
            "properties": {
                "job_id": {"type": "string", "pattern": "^[0-9]{1,20}$"},
                "nodes": {"type": "integer", "minimum": 1, "maximum": MAX_NODES},
                "ranks": {"type": "integer", "minimum": 1},
                "backends": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}},
                "directory": {"type": "string"},
            }}},
    },
}


def read_jobs_file(site, recipe, out: Path, own: trust.Policy) -> tuple[dict, list[ValidationJob]]:
    """Read back ``<out>/jobs.json``: it must be a file that ``own`` alone can change, match
    :data:`JOBS_SCHEMA`, name this site and stack, and each job's directory must be its own
    ``<out>/n<nodes>``.

    Returns:
        tuple[dict, list[ValidationJob]]: the file's data and its jobs.

    Raises:
        ConfigError: one line naming what is wrong (exit status 2).
    """
    from hpcstack import schema

    try:
        st = os.lstat(out / "jobs.json")
        if not stat.S_ISREG(st.st_mode) or not own.trusted_uid(st.st_uid) or st.st_mode & 0o022:
            raise ConfigError([f"--collect: {out}/jobs.json: not written by hpcstack here (it must be a file "
                               f"that {own.who()} alone can change)"])
        data = json.loads(read_no_follow(out / "jobs.json", out, last=None))
    except (OSError, ValueError) as exc:
        raise ConfigError([f"--collect: {out}/jobs.json: cannot read it ({getattr(exc, 'strerror', None) or exc})"]) from None
    lines = schema.problems(JOBS_SCHEMA, data, f"--collect: {out}/jobs.json")
    if lines:
        raise ConfigError(lines)
    if data.get("site") != site.name or data.get("recipe") != recipe.full_name:
        raise ConfigError([f"--collect: {out} holds jobs of {data.get('recipe')} on {data.get('site')}, "
                           f"not {recipe.full_name} on {site.name}"])
    jobs = []
    for j in data["jobs"]:
        job_dir = out / f"n{j['nodes']}"
        if os.path.normpath(j["directory"]) != str(job_dir):
            raise ConfigError([f"--collect: {out}/jobs.json: job {j['job_id']}: directory {j['directory']!r} is "
                               f"not the job's own ({job_dir}); hpcstack reads back only what lies there"])
        jobs.append(ValidationJob(j["nodes"], job_dir, "", j["backends"], j["ranks"], j["job_id"]))
    return data, jobs


def read_logs(directory: Path, under: Path, prefix: str, suffix: str, *, most: int = 1024,
              cap: int = 16 << 20) -> dict[str, str]:
    """The logs a job's ranks left in its directory (``<prefix>*<suffix>``, e.g. NCCL's
    ``nccl-<host>-<pid>.log``), read as :func:`_read_back` reads: listed through a descriptor of
    the directory opened with no link followed below ``under``, each a regular file read with
    ``O_NOFOLLOW``; a link, a file over ``cap`` bytes, or one beyond the first ``most`` names is
    left out.

    Returns:
        dict[str, str]: name -> text; empty where the directory cannot be opened.
    """
    try:
        fd = open_dir_no_follow(directory, under)
    except OSError:
        return {}
    try:
        names = sorted(n for n in os.listdir(fd) if n.startswith(prefix) and n.endswith(suffix))[:most]
        sizes = {}
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size <= cap:
                sizes[name] = st.st_size
    finally:
        os.close(fd)
    texts = {name: _read_back(directory / name, under) for name in sizes}
    return {name: text for name, text in texts.items() if text is not None}


def _read_back(path: Path, under: Path, last: int | None = None) -> str | None:
    """A job's file read back as text, no link followed below ``under``; None when it cannot be."""
    try:
        return read_no_follow(path, under, last=last).decode(errors="replace")
    except (OSError, ValueError):
        return None


@dataclass
class JobsOutcome:
    """What the Slurm jobs gave.

    Attributes:
        runs (list[hpcstack.validate.judge.RunOutcome]): one per job and backend.
        jobs (list[dict]): per job: id, nodes, state, exit code, elapsed, node list, reason, output
            file, and the output's last lines where the job did not complete.
    """

    runs: list = field(default_factory=list)
    jobs: list = field(default_factory=list)


def wait_jobs(jobs: list[ValidationJob], scheduler, on_change=None, on_interrupt=None) -> dict:
    """Wait until the jobs end; cancel them on Ctrl-C (and raise ``KeyboardInterrupt`` again).

    Args:
        jobs (list[ValidationJob]): submitted jobs.
        scheduler: the scheduler they were submitted to.
        on_change (Callable[[ValidationJob, info], None] | None): called on each state change.
        on_interrupt (Callable[[list[str]], None] | None): called with the job ids before they
            are cancelled on Ctrl-C.

    Returns:
        dict: job id -> the scheduler's job info.
    """
    by_id = {j.job_id: j for j in jobs}
    try:
        return scheduler.wait(list(by_id), on_change=(lambda info: on_change(by_id[info.job_id], info))
                              if on_change else None)
    except KeyboardInterrupt:
        if on_interrupt:
            on_interrupt(list(by_id))
        scheduler.cancel(list(by_id))
        raise


def read_back(jobs: list[ValidationJob], infos: dict, out: Path) -> JobsOutcome:
    """Read each ended job's output and each backend's exit status and records, from the job's
    own directory only: Slurm's StdOut elsewhere (a job of someone else's, named in a
    ``jobs.json``) is never opened."""
    from hpcstack.validate.judge import RunOutcome

    result = JobsOutcome()
    for j in jobs:
        info = infos[j.job_id]
        output = str(j.output_path())
        if info.stdout and os.path.dirname(os.path.normpath(info.stdout)) == str(j.directory):
            output = os.path.normpath(info.stdout)
        text = _read_back(Path(output), out, last=64 * 1024)
        lines = text.splitlines()[-25:] if text is not None else [f"(cannot read {output})"]
        result.jobs.append({"job_id": j.job_id, "nodes": j.nodes, "state": info.state,
                            "exit_code": info.exit_code, "elapsed": info.elapsed,
                            "nodelist": info.nodelist, "reason": info.reason, "output": output,
                            "output_tail": lines if info.state != "COMPLETED" else []})
        for backend in j.backends:
            status = _read_back(j.status_path(backend), out)
            try:
                exit_status = int(status.strip()) if status is not None else None
            except ValueError:
                exit_status = None
            text = _read_back(j.records_path(backend), out)
            records = parse_records(text) if text is not None else []
            result.runs.append(RunOutcome(backend, j.nodes, j.ranks, j.job_id, info.state, info.exit_code,
                                          exit_status, records, output, lines))
    return result
