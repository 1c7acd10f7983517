"""An ordinary user of the login node against hpcstack's trust rule (docs/admin/security.md).

The account ``rtuser`` (group ``users``; tests/attacker.py) plants its code or its directories the
way a user of a shared login node can: a recipe file of its own, a world-writable recipe in a
root-owned repository, a repository its group can write (and a site config naming that group as
the admins), a cache, install root, module root, stage dir, bundle, venv or kernels directory
made before root's, a link into hpcstack's own data, a system config of its own. Then root runs
the real ``hpcstack`` command, as an admin would. Each test asserts that the user's code did not
run (the canary is absent) and that the command refused in one ``error:`` line with exit status 2.

Every command of ``hpcstack --help`` that reads a recipe or a site is attacked with a recipe the
user can change (:data:`RECIPE_COMMANDS`); ``--dry-run`` is used where the command has it (the
refusal comes first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from attacker import attacker  # noqa: F401
from conftest import HPCSTACK, NEUTRAL_DIR, REPO, make_sdist, write_tiny_recipe
from hpcstack import data_root

pytestmark = pytest.mark.integration

#: Variables of root's environment that would change what the commands read.
_CLEARED = ("HPCSTACK_PATH", "HPCSTACK_CACHE_DIR", "HPCSTACK_DEBUG")


def hs(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Root runs the real ``hpcstack`` command."""
    base = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    return subprocess.run([*HPCSTACK, *map(str, args)], capture_output=True, text=True, cwd=NEUTRAL_DIR,
                          timeout=300, env={**base, **(env or {})})


def refused(attacker, proc: subprocess.CompletedProcess, *words: str) -> None:
    """:meth:`Attacker.assert_refused`, and the refusal is exactly one line."""
    attacker.assert_refused(proc, *words)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr


@pytest.fixture
def repo(attacker) -> Path:
    """A root-owned repository (modes 0755/0644) in the shared scratch directory: the tiny recipe,
    which creates the canary if it ever runs, and a copy of the built-in localhost site."""
    root = attacker.shared
    (root / "src").mkdir()
    recipe = write_tiny_recipe(root / "repo" / "recipes", make_sdist(root / "src"))
    recipe.write_text(attacker.payload() + recipe.read_text())
    (root / "repo" / "site-configs").mkdir()
    shutil.copy(REPO / "site-configs" / "localhost.yaml", root / "repo" / "site-configs" / "localhost.yaml")
    for p in [root / "repo", *(root / "repo").rglob("*"), root / "src", *(root / "src").rglob("*")]:
        os.chown(p, 0, 0)
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return root / "repo"


def set_site(repo: Path, **changes) -> Path:
    """Change the repository's (root-owned) localhost site config."""
    path = repo / "site-configs" / "localhost.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data))
    return path


def roots(attacker) -> list[str]:
    """Root's own install and module roots for this test."""
    return ["--prefix", str(attacker.shared / "sw"), "--module-root", str(attacker.shared / "mf")]


def evil_recipe(attacker) -> Path:
    """A recipe file of the user's own: its payload runs at import."""
    return attacker.write(attacker.home / "evil.py", attacker.payload() +
                          "from hpcstack.recipe import Recipe\n\n"
                          "def recipe(site):\n    return Recipe('evil', '1.0', whatis='x', components=[])\n")


def command(name: str, spec: str, attacker, repo: Path | None) -> list[str]:
    """The command line of ``name`` on the recipe ``spec`` (NAME/VERSION in ``repo``, or a file)."""
    shared = attacker.shared
    prefix, modules = str(shared / "sw"), str(shared / "mf")
    site = ["--site", "localhost"] + (["--repo", str(repo)] if repo else [])
    return {
        "install": ["install", spec, *site, "--prefix", prefix, "--module-root", modules, "--dry-run"],
        "validate": ["validate", spec, *site, "--prefix", prefix, "--module-root", modules, "--dry-run"],
        "lock": ["lock", spec, *site],
        "export": ["export", spec, *site, "--format", "json"],
        "bundle": ["bundle", spec, *site, "-o", str(shared / "bundle")],
        "audit": ["audit", spec, *site, "--osv-url", "http://127.0.0.1:9"],
        "show": ["show", spec, *site, "--prefix", prefix],
        "uninstall": ["uninstall", spec, *site, "--prefix", prefix, "--module-root", modules, "--dry-run"],
        "mount": ["mount", spec, *site, "--prefix", prefix, "--print-unit"],
        "module deprecate": ["module", "deprecate", spec, *site, "--module-root", modules],
        "module undeprecate": ["module", "undeprecate", spec, *site, "--module-root", modules],
        "kernel install": ["kernel", "install", spec, *site, "--prefix", str(shared / "k"), "--module-root", modules],
        "kernel remove": ["kernel", "remove", spec, *site, "--prefix", str(shared / "k")],
    }[name]


#: Every command of ``hpcstack --help`` that reads a recipe file (``list`` only compiles them;
#: ``check-build``, ``doctor`` and ``action`` read none).
RECIPE_COMMANDS = ("install", "validate", "lock", "export", "bundle", "audit", "show", "uninstall", "mount",
                   "module deprecate", "module undeprecate", "kernel install", "kernel remove")

#: The commands that run a recipe given as NAME/VERSION (the others only take its name).
RUNS_RECIPE_BY_NAME = ("install", "validate", "lock", "export", "bundle", "audit", "kernel install",
                       "kernel remove")


# ------------------------------------------------------------------ recipes the user can change

@pytest.mark.parametrize("name", RECIPE_COMMANDS)
def test_a_recipe_file_of_the_users_own(attacker, name):
    """``hpcstack show ~rtuser/evil.py`` ran the user's code as root; so did every command
    that took a recipe file without the check."""
    evil = evil_recipe(attacker)
    proc = hs(*command(name, str(evil), attacker, None))
    refused(attacker, proc, f"{evil}: owned by {attacker.name}")


@pytest.mark.parametrize("name", RUNS_RECIPE_BY_NAME)
def test_a_world_writable_recipe_in_a_root_owned_repository(attacker, repo, name):
    """``kernel install tiny/1.0 --repo R`` ran a world-writable recipe of a root-owned repository."""
    recipe = repo / "recipes" / "tiny" / "1.0.py"
    recipe.chmod(0o666)
    attacker.sh(f"printf '%s' {shlex_quote(attacker.payload())} >> {recipe}")
    assert recipe.read_text().count(attacker.payload()) == 2   # the user did write it
    proc = hs(*command(name, "tiny/1.0", attacker, repo))
    refused(attacker, proc, f"{recipe}: writable by every user")


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote("\n" + text)


def test_a_patch_the_user_owns_in_a_root_owned_recipe_directory(attacker, repo):
    patches = repo / "recipes" / "tiny" / "patches"
    attacker.write(patches / "evil.patch", "--- a\n+++ b\n")
    proc = hs(*command("install", "tiny/1.0", attacker, repo))
    refused(attacker, proc, f"{patches / 'evil.patch'}: owned by {attacker.name}")


def test_a_file_beyond_the_first_thousands_of_a_recipe_directory(attacker, repo):
    """The check stopped after 2,000 entries of a recipe directory: everything counts now."""
    many = repo / "recipes" / "tiny" / "data"
    many.mkdir()
    for i in range(2100):
        (many / f"f{i:05d}").touch()
    late = attacker.mkdir(many / "zz-user")
    proc = hs(*command("install", "tiny/1.0", attacker, repo))
    refused(attacker, proc, f"{late}: owned by {attacker.name}")


def test_a_repository_on_hpcstack_path_that_the_user_owns(attacker):
    """A user's repository on root's HPCSTACK_PATH, shadowing the built-in pytorch recipe."""
    evil_repo = attacker.mkdir(attacker.home / "repo")
    attacker.mkdir(evil_repo / "recipes" / "pytorch")
    attacker.write(evil_repo / "recipes" / "pytorch" / "2.3.1-gpu.py", attacker.payload())
    proc = hs("install", "pytorch/2.3.1-gpu", "--dry-run", env={"HPCSTACK_PATH": str(evil_repo)})
    refused(attacker, proc, f"{evil_repo}: owned by {attacker.name}")


def test_a_recipes_directory_the_user_owns_in_a_root_owned_repository(attacker, repo):
    recipes = repo / "recipes"
    os.chown(recipes, attacker.uid, attacker.gid)
    proc = hs("list", "--repo", repo)
    refused(attacker, proc, f"{recipes}: owned by {attacker.name}")


def test_a_link_into_hpcstacks_data_from_a_directory_the_user_owns(attacker):
    """A user-owned directory holding a link into hpcstack's own data skipped the check: the
    user can point the link elsewhere between the check and the read."""
    link = attacker.home / "r.py"
    link.symlink_to(Path(data_root()) / "recipes" / "mpi4py" / "4.1.2.py")
    os.lchown(link, attacker.uid, attacker.gid)
    proc = hs("install", link, "--site", "localhost", *roots(attacker), "--dry-run")
    refused(attacker, proc, f"{link}: owned by {attacker.name}")


def test_a_site_link_into_hpcstacks_data_from_a_directory_the_user_owns(attacker):
    link = attacker.home / "s.yaml"
    link.symlink_to(Path(data_root()) / "site-configs" / "localhost.yaml")
    os.lchown(link, attacker.uid, attacker.gid)
    proc = hs("module", "set-default", "tiny/1.0", "--site", link, "--module-root", attacker.shared / "mf")
    refused(attacker, proc, f"{link}: owned by {attacker.name}")


# ------------------------------------------------------------------ who is trusted

def test_a_group_member_cannot_name_the_group_the_admins(attacker, repo):
    """A repository its group (users) can write was refused until a member appended
    ``admin_group: users`` to the group-writable site config in it."""
    site = repo / "site-configs" / "localhost.yaml"
    for p in (repo, repo / "site-configs", site):
        os.chown(p, 0, attacker.gid)
        p.chmod(0o775 if p.is_dir() else 0o664)
    attacker.sh(f"printf 'permissions:\\n  admin_group: users\\n' >> {site}")
    assert "admin_group: users" in site.read_text()
    proc = hs(*command("install", "tiny/1.0", attacker, repo))
    refused(attacker, proc, "writable by group users")


def test_a_system_config_of_the_users_own(attacker, repo):
    """The file naming the admin group must be root's: a user's names no one."""
    config = attacker.write(attacker.home / "config.yaml", "admin_group: users\n")
    os.chown(repo / "recipes", 0, attacker.gid)
    (repo / "recipes").chmod(0o775)
    proc = hs(*command("install", "tiny/1.0", attacker, repo), "--system-config", config)
    refused(attacker, proc, f"system configuration {config}: owned by {attacker.name}")


def test_a_site_config_the_user_owns(attacker):
    site = attacker.write(attacker.home / "localhost.yaml",
                          (REPO / "site-configs" / "localhost.yaml").read_text()
                          + f"build:\n  env:\n    LD_PRELOAD: {attacker.home}/evil.so\n")
    proc = hs("module", "set-default", "tiny/1.0", "--site", site, "--module-root", attacker.shared / "mf")
    refused(attacker, proc, f"{site}: owned by {attacker.name}")


# ------------------------------------------------------------------ directories root writes to and reads back

def plant_cache(attacker, cache: Path) -> Path:
    """The user makes the cache first and leaves a ``six.py`` in it for root's sanity check."""
    attacker.mkdir(cache, 0o777)
    attacker.write(cache / "six.py", attacker.payload())
    return cache


def test_a_cache_dir_the_user_made_first(attacker, repo):
    cache = plant_cache(attacker, attacker.home / "cache")
    set_site(repo, cache_dir=str(cache))
    proc = hs(*command("install", "tiny/1.0", attacker, repo))
    refused(attacker, proc, f"cache_dir {cache}: owned by {attacker.name}")


def test_the_cache_variable_naming_a_directory_the_user_made(attacker, repo):
    cache = plant_cache(attacker, attacker.home / "cache")
    proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--module-root",
              attacker.shared / "mf", "--dry-run", env={"HPCSTACK_CACHE_DIR": str(cache)})
    refused(attacker, proc, f"cache_dir {cache}: owned by {attacker.name}")


def test_the_cache_under_a_prefix_the_user_made_first(attacker, repo):
    """``--prefix /tmp/sw``: the user made /tmp/sw/.hpcstack/cache before root's first install."""
    prefix = Path("/tmp") / f"{attacker.shared.name}-sw"
    try:
        attacker.sh(f"mkdir -p {prefix}/.hpcstack/cache && chmod -R 777 {prefix}")
        attacker.write(prefix / ".hpcstack" / "cache" / "six.py", attacker.payload())
        proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", prefix,
                  "--module-root", attacker.shared / "mf", "--dry-run")
        refused(attacker, proc, f"install root {prefix}: owned by {attacker.name}")
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def test_a_stage_root_the_user_owns(attacker, repo):
    stage = attacker.mkdir(attacker.home / "stage")
    set_site(repo, stage_root=str(stage))
    proc = hs(*command("install", "tiny/1.0", attacker, repo))
    refused(attacker, proc, f"stage_root {stage}: owned by {attacker.name}")


def test_a_wheel_cache_the_user_owns(attacker, repo):
    wheels = attacker.mkdir(attacker.home / "wheels")
    data = yaml.safe_load((repo / "site-configs" / "localhost.yaml").read_text())
    set_site(repo, installer={**(data.get("installer") or {}), "wheel_cache": str(wheels)})
    proc = hs(*command("install", "tiny/1.0", attacker, repo))
    refused(attacker, proc, f"installer.wheel_cache {wheels}: owned by {attacker.name}")


def test_an_install_root_the_user_owns(attacker, repo):
    prefix = attacker.mkdir(attacker.home / "sw")
    proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", prefix,
              "--module-root", attacker.shared / "mf", "--dry-run")
    refused(attacker, proc, f"install root {prefix}: owned by {attacker.name}")


def test_a_module_root_where_the_user_swapped_a_modulefile(attacker, repo):
    modules = attacker.mkdir(attacker.home / "mf")
    attacker.mkdir(modules / "tiny")
    attacker.write(modules / "tiny" / "1.0", f"#%Module\nputs stdout {{{attacker.shell_payload()}}}\n")
    proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", attacker.shared / "sw",
              "--module-root", modules, "--dry-run")
    refused(attacker, proc, f"module root {modules}: owned by {attacker.name}")


def test_an_install_root_under_a_directory_every_user_can_write(attacker, repo):
    """No sticky bit: a user can rename the install root away and put their own in its place."""
    open_dir = attacker.shared / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", open_dir / "sw",
              "--module-root", attacker.shared / "mf", "--dry-run")
    refused(attacker, proc, f"{open_dir}: writable by every user")


def test_uninstall_in_an_install_root_the_user_owns_follows_no_link(attacker, repo):
    """A link ``P/tiny -> /elsewhere`` in a user's install root made root's uninstall remove
    ``/elsewhere/1.0``."""
    elsewhere = attacker.shared / "elsewhere"
    (elsewhere / "1.0").mkdir(parents=True)
    (elsewhere / "1.0" / "keep").write_text("root's\n")
    prefix = attacker.mkdir(attacker.home / "sw")
    (prefix / "tiny").symlink_to(elsewhere)
    os.lchown(prefix / "tiny", attacker.uid, attacker.gid)
    proc = hs("uninstall", "tiny/1.0", "--site", "localhost", "--prefix", prefix, "--module-root",
              attacker.shared / "mf", "--force")
    refused(attacker, proc, f"install root {prefix}: owned by {attacker.name}")
    assert (elsewhere / "1.0" / "keep").read_text() == "root's\n"


@pytest.mark.parametrize("name", ("show", "mount", "validate"))
def test_reading_back_a_stack_from_an_install_root_the_user_owns(attacker, repo, name):
    prefix = attacker.mkdir(attacker.home / "sw")
    attacker.mkdir(prefix / "tiny")
    args = command(name, "tiny/1.0", attacker, repo)
    args[args.index("--prefix") + 1] = str(prefix)
    proc = hs(*args)
    refused(attacker, proc, f"install root {prefix}: owned by {attacker.name}")


@pytest.mark.parametrize("action", ("set-default", "deprecate"))
def test_module_commands_on_a_module_root_the_user_owns(attacker, action):
    modules = attacker.mkdir(attacker.home / "mf")
    proc = hs("module", action, "tiny/1.0", "--site", "localhost", "--module-root", modules)
    refused(attacker, proc, f"module root {modules}: owned by {attacker.name}")


def test_a_kernels_directory_the_user_owns(attacker, repo):
    kernels = attacker.mkdir(attacker.home / "k")
    proc = hs("kernel", "install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", kernels,
              "--module-root", attacker.shared / "mf")
    refused(attacker, proc, f"{kernels}: owned by {attacker.name}")


def test_a_kernel_on_another_users_venv(attacker, repo):
    """``kernel install --venv`` on another user's venv gave no warning: the kernel would run
    that user's python in everyone who starts it."""
    venv = attacker.mkdir(attacker.home / "venv")
    attacker.mkdir(venv / "bin")
    attacker.write(venv / "bin" / "python", f"#!/bin/sh\n{attacker.shell_payload()}\n", 0o755)
    proc = hs("kernel", "install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix",
              attacker.shared / "k", "--module-root", attacker.shared / "mf", "--venv", venv)
    refused(attacker, proc, f"--venv {venv}: {venv / 'bin' / 'python'}: owned by {attacker.name}")


def test_a_bundle_written_into_a_directory_the_user_owns(attacker, repo):
    out = attacker.mkdir(attacker.home / "out")
    proc = hs("bundle", "tiny/1.0", "--site", "localhost", "--repo", repo, "-o", out / "bundle")
    refused(attacker, proc, f"{out}: owned by {attacker.name}")


def test_an_install_from_a_bundle_the_user_owns(attacker, repo):
    """The user's bundle names its own sha256s: its wheels would be installed by root."""
    bundle = attacker.mkdir(attacker.home / "bundle")
    attacker.write(bundle / "manifest.json", "{}")
    proc = hs(*command("install", "tiny/1.0", attacker, repo), "--from", bundle)
    refused(attacker, proc, f"{bundle}: owned by {attacker.name}")


def test_an_advisory_database_the_user_owns(attacker, repo):
    db = attacker.mkdir(attacker.home / "osv")
    proc = hs("audit", "tiny/1.0", "--site", "localhost", "--repo", repo, "--db", db)
    refused(attacker, proc, f"{db}: owned by {attacker.name}")


def test_auditing_a_stack_the_user_owns(attacker):
    stack = attacker.mkdir(attacker.home / "stack")
    attacker.mkdir(stack / ".hpcstack")
    proc = hs("audit", "--stack", stack, "--osv-url", "http://127.0.0.1:9")
    refused(attacker, proc, f"stack {stack}: owned by {attacker.name}")


def test_lock_with_a_cache_the_user_owns(attacker, repo):
    cache = plant_cache(attacker, attacker.home / "cache")
    set_site(repo, cache_dir=str(cache))
    proc = hs("lock", "tiny/1.0", "--site", "localhost", "--repo", repo)
    refused(attacker, proc, f"cache_dir {cache}: owned by {attacker.name}")


def test_a_sticky_directory_above_a_root_owned_prefix_is_fine(attacker, repo):
    """What the rule accepts: /tmp (sticky) above the install root root made there."""
    prefix = Path("/tmp") / f"{attacker.shared.name}-root-sw"
    try:
        prefix.mkdir(mode=0o755)
        proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", prefix,
                  "--module-root", attacker.shared / "mf", "--dry-run", "--trust-writable")
        assert proc.returncode == 0, proc.stderr
        assert attacker.canary.exists()     # the recipe ran: the check let it through
        attacker.canary.unlink()
        (repo / "recipes" / "tiny" / "1.0.py").write_text(
            (repo / "recipes" / "tiny" / "1.0.py").read_text().replace(attacker.payload(), ""))
        proc = hs("install", "tiny/1.0", "--site", "localhost", "--repo", repo, "--prefix", prefix,
                  "--module-root", attacker.shared / "mf", "--dry-run")
        assert proc.returncode == 0, proc.stderr
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


@pytest.mark.parametrize("cmd", ["install", "usage"])
def test_a_usage_log_in_a_directory_the_user_owns(attacker, repo, cmd):
    """The usage log's hooks run in every ``module load``, root's too: a usage log whose parent
    the user can write (they could swap ``usage`` for a directory of their own, with their own
    ``hooks/siteconfig.tcl``) is refused like an install root, before anything is read or
    written there; a root-owned one passes (the positive control)."""
    parent = attacker.mkdir(attacker.home / "logs")
    set_site(repo, lifecycle={"usage_log": str(parent / "usage")})
    args = (["install", "tiny/1.0", "--site", "localhost", "--repo", repo, *roots(attacker), "--dry-run"]
            if cmd == "install" else ["usage", "--site", "localhost", "--repo", repo])
    proc = hs(*args)
    refused(attacker, proc, f"lifecycle.usage_log {parent / 'usage'}: {parent}: owned by {attacker.name}")
    assert not (parent / "usage").exists()
    good = attacker.shared / "root-logs"
    good.mkdir(mode=0o755)
    set_site(repo, lifecycle={"usage_log": str(good / "usage")})
    proc = hs(*args)
    assert "lifecycle.usage_log" not in proc.stderr, proc.stderr
