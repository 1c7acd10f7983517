"""Files root writes into a directory a user owns never follow what the user planted there;
``uninstall`` removes only what the stack's own records say it published.

The validation's output directory is handed to ``slurm.submit_as``; root later writes
``jobs.json``, ``report.json``, ``report.md``, ``scaling.png`` and (given the directory again)
the job scripts there. A symbolic link, a hard link or a linked directory that the user left in
their place must not lead root's write elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from hpcstack.fsutil import makedirs_no_follow, write_no_follow
from hpcstack.validate.render import write_report
from test_report import report, run

pytestmark = pytest.mark.unit


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def test_a_planted_symbolic_link_is_replaced_not_followed(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").symlink_to(victim)
    write_no_follow(out / "report.json", "{}\n")
    assert victim.read_text() == "precious\n"
    assert not (out / "report.json").is_symlink() and (out / "report.json").read_text() == "{}\n"


def test_a_planted_hard_link_is_replaced_not_written_through(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    os.link(victim, out / "jobs.json")
    write_no_follow(out / "jobs.json", "{}\n", 0o600)
    assert victim.read_text() == "precious\n" and (out / "jobs.json").read_text() == "{}\n"
    assert (out / "jobs.json").stat().st_mode & 0o777 == 0o600


def test_a_linked_directory_below_the_users_directory_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "etc"
    out.mkdir()
    elsewhere.mkdir()
    (out / "nodes-2").symlink_to(elsewhere)
    with pytest.raises(OSError) as err:
        write_no_follow(out / "nodes-2" / "job.sh", "#!/bin/sh\n", 0o755, under=out)
    assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(OSError):
        makedirs_no_follow(out / "nodes-2" / "x", out)
    assert list(elsewhere.iterdir()) == []
    makedirs_no_follow(out / "nodes-1" / "a", out)
    write_no_follow(out / "nodes-1" / "a" / "job.sh", "#!/bin/sh\n", 0o755, under=out)
    assert (out / "nodes-1" / "a" / "job.sh").stat().st_mode & 0o777 == 0o755


def test_write_report_follows_no_link_planted_for_any_of_its_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ("report.json", "report.md", "scaling.png"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("precious\n")
        (out / name).symlink_to(victims[name])
    rep = report([run("horovod", 1, 310), run("horovod", 2, 300)])
    paths = write_report(rep, out)
    assert paths["plot"] == str(out / "scaling.png")
    assert all(v.read_text() == "precious\n" for v in victims.values())
    for name in victims:
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert json.loads((out / "report.json").read_text())["recipe"] == rep["recipe"]


# --------------------------------------- the stale records of a job directory given again (submit_as)

def _job_dir(tmp_path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    (out / "n1").mkdir(parents=True)
    return out, out / "n1"


def test_stale_records_are_removed_by_descriptor_links_themselves(tmp_path):
    """What a previous run left (``*.jsonl``, ``*.exit``) goes; a link of that name is removed
    itself (its target stays), a directory of that name and other files stay."""
    from hpcstack.validate.runner import remove_stale

    out, job = _job_dir(tmp_path)
    victim = tmp_path / "victim.jsonl"
    victim.write_text("precious\n")
    for name in ("ddp.jsonl", "ddp.exit", "job.sh", "keep.txt"):
        (job / name).write_text("old\n")
    (job / "link.jsonl").symlink_to(victim)
    (job / "dir.exit").mkdir()
    assert remove_stale(job, out) == ["ddp.exit", "ddp.jsonl", "link.jsonl"]
    assert sorted(p.name for p in job.iterdir()) == ["dir.exit", "job.sh", "keep.txt"]
    assert victim.read_text() == "precious\n"


def test_stale_records_behind_a_linked_job_directory_are_left(tmp_path):
    """The job's directory swapped for a link to another directory: nothing there is removed
    (the old ``glob`` then ``unlink`` by name removed what the link pointed at, the control)."""
    from hpcstack.validate.runner import remove_stale

    out, job = _job_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "roots.jsonl").write_text("precious\n")
    job.rmdir()
    job.symlink_to(elsewhere)
    with pytest.raises(OSError) as exc:
        remove_stale(job, out)
    assert exc.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert (elsewhere / "roots.jsonl").read_text() == "precious\n"
    for stale in job.glob("*.jsonl"):           # the control: by name, through the link
        stale.unlink()
    assert not (elsewhere / "roots.jsonl").exists()


def test_chown_tree_changes_by_descriptor_and_skips_links_and_hard_links(tmp_path):
    """The tree is given away through descriptors: a link is left as it is (not its target),
    a file with a second hard link is left as it is, directories and plain files are changed."""
    import pwd

    from hpcstack.validate.outdir import chown_tree

    out, job = _job_dir(tmp_path)
    (job / "job.sh").write_text("#!/bin/sh\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("precious\n")
    (job / "linked").symlink_to(elsewhere)
    os.link(elsewhere, job / "hard")
    seen = []
    real_fchown = os.fchown
    try:
        os.fchown = lambda fd, uid, gid: (seen.append(os.readlink(f"/proc/self/fd/{fd}")), real_fchown(fd, uid, gid))
        chown_tree(out, pwd.getpwuid(os.geteuid()).pw_name)
    finally:
        os.fchown = real_fchown
    assert sorted(seen) == sorted([str(out), str(job), str(job / "job.sh")])


def _plant_after_first_check(monkeypatch, module, where: Path, elsewhere: Path) -> None:
    """After the first ``trust.check_dirs`` of ``module`` (the check before anything is made), a
    link appears at ``where`` (a directory still to be made) pointing at ``elsewhere``: the race
    a stack-group member or a user runs between the check and a ``makedirs`` by name (the link
    is given to ``nobody``: root's own link would be one the gate may follow)."""
    from hpcstack import trust

    real, calls = trust.check_dirs, []

    def check_then_plant(*args, **kwargs):
        real(*args, **kwargs)
        if not calls:
            where.symlink_to(elsewhere)
            os.lchown(where, 65534, 65534)      # nobody's link: not one a trusted account put there
        calls.append(1)

    monkeypatch.setattr(trust, "check_dirs", check_then_plant)


@pytest.mark.integration          # root gives the link to another account
def test_the_validation_directory_is_made_through_no_link_planted_after_the_check(tmp_path, monkeypatch):
    """A link planted at a missing parent of ``--output-dir`` after the check: root makes
    nothing through it (``os.makedirs`` followed it and made the directory elsewhere)."""
    from hpcstack import trust
    from hpcstack.errors import ConfigError
    from hpcstack.validate import outdir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planned = tmp_path / "runs" / "v1"
    _plant_after_first_check(monkeypatch, outdir, tmp_path / "runs", elsewhere)
    with pytest.raises(ConfigError) as info:
        outdir.validation_dir("--output-dir", str(planned), str(tmp_path), "v", trust.Policy(uid=os.geteuid()))
    assert "a symbolic link" in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.integration          # root gives the link to another account
def test_the_installs_private_directories_are_made_through_no_link_planted_after_the_check(tmp_path, monkeypatch):
    """``InstallService._private_dirs``: a link planted at a missing parent of the cache after the
    check: nothing made through it (the check after finds the link and refuses)."""
    from types import SimpleNamespace

    from hpcstack.errors import ConfigError
    from hpcstack.install import service as service_mod
    from hpcstack.install.layout import StackLayout

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    svc = object.__new__(service_mod.InstallService)
    svc.trust = None
    svc.site = SimpleNamespace(raw={}, cache_dir=str(tmp_path / "var" / "cache"), stage_root=str(tmp_path / "stage"),
                               install_root=str(tmp_path / "sw"), installer=SimpleNamespace(wheel_cache=None))
    svc.layout = StackLayout(str(tmp_path / "sw"), "tiny", "1.0")
    monkeypatch.setattr(service_mod.InstallService, "_lock_mode", lambda self: 0o600)
    _plant_after_first_check(monkeypatch, service_mod, tmp_path / "var", elsewhere)
    with pytest.raises((ConfigError, OSError)):
        with svc._private_dirs():
            pass
    assert list(elsewhere.iterdir()) == []
