"""Stage prefixes, publish, resume, clean-up and uninstall (hpcstack.install.layout), with plans of plain
file writes run by the real runner; and the runner's preflight and failure diagnosis."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcstack.install import layout, records
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install.actions import Publish, Run, WriteFile
from hpcstack.install.plan import Plan, Step
from hpcstack.install.runner import Runner, diagnose, full_filesystem, pending_steps, preflight

pytestmark = pytest.mark.unit


class Stack:
    """A stack ``t/1`` whose plan writes ``payload`` (build step) and a modulefile (module step)."""

    def __init__(self, root: Path):
        self.modulefile = str(root / "mf" / "t" / "1")
        self.layout = layout.StackLayout(str(root / "sw"), "t", "1", modulefile=self.modulefile)
        self.payload = "v1"
        self.module_text = "root PREFIX\n"

    def resolve_at(self, stage: str, build_id: str) -> Plan:
        where = stage or self.layout.prefix
        steps = [Step("build", "build", [WriteFile(os.path.join(where, "payload"), self.payload)]),
                 Step("module", "publish", [Publish(self.layout.prefix, where),
                                            WriteFile(self.modulefile, self.module_text)])]
        steps[-1].outputs += [self.modulefile, self.layout.prefix]
        return Plan("t/1 for site x", self.layout.prefix, [], [], steps, self.modulefile,
                    stage_prefix=stage, build_id=build_id)

    def install(self, force: bool = False, stop_after: str | None = None) -> layout.Choice:
        choice = layout.choose(self.layout, self.resolve_at, force)
        layout.start(self.layout, choice)
        record(choice.plan.build_prefix, self.layout.prefix, choice.plan.build_id, self.modulefile)
        Runner(choice.plan, dict(os.environ), stop_after=stop_after, force=force).run()
        if not pending_steps(choice.plan):
            layout.finish(self.layout, choice.plan)
        return choice

    def published_payload(self) -> str:
        return Path(self.layout.prefix, "payload").read_text()


def record(build: str, prefix: str, build_id: str, modulefile: str) -> None:
    """What an install records in its build (hpcstack.install.provenance.record_inputs), as much
    as uninstall reads: the stack's prefix, where the build is, its id, its modulefile."""
    state = Path(build, ".hpcstack")
    state.mkdir(parents=True, exist_ok=True)
    (state / "provenance.json").write_text(json.dumps(
        {"prefix": prefix, "stage_prefix": build, "build_id": build_id, "modulefile": modulefile}))


@pytest.fixture
def stack(tmp_path):
    return Stack(tmp_path)


def test_first_install_publishes_a_relative_link_to_a_new_build(stack):
    choice = stack.install()
    assert choice.kind == "new" and len(choice.plan.build_id) == 12
    link = os.readlink(stack.layout.prefix)
    assert link == f".1-{choice.plan.build_id}"  # beside the prefix, at its depth
    assert stack.published_payload() == "v1" and Path(stack.modulefile).is_file()
    assert layout.choose(stack.layout, stack.resolve_at).kind == "up to date"


def test_a_changed_build_goes_beside_and_the_one_before_it_is_kept(stack):
    first = stack.install().plan.build_id
    stack.payload = "v2"
    second = stack.install()
    assert second.kind == "new" and second.replaces == first and second.plan.build_id != first
    assert stack.published_payload() == "v2"
    assert stack.layout.builds() == sorted([first, second.plan.build_id])
    assert stack.layout.read_state() == {"building": None, "replaces": None, "previous": first,
                                        "published_for": None}   # a layout without a site
    stack.payload = "v3"
    third = stack.install().plan.build_id
    assert stack.layout.builds() == sorted([second.plan.build_id, third])  # the oldest is gone


def test_a_forced_rebuild_of_the_same_plan_gets_a_new_id(stack):
    first = stack.install().plan.build_id
    again = stack.install(force=True)
    assert again.plan.build_id == f"{first}-2"
    assert os.readlink(stack.layout.prefix).endswith(f"{first}-2")


def test_a_module_only_change_runs_in_place_on_the_published_build(stack):
    first = stack.install().plan.build_id
    stack.module_text = "root PREFIX\n# new template\n"
    choice = stack.install()
    assert choice.kind == "in place" and choice.pending == ["module"] and choice.plan.build_id == first
    assert "new template" in Path(stack.modulefile).read_text()
    assert stack.layout.builds() == [first]


def test_an_unfinished_build_is_resumed_and_publishes_nothing_until_done(stack):
    choice = stack.install(stop_after="build")
    assert not os.path.lexists(stack.layout.prefix) and not os.path.exists(stack.modulefile)
    assert stack.layout.read_state()["building"] == choice.plan.build_id
    stack.payload = "v1b"  # the plan changes while the build is unfinished: still that build
    again = layout.choose(stack.layout, stack.resolve_at)
    assert again.kind == "resume" and again.plan.build_id == choice.plan.build_id
    assert again.pending == ["build", "module"]
    stack.install()
    assert stack.published_payload() == "v1b"


def test_a_prefix_from_before_staging_is_adopted_then_moved_aside(stack):
    os.makedirs(stack.layout.prefix)
    Path(stack.layout.prefix, "payload").write_text("old")
    assert stack.layout.published() == stack.layout.prefix
    choice = stack.install()
    assert choice.kind == "new" and choice.replaces == layout.PRE_STAGING
    assert os.path.islink(stack.layout.prefix) and stack.published_payload() == "v1"
    assert Path(stack.layout.build_path(layout.PRE_STAGING), "payload").read_text() == "old"
    assert stack.layout.read_state()["previous"] == layout.PRE_STAGING


def test_publish_renders_the_same_switch_it_performs(tmp_path):
    target = tmp_path / "t" / ".1-abc"
    target.mkdir(parents=True)
    action = Publish(str(tmp_path / "t" / "1"), str(target))
    script = action.to_bash()
    assert "ln -sfn .1-abc " in script
    assert script.endswith(f"mv -T {tmp_path}/t/.1.publish-tmp {tmp_path}/t/1")
    import subprocess

    (tmp_path / "t" / "1").mkdir()  # the layout before staging: moved aside, then linked
    (tmp_path / "t" / "1" / "old").write_text("")
    assert subprocess.run(["bash", "-c", script]).returncode == 0
    assert os.readlink(tmp_path / "t" / "1") == ".1-abc"
    assert (tmp_path / "t" / ".1-pre-staging" / "old").is_file()
    assert layout.StackLayout(str(tmp_path), "t", "1").build_path(layout.PRE_STAGING) == str(tmp_path / "t" / ".1-pre-staging")
    assert subprocess.run(["bash", "-c", script]).returncode == 0  # again: only the link switches


# ----------------------------------------------------------------------------- uninstall

@pytest.mark.parametrize("name, text, is_default", [
    (".version", 'set ModulesVersion "1"\n', True),
    (".version", "#%Module\nset ModulesVersion {1}\n", True),
    (".version", 'set ModulesVersion "2"\n', False),
    (".modulerc", "#%Module\nmodule-version t/1 default\n", True),
    (".modulerc.lua", 'module_version("t/1", "default")\n', True),
    (".modulerc.lua", 'module_version("t/2", "default")\n', False),
])
def test_default_marker_files(tmp_path, name, text, is_default):
    (tmp_path / name).write_text(text)
    found = layout.default_marker(str(tmp_path), "t", "1")
    assert (found == str(tmp_path / name)) is is_default


def test_default_marker_link(tmp_path):
    os.symlink("1", tmp_path / "default")
    assert layout.default_marker(str(tmp_path), "t", "1") == str(tmp_path / "default")
    assert layout.default_marker(str(tmp_path), "t", "2") is None


def test_uninstall_removes_modulefile_link_builds_and_state_but_not_other_versions(stack, tmp_path):
    stack.install()
    other = Stack(tmp_path)
    other.modulefile = str(tmp_path / "mf" / "t" / "2")
    other.layout = layout.StackLayout(str(tmp_path / "sw"), "t", "2", modulefile=other.modulefile)
    other.install()
    removed = records.uninstall(stack.layout).removed
    assert removed[0] == stack.modulefile  # the modulefile goes first
    assert not os.path.lexists(stack.layout.prefix) and stack.layout.builds() == []
    assert not os.path.exists(stack.layout.state_file)
    assert Path(other.layout.prefix, "payload").read_text() == "v1" and Path(other.modulefile).is_file()
    assert sorted(os.listdir(other.layout.top)) == ["." + os.readlink(other.layout.prefix)[1:], "2"]


def _legacy_build(stack, build_id="0123456789ab", payload="legacy"):
    """A stack as hpcstack 0.2.0 left it: the build under .builds/<version>/<id>, the prefix a
    link to it, the state naming no build in progress."""
    build = Path(stack.layout.legacy_builds_dir, build_id)
    build.mkdir(parents=True)
    (build / "payload").write_text(payload)
    record(str(build), stack.layout.prefix, build_id, stack.modulefile)
    os.symlink(f".builds/{stack.layout.version}/{build_id}", stack.layout.prefix)
    stack.layout.write_state({"building": None, "replaces": None, "previous": None, "published_for": None})
    return build_id


def test_a_build_of_the_earlier_layout_is_found_replaced_kept_then_removed(stack):
    old = _legacy_build(stack)
    assert stack.layout.published() == stack.layout.build_path(old) and stack.layout.id_of(stack.layout.published()) == old
    assert stack.layout.builds() == [old]
    first = stack.install()
    assert first.kind == "new" and first.replaces == old
    assert os.readlink(stack.layout.prefix) == f".1-{first.plan.build_id}" and stack.published_payload() == "v1"
    assert stack.layout.read_state()["previous"] == old and Path(stack.layout.legacy_builds_dir, old).is_dir()
    stack.payload = "v2"
    stack.install()  # the old-layout build is now neither published nor previous: removed
    assert old not in stack.layout.builds() and not os.path.exists(os.path.join(stack.layout.legacy_builds_dir, old))


def test_uninstall_removes_builds_of_both_layouts(stack):
    _legacy_build(stack, "0123456789ab")
    stack.install()
    removed = records.uninstall(stack.layout).removed
    assert str(Path(stack.layout.legacy_builds_dir, "0123456789ab")) in removed
    assert not os.path.exists(stack.layout.top)  # nothing left of the stack, no empty directories


# --------------------------------------------------------------------- runner: preflight, diagnosis

def test_preflight_names_missing_commands_and_compilers(tmp_path):
    plan = Plan("x", str(tmp_path / "p"), ["python"], [], [
        Step("build", "b", [Run(("no-such-tool-xyz", "--help")),
                            Run((str(tmp_path / "p" / "venv" / "bin" / "python"), "-V"), env={"CC": "no-such-cc -m64"})]),
        Step("install", "i", [Run(("true",))])], str(tmp_path / "mf"))
    with pytest.raises(ConfigError) as err:
        preflight(plan, {"PATH": os.environ["PATH"]}, ["build", "install"], "site.yaml")
    lines = err.value.lines()
    assert len(lines) == 2
    assert lines[0].startswith("step build: command 'no-such-tool-xyz' not found")
    assert lines[1].startswith("step build: compiler CC=no-such-cc not found") and "site.yaml" in lines[1]
    preflight(plan, {"PATH": os.environ["PATH"]}, ["install"])  # only the steps that will run


def test_preflight_sees_the_commands_nested_in_a_cached_build(tmp_path):
    from hpcstack.install.components.source import CachedWheelBuild

    build = Run(("true",), env={"CXX": "no-such-cxx"})
    cached = CachedWheelBuild("x", str(tmp_path / "cache"), str(tmp_path / "dist"), build,
                              prepare=(Run(("no-such-patch-xyz", "-p1")),))
    plan = Plan("x", str(tmp_path / "p"), [], [], [Step("build", "b", [cached])], str(tmp_path / "mf"))
    with pytest.raises(ConfigError) as err:
        preflight(plan, {"PATH": os.environ["PATH"]}, ["build"])
    lines = err.value.lines()
    assert len(lines) == 2 and "command 'no-such-patch-xyz' not found" in lines[0]
    assert "compiler CXX=no-such-cxx not found" in lines[1]


PIP_LOG = """\
ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have tampered with them.
    six==1.16.0 from https://files.pythonhosted.org/packages/d9/5a/x/six-1.16.0-py2.py3-none-any.whl#sha256=8abb (from -r /r/1.0.pypi.lock (line 2)):
        Expected sha256 0000000000000000000000000000000000000000000000000000000000000000
             Got        8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
"""
UV_LOG = """\
error: Failed to download `six==1.16.0`
  cause: Hash mismatch for `six==1.16.0`

         Expected:
           sha256:0000000000000000000000000000000000000000000000000000000000000000

         Computed:
           sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
"""


@pytest.mark.parametrize("log", [PIP_LOG, UV_LOG], ids=["pip", "uv"])
def test_a_hash_mismatch_in_a_log_becomes_one_line_with_both_hashes(log):
    line = diagnose(log)
    assert line.startswith("sha256 mismatch for six")
    assert "expected " + "0" * 64 in line and "got 8abb2f1d" in line and "\n" not in line


@pytest.mark.integration
def test_network_failures_are_named():
    uv = "error: Failed to fetch: `https://pypi.org/simple/six/`\n  cause: error sending request for url\n  cause: Connection refused (os error 111)"
    pip = ("WARNING: Retrying ... NewConnectionError: Failed to establish a new connection: [Errno 111] Connection refused\n"
           "ERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)")
    for log in (uv, pip):
        assert diagnose(log).startswith("cannot download packages (")
    assert diagnose("some other failure") is None


def test_a_full_filesystem_is_named(tmp_path):
    assert full_filesystem([str(tmp_path / "not" / "yet")]) is None
    line = full_filesystem([str(tmp_path / "not" / "yet")], min_free=1 << 62)
    assert line.startswith(f"No space left on device: the filesystem of {tmp_path} is full")


def test_step_records_are_json_with_the_hash(stack):
    choice = stack.install()
    record = json.loads(Path(choice.plan.state_dir, "steps", "build.json").read_text())
    assert record["hash"] == choice.plan.step_hashes()["build"]


# ------------------------------------------------------------------------------- the site in the identity

@pytest.mark.integration
def test_another_sites_install_does_not_replace_the_published_stack(localhost_ready, tmp_path):
    """Two sites sharing one install root: the second is refused (exit 2, nothing changed) rather
    than replacing the first site's stack under its modulefile; --force does it."""
    import yaml

    from conftest import REPO, hpcstack, make_sdist, write_tiny_recipe

    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    sites = {}
    for name in ("sitea", "siteb"):
        data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
        data["name"] = name
        sites[name] = tmp_path / f"{name}.yaml"
        sites[name].write_text(yaml.safe_dump(data))
    common = ["--prefix", str(tmp_path / "sw"), "--module-root", str(tmp_path / "mf")]
    first = hpcstack("install", str(recipe), "--site", str(sites["sitea"]), *common)
    assert first.returncode == 0, first.stderr
    prefix = tmp_path / "sw" / "tiny" / "1.0"
    published = os.path.realpath(prefix)
    again = hpcstack("install", str(recipe), "--site", str(sites["sitea"]), *common)
    assert again.returncode == 0 and "up to date" in again.stdout + again.stderr
    other = hpcstack("install", str(recipe), "--site", str(sites["siteb"]), *common)
    assert other.returncode == 2, other.stderr
    (line,) = other.stderr.strip().splitlines()
    assert "is published for site 'sitea'" in line and "install_root of its own" in line
    assert os.path.realpath(prefix) == published
    forced = hpcstack("install", str(recipe), "--site", str(sites["siteb"]), *common, "--force")
    assert forced.returncode == 0, forced.stderr
    assert os.path.realpath(prefix) != published
    state = json.loads((tmp_path / "sw" / ".hpcstack" / "state" / "tiny-1.0.json").read_text())
    assert state["published_for"] == "siteb"


@pytest.mark.parametrize("where", ["the log", "logs/"])
def test_a_link_in_the_builds_state_directory_is_refused_never_written_through(stack, tmp_path, where):
    """Where the site's stack group may write the build, a member can put a link at a step's log
    (or at ``logs/`` itself) before the step runs: the runner refuses it (ELOOP, one line naming
    the step and the log) and the link's target keeps its content. Positive control: ``open``
    by name, as the runner once wrote the log, truncates the target."""
    from hpcstack.errors import HpcstackError

    choice = layout.choose(stack.layout, stack.resolve_at)
    layout.start(stack.layout, choice)
    record(choice.plan.build_prefix, stack.layout.prefix, choice.plan.build_id, stack.modulefile)
    state = Path(choice.plan.state_dir)
    (state / "steps").mkdir(parents=True, exist_ok=True)
    target = tmp_path / "precious"
    target.write_text("keep\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if where == "the log":
        (state / "logs").mkdir(exist_ok=True)
        (state / "logs" / "build.log").symlink_to(target)
    else:
        (elsewhere / "build.log").symlink_to(target)
        (state / "logs").symlink_to(elsewhere)
    with pytest.raises(HpcstackError) as exc:
        Runner(choice.plan, dict(os.environ)).run()
    assert "build" in str(exc.value) and "log" in str(exc.value)
    assert target.read_text() == "keep\n"
    with open(state / "logs" / "build.log", "w"):      # the control: by name, through the link
        pass
    assert target.read_text() == ""


@pytest.mark.unit
def test_installed_reads_no_fifo_at_the_provenance_record(tmp_path):
    """``InstallService.installed`` reads the published build's ``provenance.json`` through the
    gate: a FIFO put there (the build is the stack group's to write) is refused in one line at
    once, not opened by name (which blocked root for ever)."""
    import signal
    from types import SimpleNamespace

    from hpcstack.install.service import InstallService

    lay = layout.StackLayout(str(tmp_path / "sw"), "tiny", "1.0")
    build = os.path.join(lay.top, ".1.0-0123456789ab")
    os.makedirs(os.path.join(build, ".hpcstack"))
    os.symlink(".1.0-0123456789ab", lay.prefix)
    modulefile = tmp_path / "modules" / "tiny" / "1.0"
    modulefile.parent.mkdir(parents=True)
    modulefile.write_text("#%Module\n")
    os.mkfifo(os.path.join(lay.provenance_dir(build), "provenance.json"))
    service = object.__new__(InstallService)
    service.layout, service.modulefile, service.trust = lay, str(modulefile), None
    service.site, service.recipe = SimpleNamespace(raw={}, ref="s", name="s"), SimpleNamespace(ref="tiny/1.0")
    service.name, service.version = "tiny", "1.0"
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("blocked on the FIFO"))
    signal.alarm(5)
    try:
        with pytest.raises(HpcstackError) as info:
            service.installed()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "provenance.json: not a regular file" in str(info.value) and "\n" not in str(info.value)
