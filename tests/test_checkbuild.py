"""Parsing ``horovodrun --check-build`` and naming the flags that are missing."""

import pytest

from conftest import CHECK_BUILD_CPU as CPU_OUTPUT
from conftest import CHECK_BUILD_NCCL as CIRRUS_OUTPUT
from hpcstack.install.components.checkbuild import missing_flags, parse_check_build

pytestmark = pytest.mark.unit


def test_parse_sections():
    flags = parse_check_build(CIRRUS_OUTPUT)
    assert flags["Frameworks"] == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert flags["Controllers"] == {"MPI": True, "Gloo": True}
    assert flags["Operations"]["NCCL"] is True and flags["Operations"]["DDL"] is False


def test_cirrus_flags_all_present():
    assert missing_flags(parse_check_build(CIRRUS_OUTPUT), ["PyTorch", "MPI", "Gloo", "NCCL"]) == []


def test_missing_nccl_is_named():
    assert missing_flags(parse_check_build(CPU_OUTPUT), ["PyTorch", "MPI", "Gloo", "NCCL"]) == ["Operations:NCCL"]


def test_a_name_must_hold_in_every_section_that_lists_it():
    text = CIRRUS_OUTPUT.replace("Available Controllers:\n    [X] MPI", "Available Controllers:\n    [ ] MPI")
    assert missing_flags(parse_check_build(text), ["MPI"]) == ["Controllers:MPI"]
    assert missing_flags(parse_check_build(text), ["Operations:MPI"]) == []


def test_unknown_flag_is_missing():
    assert missing_flags(parse_check_build(CIRRUS_OUTPUT), ["Frameworks:JAX"]) == ["Frameworks:JAX"]


# ----------------------------------------------------------------------------- failing closed

import os  # noqa: E402
import stat  # noqa: E402

import pytest  # noqa: E402

from conftest import hpcstack  # noqa: E402
from hpcstack.install.components.checkbuild import CheckBuildParseError  # noqa: E402


@pytest.mark.parametrize("text, reason", [
    ("", "printed nothing"),
    ("   \n\n", "printed nothing"),
    ("usage: horovodrun [-h]\n", "line 1 does not parse: 'usage: horovodrun [-h]'"),
    (CIRRUS_OUTPUT.replace("Available Controllers:\n    [X] MPI\n    [X] Gloo\n", ""),
     "no 'Available Controllers:' section"),
    ("Horovod v0.28.1:\n", "no 'Available Frameworks:', 'Available Controllers:', "
                           "'Available Tensor Operations:' section"),
    ("    [X] PyTorch\n" + CIRRUS_OUTPUT, "line 1 '[X] PyTorch': a flag before any"),
    (CIRRUS_OUTPUT.replace("    [ ] MXNet", "    [?] MXNet"), "line 6 does not parse: '[?] MXNet'"),
    (CIRRUS_OUTPUT.replace("    [X] MPI\n    [X] Gloo\n\nAvailable Tensor", "\nAvailable Tensor"),
     "section Controllers lists no flags"),
    (CIRRUS_OUTPUT + "Traceback (most recent call last):\n", "does not parse: 'Traceback"),
])
def test_output_that_does_not_parse_is_a_one_line_failure(text, reason):
    with pytest.raises(CheckBuildParseError) as err:
        parse_check_build(text)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_real_output_with_trailing_spaces_and_an_extra_section_parses():
    text = CPU_OUTPUT.replace("[X] Gloo\n", "[X] Gloo    \n") + "\nAvailable Widgets:\n    [X] Foo\n"
    flags = parse_check_build(text)
    assert flags["Operations"]["Gloo"] is True and flags["Widgets"] == {"Foo": True}


def test_a_name_no_section_lists_is_missing():
    assert missing_flags(parse_check_build(CIRRUS_OUTPUT), ["PyTorch", "JAX"]) == ["JAX"]
    assert missing_flags({}, ["PyTorch"]) == ["PyTorch"]


def _fake_horovodrun(tmp_path, output: str, status: int = 0) -> str:
    path = tmp_path / "horovodrun"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {status}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("horovodrun, require, status, message", [
    ("/bin/true", "PyTorch", 1, "error: horovodrun --check-build printed nothing"),
    ("GARBAGE", "PyTorch", 1, "error: horovodrun --check-build: line 1 does not parse: 'not horovod'"),
    ("CPU", "PyTorch,NCCL", 1, "error: horovodrun --check-build: missing [X] Operations:NCCL"),
    ("CPU", "PyTorch,JAX", 1, "error: horovodrun --check-build: missing [X] JAX"),
    ("CPU", "PyTorch,MPI,Gloo", 0, ""),
])
def test_the_command_fails_closed(tmp_path, horovodrun, require, status, message):
    outputs = {"GARBAGE": "not horovod\n", "CPU": CPU_OUTPUT}
    if horovodrun in outputs:
        horovodrun = _fake_horovodrun(tmp_path, outputs[horovodrun])
    done = hpcstack("check-build", "--horovodrun", horovodrun, "--require", require,
                    env={"PATH": os.environ["PATH"]})
    assert done.returncode == status, done.stderr
    lines = done.stderr.strip().splitlines()
    if message:
        assert len(lines) == 1 and lines[0].startswith(message), lines
    else:
        assert lines == [] and "[X] PyTorch" in done.stdout
