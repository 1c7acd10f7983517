"""The test run's own policy (tests/conftest.py), checked on tiny inner test files run by a real
pytest with this conftest: under ``CI=true`` a skip outside ``ALLOWED_SKIPS`` and every ``xfail``
fail, an allowed skip stays a skip; a test without a level, or a node with two, stops the
collection before anything runs; each allowed skip reason is one that a test uses."""

from __future__ import annotations

import configparser
import re
import shutil
import textwrap

import pytest

from conftest import ALLOWED_SKIPS, LEVELS, REPO

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.unit

CONFTEST = REPO / "tests" / "conftest.py"


@pytest.fixture
def inner(pytester, monkeypatch):
    """A pytester directory with this conftest and the checkout's pytest settings (markers,
    ``--strict-markers``); ``CI`` and ``HPCSTACK_UPDATE_GOLDEN`` cleared (each test sets CI)."""
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    settings = [f"{key} ={textwrap.indent(value, '    ')}\n" for key, value in cfg["tool:pytest"].items()
                if key in ("addopts", "markers")]
    pytester.makeini("[pytest]\n" + "".join(settings))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("HPCSTACK_UPDATE_GOLDEN", raising=False)
    return pytester


OUTCOMES = '''
import pytest

pytestmark = pytest.mark.unit

def test_passes():
    assert True

def test_skip_allowed():
    pytest.skip("needs a GPU: nvidia-smi -L lists none")

def test_skip_not_allowed():
    pytest.skip("fish is not installed")

@pytest.mark.skipif(True, reason="no tclsh on PATH")
def test_skipif_not_allowed():
    pass

@pytest.mark.xfail(reason="a known defect")
def test_xfail_marker_fails():
    assert False

@pytest.mark.xfail(reason="a known defect, fixed since")
def test_xfail_marker_passes():
    assert True

def test_xfail_call():
    pytest.xfail("not done yet")
'''


def _outcomes(result) -> dict[str, str]:
    """test name -> PASSED, FAILED, ERROR, SKIPPED, XFAIL or XPASS, from the ``-v`` lines of a run."""
    found = {}
    for line in result.outlines:
        m = re.match(r"\S*::(test_\w+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_under_ci_a_disallowed_skip_and_every_xfail_fail_an_allowed_skip_stays(inner, monkeypatch):
    inner.makepyfile(test_inner=OUTCOMES)
    monkeypatch.setenv("CI", "true")
    result = inner.runpytest_subprocess("-v", "-rA", "-p", "no:cacheprovider")
    assert _outcomes(result) == {
        "test_passes": "PASSED", "test_skip_allowed": "SKIPPED",
        "test_skip_not_allowed": "FAILED", "test_skipif_not_allowed": "ERROR",  # its setup skipped
        "test_xfail_marker_fails": "FAILED", "test_xfail_marker_passes": "FAILED",
        "test_xfail_call": "FAILED"}, result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # each failure says why: the first line of its section under FAILURES or ERRORS (pytest 8's
    # short summary leaves out a reason given as text)
    said = {m.group(1): m.group(2) for m in re.finditer(
        r"^_+ (?:ERROR at setup of )?(test_\w+) _+\n(.*)$", result.stdout.str(), re.M)}
    ci_skip = "skipped in CI, where nothing may skip but ('needs a GPU',) (tests/conftest.py ALLOWED_SKIPS): "
    ci_xfail = "xfail in CI, where an expected failure is a failure (tests/conftest.py): the test "
    assert said == {
        "test_skip_not_allowed": ci_skip + "fish is not installed",
        "test_skipif_not_allowed": ci_skip + "no tclsh on PATH",
        "test_xfail_marker_fails": ci_xfail + "failed; xfail reason: a known defect",
        "test_xfail_marker_passes": ci_xfail + "passed; xfail reason: a known defect, fixed since",
        "test_xfail_call": ci_xfail + "called pytest.xfail(); xfail reason: not done yet"}, result.stdout.str()


def test_outside_ci_skips_and_xfails_keep_their_outcome(inner):
    inner.makepyfile(test_inner=OUTCOMES)
    result = inner.runpytest_subprocess("-v", "-rA", "-p", "no:cacheprovider")
    assert _outcomes(result) == {
        "test_passes": "PASSED", "test_skip_allowed": "SKIPPED", "test_skip_not_allowed": "SKIPPED",
        "test_skipif_not_allowed": "SKIPPED", "test_xfail_marker_fails": "XFAIL",
        "test_xfail_marker_passes": "XPASS", "test_xfail_call": "XFAIL"}, result.stdout.str()
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize("source, named", [
    # two levels on the test itself: which one was meant is not guessed
    ("import pytest\n\n@pytest.mark.unit\n@pytest.mark.integration\ndef test_two():\n    pass\n"
     "\n@pytest.mark.unit\ndef test_one():\n    pass\n",
     "test_inner.py::test_two: integration, unit"),
    # two levels in the module's pytestmark
    ("import pytest\n\npytestmark = [pytest.mark.e2e, pytest.mark.unit]\n\ndef test_any():\n    pass\n",
     "test_inner.py: e2e, unit"),
    # two levels on one parameter's marks and the test
    ("import pytest\n\n@pytest.mark.unit\n@pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.e2e)])\n"
     "def test_p(x):\n    pass\n",
     "test_inner.py::test_p[2]: e2e, unit"),
], ids=["test", "module", "parameter"])
def test_two_levels_on_one_node_stop_the_collection(inner, source, named):
    inner.makepyfile(test_inner=source)
    inner.makepyfile(test_other="import pytest\n\n@pytest.mark.unit\ndef test_fine():\n    pass\n")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    err = result.stderr.str()
    assert f"carries two of the markers {', '.join(LEVELS)}" in err and f"  {named}" in err, err
    assert "test_fine" not in err and "passed" not in result.stdout.str()  # nothing ran


def test_the_closest_level_wins_and_selects(inner):
    inner.makepyfile(test_inner="import pytest\n\npytestmark = pytest.mark.unit\n\n"
                                "def test_module_level():\n    pass\n\n"
                                "@pytest.mark.integration\ndef test_own_level():\n    pass\n")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-m", "unit", "-v")
    assert _outcomes(result) == {"test_module_level": "PASSED"}, result.stdout.str()
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-m", "integration", "-v")
    assert _outcomes(result) == {"test_own_level": "PASSED"}, result.stdout.str()


def test_a_test_without_a_level_stops_the_collection(inner):
    inner.makepyfile(test_inner="def test_bare():\n    pass\n",
                     test_other="import pytest\n\n@pytest.mark.unit\ndef test_fine():\n    pass\n")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    err = result.stderr.str()
    assert f"each test needs one of the markers {', '.join(LEVELS)}" in err
    assert "  test_inner.py::test_bare" in err and "test_fine" not in err, err
    assert "passed" not in result.stdout.str()


def test_every_allowed_skip_reason_is_one_a_test_uses():
    """ALLOWED_SKIPS holds only reasons that tests give (in a skip of a test file besides the
    policy's own files): a reason no test uses would be a hole in the CI gate."""
    sources = {path.name: path.read_text() for path in (REPO / "tests").glob("test_*.py")
               if path.name != "test_conftest_policy.py"}
    assert ALLOWED_SKIPS
    for reason in ALLOWED_SKIPS:
        users = [name for name, text in sources.items()
                 if re.search(r"""(skip\(|reason=)f?["']""" + re.escape(reason), text)]
        assert users, f"no test skips with {reason!r}: remove it from ALLOWED_SKIPS"
