"""Parsing ``horovodrun --check-build`` and naming the flags that are missing."""

from conftest import CHECK_BUILD_CPU as CPU_OUTPUT
from conftest import CHECK_BUILD_NCCL as CIRRUS_OUTPUT
from hpcstack.validate.checkbuild import missing_flags, parse_check_build


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
