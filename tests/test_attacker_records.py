"""An ordinary user of the login node against what root removes, reads back and writes down:
``uninstall``, ``install --from BUNDLE``, ``show`` and the secrets of a site config.

Each test: the user ``rtuser`` (tests/attacker.py) prepares the attack with files of their own
(links, directories, records, a bundle, a provenance record), then root runs the real
``hpcstack`` command as an admin would; the victim (a file of root's) survives and nothing of
it is shown, and where hpcstack refuses, the refusal is one ``error:`` line with exit status 2
(:meth:`attacker.Attacker.assert_refused`).

Two layers stand between the user and root's files, and each attack is shown to fail against
each on its own (:func:`refused_by_both_layers`): first the trust rule (:mod:`hpcstack.session`,
:mod:`hpcstack.trust`) refuses an input or directory another user can change, in one line
naming whose it is and ``--trust-writable``; then, run again with ``--trust-writable`` (the
admin turned the first layer off), the records of uninstall (:mod:`hpcstack.install.records`)
or the bundle's own checks (:mod:`hpcstack.lifecycle.bundle`) still refuse it in a line of their
own. Where a scenario only makes sense in root's own directories (a bundle root copied with a
damaged manifest, a build without records in root's install root), the first layer passes it
and the second is shown to refuse it alone.

The attacks (12):

1. uninstall with ``--prefix`` in the user's directory, holding ``tiny -> root's directory``;
2. uninstall in a world-writable sticky install root (as ``/tmp``) holding the user's link ``tiny``;
3. uninstall where the user made the directory ``<prefix>/tiny/1.0`` (no record of hpcstack's;
   and a directory without records in root's own install root);
4. uninstall where the user forged a build with a record that claims the stack (in a sticky
   install root, and in a sticky stack directory of root's);
5. uninstall with a state file the user planted that names a path of root's;
6. uninstall through the user's link to root's real install root, in the user's home and in a
   sticky directory of root's (root's stack survives);
7. ``install --from`` a bundle whose manifest names ``../../../../<root's file>``;
8. ``install --from`` a bundle whose manifest has the wrong types (the user's bundle, and
   root's bundle with a damaged manifest);
9. ``install --from`` a bundle holding a link to root's file (the user's bundle, and root's);
10. ``show`` of the user's directory whose provenance record holds terminal escape sequences
    and the wrong types;
11. ``show --file`` of a log that is the user's link to root's file;
12. the site's secret in a build that prints it: the user reads every file root's install left
    in the (world-readable) install root and gets no secret.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from attacker import attacker  # noqa: F401
from conftest import hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration

VICTIM_TEXT = "root's own file: must survive and never be shown\n"
#: The option that turns the first layer (the trust rule of hpcstack.session) off.
TRUST_WRITABLE = "--trust-writable"


def victim(a, name: str = "victim") -> Path:
    """A directory of root's holding ``1.0/precious`` (root-only), the thing to keep."""
    path = a.shared / name / "1.0" / "precious"
    path.parent.mkdir(parents=True)
    path.write_text(VICTIM_TEXT)
    path.chmod(0o600)
    return path


def one_line(a, proc, *words: str) -> str:
    """The command refused in exactly one ``error:`` line naming ``words``
    (:meth:`attacker.Attacker.assert_refused`); that line."""
    a.assert_refused(proc, *words)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def refused_by_both_layers(a, command, first: tuple, second: tuple) -> None:
    """Both defences hold, each on its own.

    ``command(*extra)`` runs root's hpcstack command. Run as an admin would, the trust rule
    (:mod:`hpcstack.trust`, the first layer) refuses it in one line naming ``first`` and the
    way out; run with ``--trust-writable`` (the admin turned the first layer off), the second
    layer (the records of uninstall, the bundle's checks) still refuses it, in one line of its own
    naming ``second``.
    """
    line = one_line(a, command(), *first)
    assert TRUST_WRITABLE in line, line
    line = one_line(a, command(TRUST_WRITABLE), *second)
    assert TRUST_WRITABLE not in line, f"the first layer still answered: {line}"


def uninstall(*args: str):
    return hpcstack("uninstall", "tiny/1.0", "--site", "localhost", *args, "--force")


def sticky_root(a) -> Path:
    """A root-owned install root that every user may write to, with the sticky bit (as ``/tmp``)."""
    path = a.shared / "sw"
    path.mkdir()
    path.chmod(0o1777)
    return path


def test_uninstall_with_a_prefix_the_user_owns_follows_no_link(attacker):
    target = victim(attacker)
    sw = attacker.mkdir(attacker.home / "sw")
    attacker.run("ln", "-s", str(target.parent.parent), str(sw / "tiny"))
    refused_by_both_layers(
        attacker, lambda *extra: uninstall("--prefix", str(sw), "--module-root", str(attacker.shared / "mf"), *extra),
        first=(f"{sw}: owned by rtuser",), second=(f"{attacker.home} is owned by rtuser", "removes nothing"))
    assert target.read_text() == VICTIM_TEXT and os.path.islink(sw / "tiny")


def test_uninstall_in_a_sticky_root_refuses_the_users_link(attacker):
    target = victim(attacker)
    sw = sticky_root(attacker)
    attacker.run("ln", "-s", str(target.parent.parent), str(sw / "tiny"))
    refused_by_both_layers(
        attacker, lambda *extra: uninstall("--prefix", str(sw), "--module-root", str(attacker.shared / "mf"), *extra),
        first=(f"install root {sw}: writable by every user",),
        second=(f"{sw / 'tiny'} is a symbolic link", "follows no link"))
    assert target.read_text() == VICTIM_TEXT and os.path.islink(sw / "tiny")


def test_uninstall_leaves_the_users_unrecorded_directory(attacker):
    sw = sticky_root(attacker)
    attacker.run("mkdir", "-p", str(sw / "tiny" / "1.0"))
    attacker.run("sh", "-c", f"echo mine > {sw / 'tiny' / '1.0' / 'data'}")
    refused_by_both_layers(
        attacker, lambda *extra: uninstall("--prefix", str(sw), "--module-root", str(attacker.shared / "mf"), *extra),
        first=(f"install root {sw}: writable by every user",),
        second=(f"{sw / 'tiny'} is owned by rtuser",))
    assert (sw / "tiny" / "1.0" / "data").read_text() == "mine\n"


def test_uninstall_of_an_unrecorded_directory_in_roots_own_root_removes_nothing(attacker):
    """Root's own install root (0755) where a build without records lies (a copy, a leftover,
    made by root): the first layer has nothing to refuse; the records still do."""
    sw = attacker.shared / "sw"
    (sw / "tiny" / "1.0").mkdir(parents=True)
    (sw / "tiny" / "1.0" / "data").write_text("kept\n")
    proc = uninstall("--prefix", str(sw), "--module-root", str(attacker.shared / "mf"))
    line = one_line(attacker, proc, f"{sw / 'tiny' / '1.0'} holds no record of hpcstack's")
    assert TRUST_WRITABLE not in line
    assert (sw / "tiny" / "1.0" / "data").read_text() == "kept\n"


def test_uninstall_refuses_a_build_the_user_forged_with_a_record(attacker):
    """A build beside the prefix with a record naming the stack, the prefix a link to it, the
    record naming root's directory as the modulefile and stage dir: the user's, so refused."""
    target = victim(attacker)
    sw = sticky_root(attacker)
    build = sw / "tiny" / ".1.0-0123456789ab"
    record = {"prefix": str(sw / "tiny" / "1.0"), "stage_prefix": str(build), "build_id": "0123456789ab",
              "modulefile": str(target)}
    attacker.run("mkdir", "-p", str(build / ".hpcstack"))
    attacker.run("sh", "-c", f"printf '%s' '{json.dumps(record)}' > {build / '.hpcstack' / 'provenance.json'}")
    attacker.run("ln", "-s", str(target.parent), str(sw / "tiny" / "1.0"))
    refused_by_both_layers(
        attacker,
        lambda *extra: uninstall("--prefix", str(sw), "--module-root", str(target.parent.parent.parent), *extra),
        first=(f"install root {sw}: writable by every user",),
        second=(f"{sw / 'tiny'} is owned by rtuser",))
    assert target.read_text() == VICTIM_TEXT
    assert (build / ".hpcstack" / "provenance.json").is_file() and os.path.islink(sw / "tiny" / "1.0")


def test_uninstall_refuses_a_build_the_user_forged_in_roots_stack_directory(attacker):
    """As above, but the stack's directory ``sw/tiny`` is root's and sticky: the user's forged
    build in it (record and all) is still not root's, and refused as such."""
    target = victim(attacker)
    sw = attacker.shared / "sw"
    top = sw / "tiny"
    top.mkdir(parents=True)
    top.chmod(0o1777)
    build = top / ".1.0-0123456789ab"
    record = {"prefix": str(top / "1.0"), "stage_prefix": str(build), "build_id": "0123456789ab",
              "modulefile": str(target)}
    attacker.run("mkdir", "-p", str(build / ".hpcstack"))
    attacker.run("sh", "-c", f"printf '%s' '{json.dumps(record)}' > {build / '.hpcstack' / 'provenance.json'}")
    refused_by_both_layers(
        attacker,
        lambda *extra: uninstall("--prefix", str(sw), "--module-root", str(target.parent.parent.parent), *extra),
        first=(f"install root {top}: writable by every user",),
        second=(f"{build} is owned by rtuser",))
    assert target.read_text() == VICTIM_TEXT and (build / ".hpcstack" / "provenance.json").is_file()


def test_uninstall_refuses_a_state_file_the_user_planted(attacker):
    """hpcstack's state directory of the install root, writable by all (sticky): the user's
    state file names a path of root's as the build in progress."""
    target = victim(attacker)
    sw = attacker.shared / "sw"
    state = sw / ".hpcstack" / "state"
    state.mkdir(parents=True)
    state.chmod(0o1777)
    (sw / "tiny").mkdir()
    os.symlink(os.path.relpath(target.parent, sw / "tiny"), sw / "tiny" / "1.0")  # dangling for the record
    attacker.run("sh", "-c", "printf '%s' '" + json.dumps(
        {"building": f"../../{target.parent.parent.name}", "replaces": None, "previous": None,
         "published_for": "localhost"}) + f"' > {state / 'tiny-1.0.json'}")
    refused_by_both_layers(
        attacker, lambda *extra: uninstall("--prefix", str(sw), "--module-root", str(attacker.shared / "mf"), *extra),
        first=(f"install root {state}: writable by every user",),
        second=(str(state / "tiny-1.0.json"), "owned by rtuser"))
    assert target.read_text() == VICTIM_TEXT and (state / "tiny-1.0.json").is_file()


@pytest.fixture
def roots_stack(attacker, localhost_ready):
    """The tiny stack, installed by root under ``shared/sw`` with its modules in ``shared/mf``."""
    recipe = write_tiny_recipe(attacker.shared / "recipes", make_sdist(attacker.shared / "src"))
    args = ["--site", "localhost", "--prefix", str(attacker.shared / "sw"),
            "--module-root", str(attacker.shared / "mf")]
    proc = hpcstack("install", str(recipe), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return recipe, args


def test_uninstall_through_the_users_link_to_roots_install_root_is_refused(attacker, roots_stack):
    """The user hands the admin a path of theirs (``~rtuser/sw -> root's install root``, or the
    same link in a sticky directory of root's such as ``/var/tmp``): root's uninstall through it
    refuses, and root's stack stays whole and loadable."""
    sw = attacker.shared / "sw"
    drop = attacker.shared / "drop"
    drop.mkdir()
    drop.chmod(0o1777)
    build = Path(os.path.realpath(sw / "tiny" / "1.0"))
    for link, second in ((attacker.home / "sw", f"{attacker.home} is owned by rtuser"),
                         (drop / "sw", f"{drop / 'sw'} is a symbolic link owned by rtuser")):
        attacker.run("ln", "-s", str(sw), str(link))
        refused_by_both_layers(
            attacker,
            lambda *extra: uninstall("--prefix", str(link), "--module-root", str(attacker.shared / "mf"), *extra),
            first=(f"{link}: owned by rtuser",), second=(second, "removes nothing"))
        assert (build / "venv" / "bin" / "python").exists() and (attacker.shared / "mf" / "tiny" / "1.0").is_file()
        assert os.path.islink(sw / "tiny" / "1.0")


# ------------------------------------------------------------------------------------- bundles

def bundle_of(a, files: object, owner: str = "user", **extra) -> Path:
    """A bundle directory with ``manifest.json`` listing ``files``: the user's (in their home), or
    root's (``owner="root"``: a bundle root made or copied, in root's scratch directory)."""
    manifest = {"format": "hpcstack bundle 1", "recipe": "tiny/1.0", "site": "localhost", "files": files, **extra}
    if owner == "root":
        bundle = a.shared / "bundle"
        bundle.mkdir()
        (bundle / "manifest.json").write_text(json.dumps(manifest))
        return bundle
    bundle = a.mkdir(a.home / "bundle")
    a.write(bundle / "manifest.json", json.dumps(manifest))
    return bundle


def install_from(a, bundle: Path, *extra: str):
    recipes = a.shared / "recipes"
    recipe = (recipes / "tiny" / "1.0.py" if (recipes / "tiny" / "1.0.py").is_file()
              else write_tiny_recipe(recipes, make_sdist(a.shared / "src")))
    return hpcstack("install", str(recipe), "--site", "localhost", "--prefix", str(a.shared / "sw"),
                    "--module-root", str(a.shared / "mf"), "--from", str(bundle), "--dry-run", *extra)


def test_a_bundle_naming_a_path_out_of_it_is_refused_before_anything_is_read(attacker):
    target = victim(attacker)
    bundle = attacker.home / "bundle"
    escape = os.path.relpath(target, bundle)
    bundle = bundle_of(attacker, {escape: {"sha256": "0" * 64, "size": 1}})
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    shown = []

    def command(*extra):
        proc = install_from(attacker, bundle, *extra)
        shown.append(proc.stdout + proc.stderr)
        return proc

    refused_by_both_layers(attacker, command, first=(f"{bundle}: owned by rtuser",),
                           second=("manifest.json", "not a path inside the bundle"))
    assert all(digest not in out and VICTIM_TEXT.strip() not in out for out in shown)
    assert not (attacker.shared / "sw").exists()


#: Manifests of the wrong shape, and a word of the line that names the problem.
WRONG_SHAPES = [
    ([1], {}, "files"),
    ({"wheels/a.whl": 1}, {}, "files.wheels/a.whl"),
    ({"wheels/a.whl": {"sha256": "0" * 64, "size": "big"}}, {}, "size"),
    ({}, {"lock": "recipe/1.0.pypi.lock"}, "lock"),
    ({}, {"format": "something else"}, "format"),
]


@pytest.mark.parametrize("files, extra, words", WRONG_SHAPES)
def test_a_bundle_manifest_of_the_wrong_shape_is_one_line(attacker, files, extra, words):
    """The user's bundle: refused as theirs; with ``--trust-writable``, its manifest is still
    checked before anything in it is read."""
    bundle = bundle_of(attacker, files, **extra)
    refused_by_both_layers(attacker, lambda *opt: install_from(attacker, bundle, *opt),
                           first=(f"{bundle}: owned by rtuser",), second=("manifest.json", words))


@pytest.mark.parametrize("files, extra, words", WRONG_SHAPES)
def test_a_corrupted_manifest_in_roots_bundle_is_one_line(attacker, files, extra, words):
    """Root's own bundle (the first layer passes it) with a damaged manifest: one line, not an
    internal error."""
    bundle = bundle_of(attacker, files, owner="root", **extra)
    line = one_line(attacker, install_from(attacker, bundle), "manifest.json", words)
    assert TRUST_WRITABLE not in line


def test_a_bundle_holding_a_link_to_roots_file_is_refused(attacker):
    target = victim(attacker)
    bundle = bundle_of(attacker, {"wheels/six-1.16.0-py2.py3-none-any.whl": {"sha256": "0" * 64, "size": 1}})
    attacker.mkdir(bundle / "wheels")
    attacker.run("ln", "-s", str(target), str(bundle / "wheels" / "six-1.16.0-py2.py3-none-any.whl"))
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    shown = []

    def command(*extra):
        proc = install_from(attacker, bundle, *extra)
        shown.append(proc.stdout + proc.stderr)
        return proc

    refused_by_both_layers(attacker, command, first=(f"{bundle}: owned by rtuser",),
                           second=("wheels/six-1.16.0-py2.py3-none-any.whl is a symbolic link",))
    assert all(digest not in out and VICTIM_TEXT.strip() not in out for out in shown)
    assert not (attacker.shared / "sw").exists()


def test_a_link_to_roots_file_in_roots_bundle_is_refused(attacker):
    """Root's bundle (the first layer passes it) holding a link out of it (left by a careless
    copy): the bundle's own check still reads nothing through it."""
    target = victim(attacker)
    bundle = bundle_of(attacker, {"wheels/six-1.16.0-py2.py3-none-any.whl": {"sha256": "0" * 64, "size": 1}},
                       owner="root")
    (bundle / "wheels").mkdir()
    os.symlink(target, bundle / "wheels" / "six-1.16.0-py2.py3-none-any.whl")
    proc = install_from(attacker, bundle)
    line = one_line(attacker, proc, "wheels/six-1.16.0-py2.py3-none-any.whl is a symbolic link")
    assert TRUST_WRITABLE not in line
    assert hashlib.sha256(target.read_bytes()).hexdigest() not in proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------- show

def users_stack_dir(a) -> Path:
    """A directory of the user's that looks like a build: ``.hpcstack/`` with records."""
    state = a.mkdir(a.home / "stack" / ".hpcstack")
    a.mkdir(state / "logs")
    a.mkdir(state / "steps")
    return state


def test_show_prints_no_control_character_of_a_users_record(attacker):
    state = users_stack_dir(attacker)
    attacker.write(state / "provenance.json", json.dumps({
        "title": "tiny/1.0\x1b]2;owned\x07\x1b[2J", "command": ["hpcstack", "x\rclean", 3],
        "recipe": "not a mapping", "site": ["nor", "this"], "modulefile": "\u2028mf\x9b31m"}))
    attacker.write(state / "steps" / "build.json", json.dumps(["not", "a", "record"]))
    attacker.write(state / "pip-freeze.txt", "six==1.16.0\n\x1b[31mred\x1b[0m\tnext\n")
    proc = hpcstack("show", str(attacker.home / "stack"))
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2), proc.stderr     # shown escaped, or refused as the user's
    for out in (proc.stdout, proc.stderr):
        assert not any(c in out for c in "\x1b\x07\r\x9b\u2028"), repr(out)
    if proc.returncode == 0:
        assert "\\x1b]2;owned\\x07" in proc.stdout and "six==1.16.0\n\\x1b[31mred\\x1b[0m\tnext" in proc.stdout
    else:
        attacker.assert_refused(proc)


def test_show_file_does_not_follow_the_users_link_to_roots_file(attacker):
    target = victim(attacker)
    state = users_stack_dir(attacker)
    attacker.write(state / "provenance.json", json.dumps({"title": "tiny/1.0"}))
    attacker.run("ln", "-s", str(target), str(state / "logs" / "build.log"))
    proc = hpcstack("show", str(attacker.home / "stack"), "--file", "logs/build.log")
    assert VICTIM_TEXT.strip() not in proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    listing = hpcstack("show", str(attacker.home / "stack"))
    assert "logs/build.log" not in listing.stdout and VICTIM_TEXT.strip() not in listing.stdout


# ------------------------------------------------------------------------------------- secrets

def test_the_user_finds_no_secret_in_what_roots_failed_install_left(attacker, localhost_ready):
    """Root installs with the site's secrets (a variable and a root-only file) into an install
    root every user can read; the build prints them and fails. The user reads every file there
    (logs, records, plan, caches) and root's error line: the marker, never the value."""
    from test_secrets import ENV_VALUE, FILE_VALUE
    from test_secrets_install import failing_install

    token = attacker.shared / "token"
    token.write_text(FILE_VALUE + "\n")
    token.chmod(0o600)
    work = attacker.shared / "work"
    work.mkdir()
    proc, logs = failing_install(work, token)
    assert proc.returncode == 1 and logs, proc.stderr
    assert ENV_VALUE not in proc.stderr + proc.stdout and FILE_VALUE not in proc.stderr + proc.stdout
    readable = attacker.run("sh", "-c", f"find {work} -type f -readable | wc -l").stdout.strip()
    assert int(readable) > 5      # the user does read the logs and records
    for value in (ENV_VALUE, FILE_VALUE):
        found = attacker.run("grep", "-rlF", value, str(work), check=False)  # 2: root's private dirs too
        assert found.returncode in (1, 2) and found.stdout == "", found.stdout
    assert attacker.run("cat", str(token), check=False).returncode != 0
