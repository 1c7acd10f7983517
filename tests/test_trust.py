"""As root, hpcstack reads recipes, site configs and repositories only where root alone can write.

A repository anyone can write, a recipe owned by another user, a site config in a directory
another group can write: one line naming the path, exit status 2, and the recipe never runs
(not even for ``--dry-run``). The admin group, trusted as root is, comes from
``/etc/hpcstack/config.yaml`` (root's alone) or ``--admin-group``, never from the site config
under check (its ``permissions.admin_group`` is read, and a ``note:`` says it does not count);
``--trust-writable`` turns the check off. ``install`` names a recipe or site that shadows a
built-in one.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import HPCSTACK, NEUTRAL_DIR, REPO, make_sdist, write_tiny_recipe
from hpcstack.trust import SYSTEM_CONFIG

pytestmark = pytest.mark.integration


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        pytest.skip("the checks apply to root only; run the tests as root")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HPCSTACK, *args], capture_output=True, text=True, cwd=NEUTRAL_DIR, timeout=300,
                          env={**os.environ, **(env or {})})


def make_repo(root: Path, marker: Path, admin_group: str | None = None) -> Path:
    """A repository with the tiny recipe (which leaves ``marker`` when it runs) and a localhost
    site that shadows the built-in one."""
    repo = root / "repo"
    recipe = write_tiny_recipe(repo / "recipes", make_sdist(root))
    recipe.write_text(f"open({str(marker)!r}, 'w').close()\n" + recipe.read_text())
    (repo / "site-configs").mkdir()
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    if admin_group:
        site.setdefault("permissions", {})["admin_group"] = admin_group
    (repo / "site-configs" / "localhost.yaml").write_text(yaml.safe_dump(site))
    for p in [repo, *repo.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return repo


def dry_run(repo: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return run("install", "tiny/1.0", "--site", "localhost", "--repo", str(repo), "--prefix", str(root / "sw"),
               "--module-root", str(root / "mf"), "--dry-run", *extra)


def test_a_world_writable_repository_is_refused_before_its_recipe_runs(as_root, tmp_path):
    marker = tmp_path / "ran"
    repo = make_repo(tmp_path, marker)
    os.chmod(repo / "recipes", 0o777)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(repo / "recipes" / "tiny" / "1.0.py", nobody, -1)
    res = dry_run(repo, tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0] == (f"error: {repo / 'recipes'}: writable by every user; hpcstack reads recipes and "
                        "site configs only where root alone can write (fix with chown root / chmod go-w, or pass "
                        "--trust-writable)"), lines
    assert len(lines) == 1 and not marker.exists()
    os.chmod(repo / "recipes", 0o755)
    res = dry_run(repo, tmp_path)
    assert res.returncode == 2 and not marker.exists()
    assert res.stderr.startswith(f"error: {repo / 'recipes' / 'tiny' / '1.0.py'}: owned by nobody;"), res.stderr
    res = dry_run(repo, tmp_path, "--trust-writable")     # for those who mean it
    assert res.returncode == 0, res.stderr
    assert marker.exists()


def test_hpcstack_path_is_checked_too(as_root, tmp_path):
    repo = make_repo(tmp_path, tmp_path / "ran")
    os.chmod(repo, 0o777)
    res = run("install", "pytorch/2.3.1-gpu", "--dry-run", env={"HPCSTACK_PATH": str(repo)})
    assert res.returncode == 2 and f"error: {repo}: writable by every user" in res.stderr, res.stderr


@pytest.fixture
def system_config():
    """Write /etc/hpcstack/config.yaml for one test; the file (and the directory, where the test
    made it) as they were afterwards."""
    path = Path(SYSTEM_CONFIG)
    made_dir = not path.parent.exists()
    saved = path.read_bytes() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        if saved is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(saved)
        if made_dir:
            shutil.rmtree(path.parent, ignore_errors=True)


def a_group() -> str:
    return grp.getgrgid(next(g.gr_gid for g in grp.getgrall() if g.gr_gid != 0)).gr_name


def group_writable_site(tmp_path: Path, group: str) -> tuple[Path, Path]:
    """A repository whose site config a group can write, and that names the group its admins."""
    repo = make_repo(tmp_path, tmp_path / "ran", admin_group=group)
    site = repo / "site-configs" / "localhost.yaml"
    os.chown(site, 0, grp.getgrnam(group).gr_gid)
    os.chmod(site, 0o664)
    return repo, site


def test_a_site_config_cannot_name_who_may_write_it(as_root, tmp_path):
    group = a_group()
    repo, site = group_writable_site(tmp_path, group)
    assert yaml.safe_load(site.read_text())["permissions"]["admin_group"] == group
    res = dry_run(repo, tmp_path)
    assert res.returncode == 2 and f"error: {site}: writable by group {group}" in res.stderr, res.stderr
    assert not (tmp_path / "ran").exists()


def test_the_admin_group_comes_from_the_system_config(as_root, tmp_path, system_config):
    group = a_group()
    repo, site = group_writable_site(tmp_path, group)
    system_config.write_text(yaml.safe_dump({"admin_group": group}))
    os.chmod(system_config, 0o644)
    res = dry_run(repo, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "does not change whom hpcstack trusts" not in res.stderr      # it names the same group
    # a system config that another group can write names no one
    os.chown(system_config, 0, grp.getgrnam(group).gr_gid)
    os.chmod(system_config, 0o664)
    res = dry_run(repo, tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"error: system configuration {SYSTEM_CONFIG}: writable by "
                                 f"group {group};"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_admin_group_from_the_command_line(as_root, tmp_path):
    group = a_group()
    repo, site = group_writable_site(tmp_path, group)
    res = dry_run(repo, tmp_path, "--admin-group", group)
    assert res.returncode == 0, res.stderr
    other = next(g.gr_name for g in grp.getgrall() if g.gr_gid not in (0, grp.getgrnam(group).gr_gid))
    res = dry_run(repo, tmp_path, "--admin-group", other)
    assert res.returncode == 2 and f"error: {site}: writable by group {group};" in res.stderr, res.stderr
    assert f"where root and group {other} alone can write" in res.stderr
    # the site's key is read, and said not to count
    res = dry_run(repo, tmp_path, "--trust-writable")
    assert res.returncode == 0, res.stderr
    assert (f"note: {site}: permissions.admin_group ({group}) does not change whom hpcstack trusts"
            in res.stderr), res.stderr


def test_a_system_config_named_on_the_command_line(as_root, tmp_path):
    group = a_group()
    repo, site = group_writable_site(tmp_path, group)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"admin_group": group}))
    os.chmod(config, 0o644)
    res = dry_run(repo, tmp_path, "--system-config", str(config))
    assert res.returncode == 0, res.stderr
    config.write_text("admin_group: [1]\nother: 2\n")
    res = dry_run(repo, tmp_path, "--system-config", str(config))
    assert res.returncode == 2, res.stderr
    assert f"error: {config}: other: unknown key" in res.stderr, res.stderr
    assert f"error: {config}: admin_group: [1] is not of type 'string', 'null'" in res.stderr, res.stderr


def test_install_names_the_recipe_and_site_that_shadow_built_in_ones(as_root, tmp_path):
    repo = make_repo(tmp_path, tmp_path / "ran")
    res = dry_run(repo, tmp_path)
    assert res.returncode == 0, res.stderr
    assert (f"note: site localhost is {repo / 'site-configs' / 'localhost.yaml'} from --repo {repo}; it "
            "shadows the built-in site of that name") in res.stderr
    assert "note: recipe tiny/1.0" not in res.stderr  # no built-in tiny recipe to shadow
    shutil.copytree(REPO / "recipes" / "pytorch", repo / "recipes" / "pytorch")
    res = run("install", "pytorch/2.3.1-gpu", "--repo", str(repo), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"note: recipe pytorch/2.3.1-gpu is {repo / 'recipes' / 'pytorch' / '2.3.1-gpu.py'}" in res.stderr


def test_a_system_config_that_is_not_there(as_root, tmp_path):
    res = run("list", "--system-config", str(tmp_path / "none.yaml"))
    assert res.returncode == 2 and res.stderr == f"error: --system-config {tmp_path / 'none.yaml'}: no such file\n"


def test_a_recipe_directory_too_large_to_check_is_refused_not_checked_in_part(tmp_path, monkeypatch):
    from hpcstack import trust
    from hpcstack.errors import ConfigError

    monkeypatch.setattr(trust, "_MAX_FILES", 5)
    recipe_dir = tmp_path / "tiny"
    recipe_dir.mkdir()
    for i in range(5):
        (recipe_dir / f"f{i}").touch()
    trust.check_inputs([recipe_dir], trust.Policy(uid=os.geteuid()), recurse=(recipe_dir,))
    (recipe_dir / "f5").touch()
    with pytest.raises(ConfigError) as exc:
        trust.check_inputs([recipe_dir], trust.Policy(uid=os.geteuid()), recurse=(recipe_dir,))
    assert exc.value.lines() == [f"{recipe_dir}: holds more than 5 files; hpcstack checks every file of a recipe's "
                                 "directory: keep only what the recipe needs there, or pass --trust-writable"]


def test_files_of_the_admin_groups_members_are_trusted(as_root, tmp_path):
    from hpcstack import trust

    member = pwd.getpwnam("nobody")
    path = tmp_path / "recipe.py"
    path.touch()
    os.chown(path, member.pw_uid, -1)
    assert trust.path_problem(path, trust.Policy(uid=0)) == f"{path}: owned by nobody"
    assert trust.path_problem(path, trust.Policy(uid=0, admin_uids=frozenset({member.pw_uid}))) is None
