"""The attacker's tests of quoting: an ordinary user of the login node (``rtuser``, tests/attacker.py)
supplies a value that would run code if some output language took it as code, then root runs the
real command on it. Each test asserts that the canary was not created, and where hpcstack refuses
the value, that the refusal is one line with exit status 2.

How the user's values reach root: a site config or an advisory database the user wrote (in a
ticket: "please build this for our group") that the admin copied into a root-owned place, a
directory name the user asks for, or the environment a ``module load`` runs in. The attacks:

1. ``modules.env`` ``$(touch CANARY)``: the Apptainer definition's ``%setup`` (run on the build
   host) and ``%environment``/``%post`` run for real;
2. the same with backticks and quotes;
3. ``container.rootfs`` ``rootfs.tar;touch CANARY``: refused (``%setup`` runs on the build host);
4. ``container.setup`` ``%setup`` + a command: refused (Apptainer would start a host section);
5. a newline in ``modules.env`` (a Dockerfile instruction of its own): refused;
6. the Dockerfile's ``ENV``/``LABEL``/``ADD`` built with buildah: values exact, nothing runs;
7. ``VIRTUAL_ENV='|sh -c "touch CANARY" x'`` at ``module load`` of the Tcl modulefile
   (Environment Modules, Lmod) and of the Lua modulefile (Lmod);
8. ``VIRTUAL_ENV`` naming a venv whose ``bin/activate`` is a FIFO: ``module load`` returns;
9. an OSV record with a YAML alias bomb for ``audit --db``: refused within seconds;
10. an OSV record with wrong types (``affected: [1]``): refused, not an internal error;
11. ``validate --output-dir "/x a --export=..."`` (and a newline, and ``%``): refused, nothing made;
12. an install root holding ``${IFS}`` (site config and ``--prefix``): refused;
13. a recipe repository whose path holds ``${IFS}``: refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from attacker import attacker  # noqa: F401
from conftest import REPO, hpcstack
from moduletools import TOOLS, require
from test_export_container import apptainer_sections, dockerfile_instructions, rootfs_tar

pytestmark = pytest.mark.integration

RECIPE = "pytorch/2.3.1-gpu"


def admin_copy(attacker, src: Path) -> Path:
    """The admin copies the user's file or directory into a root-owned place (as from a ticket)."""
    dest = attacker.shared / src.name
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True)
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, name), 0, 0)
    else:
        shutil.copyfile(src, dest)
    os.lchown(dest, 0, 0)
    return dest


def user_site(attacker, change) -> Path:
    """A site config the user wrote (localhost's, with ``change(data)`` applied), as the admin's copy."""
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["name"] = "ticket"
    change(data)
    theirs = attacker.write(attacker.home / "ticket.yaml", yaml.safe_dump(data))
    return admin_copy(attacker, theirs)


def with_env(value: str):
    def change(data):
        data["modules"]["env"] = {"HOSTILE": value}
    return change


# ------------------------------------------------------------------------------ container exports

@pytest.mark.parametrize("template", ["$(touch {canary})", "`touch {canary}`", "'; touch {canary}; echo '",
                                      '"; touch {canary} #'])
def test_a_users_env_value_runs_nowhere_in_the_apptainer_build(attacker, template):
    """Attacks 1 and 2: root exports the definition and runs what ``apptainer build`` would run
    outside the image's own commands: ``%setup`` on the host, the environment sections."""
    value = template.format(canary=attacker.canary)
    site = user_site(attacker, with_env(value))
    out = attacker.shared / "stack.def"
    proc = hpcstack("export", RECIPE, "--site", str(site), "--format", "apptainer", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    sections = apptainer_sections(out.read_text())
    work = Path(tempfile.mkdtemp(dir=attacker.shared))
    rootfs_tar(work)
    (work / "rootfs").mkdir()
    for name, body in sections:
        assert subprocess.run(["sh", "-n"], input=body, text=True).returncode == 0, (name, body)
        if name == "setup" or (name in ("environment", "post") and "HOSTILE" in body and
                               all(ln.strip().startswith("export ") for ln in body.splitlines() if ln.strip())):
            run = subprocess.run(["sh", "-c", body + 'printf "%s" "${HOSTILE-}"'], cwd=work, capture_output=True,
                                 text=True, env={"PATH": "/usr/bin:/bin", "APPTAINER_ROOTFS": str(work / "rootfs")})
            assert run.returncode == 0, run.stderr
            assert run.stdout in ("", value), run.stdout
    assert (work / "rootfs" / "etc" / "hello").is_file()
    assert not attacker.canary.exists(), "root ran the user's value"


@pytest.mark.parametrize("fmt", ["apptainer", "docker"])
def test_a_rootfs_name_with_a_command_is_refused(attacker, fmt):
    """Attack 3: ``%setup`` would run ``tar … -xf rootfs.tar;touch CANARY`` on the build host."""
    site = user_site(attacker, lambda d: d["container"].update(rootfs=f"rootfs.tar;touch${{IFS}}{attacker.canary}"))
    out = attacker.shared / "spec"
    proc = hpcstack("export", RECIPE, "--site", str(site), "--format", fmt, "-o", str(out))
    attacker.assert_refused(proc, "container.rootfs")
    assert len(proc.stderr.splitlines()) == 1 and not out.exists()


def test_a_setup_command_that_opens_a_host_section_is_refused(attacker):
    """Attack 4: a command line ``%setup`` would make the next one run on the build host."""
    site = user_site(attacker, lambda d: d["container"].update(setup=["%setup", f"touch {attacker.canary}"]))
    proc = hpcstack("export", RECIPE, "--site", str(site), "--format", "apptainer")
    attacker.assert_refused(proc, "container.setup", "may not start with %")
    assert proc.stdout == ""


@pytest.mark.parametrize("fmt", ["docker", "apptainer"])
def test_a_newline_in_an_env_value_is_refused(attacker, fmt):
    """Attack 5: ``x\\nRUN touch CANARY`` would be a Dockerfile instruction (and a line of its
    own in the definition)."""
    site = user_site(attacker, with_env(f"x\nRUN touch {attacker.canary}\n%setup\ntouch {attacker.canary}"))
    proc = hpcstack("export", RECIPE, "--site", str(site), "--format", fmt)
    attacker.assert_refused(proc, "modules.env.HOSTILE", "control character")
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""


def test_the_dockerfile_built_by_buildah_keeps_the_users_values_exact(attacker, tmp_path):
    """Attack 6: the Dockerfile's ``ENV``, ``LABEL``, ``ADD`` and ``ENTRYPOINT`` built for real
    (buildah, vfs storage of the test's own; ``RUN``/``COPY`` left out: they need the real root
    filesystem and the wheel): the user's value reaches the image byte for byte."""
    if not shutil.which("buildah"):
        pytest.skip("buildah missing (scripts/localhost-setup --with-test-tools installs it); "
                    "tests/test_export_container.py checks the Dockerfile's instructions without it")
    value = f"$(touch {attacker.canary}) `touch {attacker.canary}` \"q\" 'x' back\\slash ${{HOME}} $PATH"
    site = user_site(attacker, with_env(value))
    proc = hpcstack("export", RECIPE, "--site", str(site), "--format", "docker")
    assert proc.returncode == 0, proc.stderr
    kept = [text for i, text in dockerfile_instructions(proc.stdout) if i in ("FROM", "ADD", "ENV", "LABEL",
                                                                               "ENTRYPOINT")]
    assert [k.split()[0] for k in kept] == ["FROM", "ADD", "ENV", "ENV", "LABEL", "ENTRYPOINT"], kept
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    rootfs_tar(ctx)
    (ctx / "Dockerfile").write_text("\n".join(kept) + "\n")
    store = ["buildah", "--root", str(tmp_path / "storage"), "--runroot", str(tmp_path / "run"),
             "--storage-driver", "vfs"]
    try:
        built = subprocess.run([*store, "bud", "--isolation", "chroot", "-q", "-t", "hpcstack-quoting-probe",
                                str(ctx)], capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
        info = subprocess.run([*store, "inspect", "hpcstack-quoting-probe"], capture_output=True, text=True,
                              timeout=120)
        assert info.returncode == 0, info.stderr
    finally:
        subprocess.run([*store, "rmi", "--all", "--force"], capture_output=True, timeout=120)
    config = json.loads(info.stdout)["OCIv1"]["config"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["HOSTILE"] == value
    assert env["PATH"].startswith("/opt/hpcstack/software/pytorch/2.3.1-gpu/venv/bin:") and "$" not in env["PATH"]
    assert config["Labels"]["org.hpcstack.site"] == "ticket"
    assert config["Entrypoint"][:3] == ["hpcstack", "validate", RECIPE]
    assert not attacker.canary.exists()


# ------------------------------------------------------------------------------ modulefiles

def _modulefile(tool, syntax: str, root: Path, prefix: Path) -> str:
    """The real modulefile of RECIPE in ``syntax`` for ``tool``, written under ``root``; its name."""
    from hpcstack.install.components.modulefile import render_for_prefix
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    site = load_site("localhost" if tool.name == "environment-modules" else "localhost-lmod")
    text = render_for_prefix(site, load_recipe(RECIPE, site), str(prefix), "3.11", syntax)
    path = root / "pytorch" / ("2.3.1-gpu.lua" if syntax == "lua" else "2.3.1-gpu")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return "pytorch/2.3.1-gpu"


@pytest.mark.parametrize("tool, syntax", [pytest.param(t, s, id=f"{t.short}-{s}") for t in TOOLS
                                          for s in (("tcl", "lua") if t.name == "lmod" else ("tcl",))])
@pytest.mark.parametrize("payload", ["pipe", "fifo"])
def test_virtual_env_from_the_user_never_runs_or_blocks_at_module_load(attacker, tool, syntax, payload):
    """Attacks 7 and 8: root loads the stack's module in an environment whose VIRTUAL_ENV the user
    chose (root activated the user's venv to help, or `sudo -E`): Tcl's ``open`` of a name that
    starts with ``|`` would run a command (under Environment Modules, and under Lmod, which runs
    a Tcl modulefile through Tcl too); a FIFO as ``bin/activate`` would block the load."""
    require(tool)
    if payload == "pipe":
        venv = f'|sh -c "touch {attacker.canary}" x'
    else:
        home_venv = attacker.mkdir(attacker.home / "venv" / "bin").parent
        attacker.sh(f"mkfifo {home_venv}/bin/activate")
        venv = str(home_venv)
    root = attacker.shared / "modules"
    name = _modulefile(tool, syntax, root, attacker.shared / "prefix")
    proc = tool.bash(f"module load {name}; echo loaded", env={"VIRTUAL_ENV": venv},
                     modulepath=f"{root}:/opt/hpcstack/base-modulefiles", timeout=30)
    assert not attacker.canary.exists(), f"module load ran the user's VIRTUAL_ENV: {proc.stderr}"
    # the module was read and its venv check ran (it warns: not an extended venv)
    assert "is not extended" in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "loaded", proc.stdout + proc.stderr


# ------------------------------------------------------------------------------ audit --db

def _user_db(attacker, text: str) -> Path:
    db = attacker.mkdir(attacker.home / "osv-db")
    attacker.write(db / "PYSEC-0000-1.yaml", text)
    return admin_copy(attacker, db)


def test_an_alias_bomb_in_an_advisory_database_is_refused_quickly(attacker):
    """Attack 9: 12 levels of 9 aliases (under 1 KB) would be 9**12 values."""
    lines = ["id: PYSEC-0000-1", 'a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    lines.append("affected: [{package: {ecosystem: PyPI, name: six}, versions: *a11}]")
    db = _user_db(attacker, "\n".join(lines) + "\n")
    proc = hpcstack("audit", "--db", str(db), RECIPE, timeout=8)
    attacker.assert_refused(proc, "YAML alias")
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""


@pytest.mark.parametrize("record, says", [
    ("id: PYSEC-0000-1\naffected: [1]\n", "affected.0: 1 is not of type 'object'"),
    ("id: PYSEC-0000-1\naffected: [{package: {ecosystem: PyPI, name: six}, ranges: [{type: ECOSYSTEM, "
     "events: [introduced]}]}]\n", "affected.0.ranges.0.events.0: 'introduced' is not of type 'object'"),
    ("id: [1]\n", "id: [1] is not of type 'string'"),
])
def test_an_advisory_with_wrong_types_is_refused_in_one_line(attacker, record, says):
    """Attack 10: wrong types were an internal error (exit 70)."""
    db = _user_db(attacker, record)
    proc = hpcstack("audit", "--db", str(db), RECIPE, timeout=60)
    attacker.assert_refused(proc, says)
    assert len(proc.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------ job scripts and paths

@pytest.mark.parametrize("name", ["x a --export=ALL,LD_PRELOAD=/home/rtuser/evil.so", "x\n#SBATCH --uid=0",
                                  "x%u", "x#y", "x'q"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_an_output_dir_an_sbatch_line_cannot_hold_is_refused(attacker, name, dry_run):
    """Attack 11: the user asks for the validation's output in a directory of theirs; its name
    would add #SBATCH options (white space), end the line (newline, #) or be read as a pattern."""
    target = attacker.home / name
    proc = hpcstack("validate", RECIPE, "--site", "localhost", "--output-dir", str(target),
                    *(["--dry-run"] if dry_run else []))
    attacker.assert_refused(proc, "control character" if "\n" in name else "--output-dir: ")
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    assert not os.path.lexists(target) and not os.path.lexists(attacker.home / "x")


def test_an_install_root_with_a_variable_is_refused(attacker):
    """Attack 12: ``${IFS}`` (or any ``${NAME}``) in an install root was expanded by the build's
    commands and by the dry-run script; ``:`` would split PATH."""
    root = f"{attacker.shared}/stacks${{IFS}}x"
    site = user_site(attacker, lambda d: d.update(install_root=root, module_root=f"{attacker.shared}/modules"))
    proc = hpcstack("install", RECIPE, "--site", str(site), "--dry-run")
    attacker.assert_refused(proc, "install_root", "${IFS}")
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    for prefix in (root, f"{attacker.shared}/a:{attacker.home}"):
        proc = hpcstack("install", RECIPE, "--site", "localhost", "--prefix", prefix, "--dry-run")
        attacker.assert_refused(proc, "--prefix")
        assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    assert sorted(p.name for p in attacker.shared.iterdir()) == ["ticket.yaml"]


def test_a_repository_path_with_a_variable_is_refused(attacker):
    """Attack 13: a repository the admin unpacked from the user's ticket under the name it came
    with, ``repo${IFS}``: the build would apply the lock and patches at the expanded path
    (``repo``), not the files it checked."""
    theirs = attacker.mkdir(attacker.home / "repo${IFS}")
    attacker.mkdir(theirs / "recipes")
    repo = admin_copy(attacker, theirs)
    proc = hpcstack("install", RECIPE, "--repo", str(repo), "--site", "localhost", "--dry-run")
    attacker.assert_refused(proc, "--repo", "holds a $")
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
