"""The last line of ``hpcstack validate --local``: FAIL names the exit status once (it read
``FAIL: exit status 1: exit status 1; …`` where the judge's reasons begin with it too)."""

import pytest

from hpcstack.validate.render import print_local_verdict

pytestmark = pytest.mark.unit


def test_fail_names_the_exit_status_once(capsys):
    print_local_verdict(False, ["exit status 1", "solution differs from spsolve"], 1, "a\nb\n")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "FAIL: exit status 1: solution differs from spsolve"
    assert err[1:] == ["  | a", "  | b"]


def test_fail_with_the_exit_status_alone_and_a_reason_of_another_status(capsys):
    print_local_verdict(False, ["exit status 1"], 1, "x")
    assert capsys.readouterr().err.splitlines()[0] == "FAIL: exit status 1"
    print_local_verdict(False, ["no result record"], 0, "x")
    assert capsys.readouterr().err.splitlines()[0] == "FAIL: exit status 0: no result record"


def test_pass(capsys):
    print_local_verdict(True, [], 0, "")
    assert capsys.readouterr().out == "PASS\n"
