"""The GPU-architecture preflight of prebuilt wheels: the compatibility rule, the records beside
the locks (read from the real wheels), and what a site is told before anything is written."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from conftest import REPO, hpcstack, site_overlay
from hpcstack import data_root
from hpcstack.install import gpuarch
from hpcstack.install.gpuarch import WheelArchs, runs_on
from hpcstack.install.lockfile import Pin

pytestmark = pytest.mark.unit

#: The shipped records of the installed package (under scripts/run-tests the wheel's copy).
RECIPES = data_root() / "recipes" / "pytorch"


@pytest.mark.parametrize("cc, sass, ptx, ok", [
    (70, (70,), (), True),            # the same architecture
    (75, (70,), (), True),            # a newer minor of the same major runs older SASS
    (86, (80,), (), True),
    (70, (75,), (), False),           # never a newer minor
    (70, (60,), (), False),           # never across majors, older or newer
    (90, (80, 86), (), False),
    (100, (90,), (), False),
    (90, (), (80,), True),            # PTX is JIT-compiled for any newer capability
    (120, (75,), (75,), True),
    (70, (), (75,), False),           # but never for an older one
    (70, (75, 80, 86, 90, 100, 120), (), False),  # the torch 2.14.1 wheels on a V100
    (80, (75, 80, 86, 90, 100, 120), (), True),
])
def test_the_compatibility_rule(cc, sass, ptx, ok):
    assert runs_on(cc, sass, ptx) is ok


def test_a_wheel_runs_only_where_every_library_runs():
    # torch 2.3.1: libtorch_cuda_linalg.so has no sm_75, but a 7.5 GPU runs its sm_70
    rec = WheelArchs("w.whl", "0" * 64, "12.1", (50, 60, 70, 75, 80, 86, 90), (),
                     libraries=(("a.so", (50, 60, 70, 75, 80, 86, 90), ()), ("b.so", (50, 60, 70, 80, 86, 90), ())))
    assert rec.unsupported((70, 75, 80, 89, 90)) == []
    # torch 2.14.1: libtorch_cuda_linalg.so starts at sm_80, so a 7.5 GPU fails it
    rec = WheelArchs("w.whl", "0" * 64, "13.0", (75, 80, 86, 90, 100, 120), (),
                     libraries=(("a.so", (75, 80, 86, 90, 100, 120), ()), ("b.so", (80, 86, 90, 100, 120), ())))
    assert rec.unsupported((70, 75, 80, 90)) == [70, 75]
    seven, seven_five = rec.problems((70, 75))
    assert "b.so" not in seven
    assert "has SASS sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 and PTX none (b.so has only SASS sm_80 sm_86 " \
           "sm_90 sm_100 sm_120 and PTX none); a 7.5 GPU" in seven_five


def test_one_line_per_unsupported_capability_names_the_wheel_its_cuda_and_its_architectures():
    rec = WheelArchs("t-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "0" * 64, "13.0", (75, 80), (80,))
    lines = rec.problems((60, 70, 80), "t==1.0")
    assert len(lines) == 2
    assert lines[0].startswith("toolchain.cuda.cc_list: compute capability 6.0 is not supported by t==1.0: "
                               "t-1.0-cp312-cp312-manylinux_2_28_x86_64.whl (CUDA 13.0) has SASS sm_75 sm_80 "
                               "and PTX compute_80; ")
    assert "compute capability 7.0" in lines[1]


def test_a_record_survives_its_file(tmp_path):
    rec = WheelArchs("w-1-cp311-cp311-linux_x86_64.whl", "ab" * 32, None, (80,), (90,), ("sm_89",),
                     (("x.so", (80,), (90,)),), "cuobjdump 13.5.37")
    path = tmp_path / "r.gpu-archs.json"
    gpuarch.save_records(str(path), {rec.sha256: rec}, "w")
    assert gpuarch.load_records(str(path)) == {rec.sha256: rec}
    assert json.loads(path.read_text())["wheels"][rec.sha256]["libraries"] == {"x.so": {"sass": [80], "ptx": [90]}}
    assert gpuarch.load_records(str(tmp_path / "none.json")) == {}
    assert gpuarch.record_path("/r/2.3.1-gpu.pypi.lock") == "/r/2.3.1-gpu.pypi.gpu-archs.json"


def test_without_a_record_the_answer_is_a_note_not_a_pass():
    pin = Pin("torch", "2.3.1+cu121", hashes=("ff" * 32,), index="https://download.pytorch.org/whl/cu121")
    answer = gpuarch.check_pin(pin, {}, (70,), "3.12", "x.gpu-archs.json")
    assert answer.problems == [] and answer.checked == []
    assert answer.note.startswith("GPU architectures of torch==2.3.1+cu121 not recorded: "
                                  "x.gpu-archs.json records none of its wheels for Python 3.12")


def _records(name: str) -> dict:
    return gpuarch.load_records(str(RECIPES / f"{name}.gpu-archs.json"))


# The architectures measured from the real wheels (hpcstack lock --gpu-archs-from, cuobjdump).
ARCHS_231 = (50, 60, 70, 75, 80, 86, 90)
ARCHS_2141 = (75, 80, 86, 90, 100, 120)


def test_the_recorded_torch_2_3_1_wheels_run_on_every_shipped_gpu_site():
    records = _records("2.3.1-gpu.pypi")
    assert {r.file for r in records.values()} == {f"torch-2.3.1-cp{v}-cp{v}-manylinux1_x86_64.whl"
                                                  for v in (310, 311, 312)}
    for rec in records.values():
        assert (rec.cuda, rec.sass, rec.ptx) == ("12.1", ARCHS_231, ())
        assert rec.unsupported((70, 80)) == []


#: What ``hpcstack install pytorch/2.14.1-gpu --site cirrus --dry-run`` prints (stderr, exit 2),
#: the data directory of hpcstack as ``@HPCSTACK_DATA@``: written from the recipe with its
#: ``CudaWheelArchs`` component and this record.
CIRRUS_2141 = REPO / "tests" / "golden" / "cirrus-pytorch-2.14.1-gpu-preflight.txt"


def test_the_cirrus_answer_for_torch_2_14_1():
    """The golden answer for cirrus (V100, 7.0) and the torch 2.14.1 wheels of PyPI (CUDA 13.0):
    refused, one line; perlmutter and juwels-booster (A100, 8.0) fit. Read from the record, as
    the preflight reads it."""
    records = _records("2.14.1-gpu.pypi")
    assert {r.file for r in records.values()} == {f"torch-2.14.1-cp{v}-cp{v}-manylinux_2_28_x86_64.whl"
                                                  for v in (310, 311, 312)}
    for rec in records.values():
        assert (rec.cuda, rec.sass, rec.ptx) == ("13.0", ARCHS_2141, ())
        assert rec.unsupported((80,)) == []
    pin = Pin("torch", "2.14.1", hashes=tuple(records))
    answer = gpuarch.check_pin(pin, records, (70,), "3.12", "the record")
    assert [f"error: step wheels: {line} (@HPCSTACK_DATA@/site-configs/cirrus.yaml)" for line in answer.problems] \
        == CIRRUS_2141.read_text().splitlines()
    assert answer.problems == [
        "toolchain.cuda.cc_list: compute capability 7.0 is not supported by torch==2.14.1: "
        "torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl (CUDA 13.0) has SASS sm_75 sm_80 sm_86 sm_90 "
        "sm_100 sm_120 and PTX none; a 7.0 GPU needs SASS sm_7x (x <= 0) or PTX compute_XY (XY <= 70); "
        "use wheels built for it or drop 70 from cc_list"]


def _site(tmp_path, base: str, cc_list, python: str | None = None) -> str:
    data = yaml.safe_load((REPO / "site-configs" / f"{base}.yaml").read_text())
    data["name"] = f"{base}-cc"
    data["toolchain"]["cuda"]["cc_list"] = list(cc_list)
    if python:
        data["python"]["version"] = python
    path = tmp_path / f"{base}-cc.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_site_whose_gpus_the_wheel_cannot_run_is_refused_by_the_dry_run(tmp_path):
    site = _site(tmp_path, "perlmutter", [37, 80, 100])  # a K80, an A100, a B200
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert "compute capability 3.7 is not supported by torch==2.3.1" in lines[0]
    assert "compute capability 10.0 is not supported" in lines[1] and "CUDA 12.1" in lines[1]
    assert "compute capability 8.0" not in proc.stderr
    assert "has SASS sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90 and PTX none" in lines[0]
    assert all(line.startswith("error: step wheels: toolchain.cuda.cc_list: ") for line in lines)
    assert proc.stdout == ""


@pytest.mark.integration
def test_the_install_refuses_before_anything_is_written(localhost_ready, tmp_path):
    # the localhost site with the CUDA 12.4 toolkit of scripts/localhost-cuda-toolkit and a K80
    toolkit = "/opt/hpcstack/cuda-12.4"
    if not os.path.isfile(f"{toolkit}/bin/nvcc"):
        pytest.skip(f"no {toolkit}: run scripts/localhost-cuda-toolkit (localhost-setup --with-test-tools does)")
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["name"] = "k80"
    data["toolchain"]["cuda"] = {"home": toolkit, "version": "12.4", "cc_list": [37, 80]}
    site = tmp_path / "k80.yaml"
    site.write_text(yaml.safe_dump(data))
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 2, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if "is not supported by torch==2.3.1" in line]
    assert len(ours) == 1 and "compute capability 3.7" in ours[0], proc.stderr
    assert not (tmp_path / "sw").exists() and not (tmp_path / "mf").exists()


@pytest.mark.parametrize("site", ["perlmutter", "juwels-booster"])
def test_the_a100_sites_pass_and_print_the_sanity_probe(site):
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "GPU architectures" not in proc.stderr
    assert "torch._C._cuda_getArchFlags()" in proc.stdout


def test_a_lock_without_a_record_says_so_in_one_line_and_goes_on():
    # cirrus installs the +cu121 wheels of download.pytorch.org, not reachable where the record was made
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "GPU architectures" in x]
    assert line.startswith("note: GPU architectures of torch==2.3.1+cu121 not recorded: ")
    assert "an install reads them from the wheel before it writes anything" in line
    assert "torch._C._cuda_getArchFlags()" in proc.stdout


CU121 = "b3c586f4ab25e83efffccfb97079e91325329bc228166555c4bb93957753d4ea"  # torch 2.3.1+cu121, cp312


@pytest.mark.parametrize("sass, refused", [((50, 60, 70, 75, 80, 86, 90), False), ((75, 80), True)])
def test_what_an_install_read_from_a_wheel_is_kept_in_the_sites_cache(tmp_path, sass, refused):
    data = yaml.safe_load((REPO / "site-configs" / "cirrus.yaml").read_text())
    data["cache_dir"] = str(tmp_path / "cache")
    site = tmp_path / "cirrus-cached.yaml"
    site.write_text(yaml.safe_dump(data))
    rec = WheelArchs("torch-2.3.1+cu121-cp312-cp312-linux_x86_64.whl", CU121, "12.1", sass, ())
    gpuarch.save_records(str(tmp_path / "cache" / "gpu-archs.json"), {CU121: rec}, "torch")
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", str(site), "--dry-run")
    assert "not recorded" not in proc.stderr
    if refused:
        assert proc.returncode == 2
        assert "compute capability 7.0 is not supported by torch==2.3.1+cu121: " \
               "torch-2.3.1+cu121-cp312-cp312-linux_x86_64.whl (CUDA 12.1) has SASS sm_75 sm_80" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr


def test_a_site_without_cuda_gets_no_check(tmp_path):
    overlay = site_overlay(tmp_path / "sites", roots=tmp_path / "roots")  # no module loads
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "localhost", "--repo", str(overlay), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "GPU architectures" not in proc.stderr + proc.stdout


def test_the_sanity_check_verifies_what_the_installed_package_reports():
    from hpcstack.install.components.cudawheels import _verify_installed

    flags = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90\n"
    assert _verify_installed((70, 80), "torch", "12.1", flags) == []
    (line,) = _verify_installed((70, 80), "torch", "13.0", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\n")
    assert ("compute capability 7.0 is not supported by the installed torch: the installed torch "
            "(CUDA 13.0) has SASS sm_75") in line
    (line,) = _verify_installed((70,), "torch", None, "\n")
    assert "reported no GPU architectures" in line


def test_recording_gpu_architectures_needs_the_component():
    proc = hpcstack("lock", "mpi4py/4.1.2", "--site", "perlmutter", "--gpu-archs-from", "/nonexistent.whl")
    assert proc.returncode == 2, proc.stderr
    assert "has no CudaWheelArchs component" in proc.stderr


@pytest.mark.parametrize("metadata, cuda", [
    ("Name: torch\nVersion: 2.3.1+cu121\n", "12.1"),
    ("Name: torch\nVersion: 2.3.1\nRequires-Dist: nvidia-cuda-runtime-cu12 (==12.1.105) ; "
     'platform_system == "Linux" and platform_machine == "x86_64"\n', "12.1"),
    ("Name: torch\nVersion: 2.14.1\nRequires-Dist: cuda-toolkit[cublas,cudart]==13.0.3; "
     'platform_system == "Linux"\n', "13.0"),
    ("Name: torch\nVersion: 2.14.1\nRequires-Dist: numpy\n", None),
])
def test_the_cuda_version_a_wheel_states(metadata, cuda):
    names = ["torch/__init__.py", "torch-2.3.1.dist-info/METADATA"]
    assert gpuarch.cuda_of_wheel(names, lambda name: metadata.encode()) == cuda


@pytest.mark.parametrize("file, python, fits", [
    ("torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl", "3.11", True),
    ("torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl", "3.12", False),
    ("torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl", None, True),
    ("torch-2.3.1-cp311-none-macosx_11_0_arm64.whl", "3.11", False),
    ("torch-2.14.1-cp312-cp312-manylinux_2_28_aarch64.whl", "3.12", False),
    ("torch-2.3.1+cu121-cp312-cp312-linux_x86_64.whl", "3.12", True),
])
def test_which_wheel_of_a_pin_a_site_installs(file, python, fits):
    assert gpuarch.wheel_fits(file, python) is fits


# ------------------------------------------- the wheel of lock --gpu-archs-from (issue 45)

#: A cuobjdump that lists one sm_80 cubin for any library (the library is never read).
FAKE_CUOBJDUMP = ('#!/bin/sh\n[ "$1" = --version ] && { echo "Cuda compilation tools, V12.4.127"; exit 0; }\n'
                  'echo "ELF file    1: lib.1.sm_80.cubin"\n')
LIBS = ("torch/lib/libtorch_cuda*.so",)


def _fake_cuobjdump(tmp_path) -> str:
    tool = tmp_path / "cuobjdump"
    tool.write_text(FAKE_CUOBJDUMP)
    tool.chmod(0o755)
    return str(tool)


def _zip_wheel(path) -> bytes:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("torch-2.3.1.dist-info/METADATA", "Name: torch\nVersion: 2.3.1+cu121\n")
        z.writestr("torch/lib/libtorch_cuda.so", b"\x7fELF not read")
    return path.read_bytes()


def test_the_wheel_is_opened_once_through_the_gate(tmp_path):
    """The wheel of lock --gpu-archs-from: opened once (no link followed, O_NONBLOCK, a regular
    file by fstat), hashed and read as a zip from that descriptor. A FIFO in its place blocked
    the command (zipfile.ZipFile by name); a link, or a wheel in a directory others can write,
    is refused in one line."""
    import hashlib

    from blocking import returns_on_fifo
    from hpcstack import gate

    tool = _fake_cuobjdump(tmp_path)
    wheel = tmp_path / "torch-2.3.1-cp311-cp311-linux_x86_64.whl"
    data = _zip_wheel(wheel)
    rec = gpuarch.read_wheel(str(wheel), LIBS, tool)
    assert (rec.file, rec.cuda, rec.sass, rec.sha256) == (wheel.name, "12.1", (80,), hashlib.sha256(data).hexdigest())
    fifo = tmp_path / "fifo.whl"
    os.mkfifo(fifo)
    with pytest.raises(gate.GateError, match="not a regular file"):
        returns_on_fifo(lambda: gpuarch.read_wheel(str(fifo), LIBS, tool), fifo)
    open_ = tmp_path / "open"
    open_.mkdir()
    _zip_wheel(open_ / wheel.name)
    open_.chmod(0o777)
    with pytest.raises(gate.GateError, match=f"{open_}: writable by every user"):
        gpuarch.read_wheel(str(open_ / wheel.name), LIBS, tool)
    (open_ / "link.whl").symlink_to(wheel)      # where anyone could have put it: not followed
    with pytest.raises(gate.GateError, match=f"{open_ / 'link.whl'}: a symbolic link"):
        gpuarch.read_wheel(str(open_ / "link.whl"), LIBS, tool)
    (tmp_path / "mine.whl").symlink_to(wheel)   # this account's, in its own directory: followed
    assert gpuarch.read_wheel(str(tmp_path / "mine.whl"), LIBS, tool).sha256 == rec.sha256


def test_an_unpacked_wheel_is_read_by_descriptor(tmp_path):
    """A wheel unpacked into a directory: its files opened O_NOFOLLOW|O_NONBLOCK below the
    gate's descriptor; a FIFO for its METADATA blocked the read (open by name), a link for a
    library was read through."""
    from blocking import returns_on_fifo

    tool = _fake_cuobjdump(tmp_path)
    unpacked = tmp_path / "torch"
    (unpacked / "torch" / "lib").mkdir(parents=True)
    (unpacked / "torch-2.3.1.dist-info").mkdir()
    (unpacked / "torch-2.3.1.dist-info" / "METADATA").write_text("Name: torch\nVersion: 2.3.1+cu121\n")
    (unpacked / "torch" / "lib" / "libtorch_cuda.so").write_bytes(b"\x7fELF")
    rec = gpuarch.read_wheel(str(unpacked), LIBS, tool)
    assert (rec.sha256, rec.cuda, rec.sass) == ("", "12.1", (80,))
    assert rec.libraries == (("torch/lib/libtorch_cuda.so", (80,), ()),)
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    (unpacked / "torch" / "lib" / "libtorch_cuda_link.so").symlink_to(secret)
    with pytest.raises(gpuarch.HpcstackError, match="libtorch_cuda_link.so: a symbolic link"):
        gpuarch.read_wheel(str(unpacked), LIBS, tool)
    (unpacked / "torch" / "lib" / "libtorch_cuda_link.so").unlink()
    meta = unpacked / "torch-2.3.1.dist-info" / "METADATA"
    meta.unlink()
    os.mkfifo(meta)
    with pytest.raises(gpuarch.HpcstackError, match="METADATA: not a regular file"):
        returns_on_fifo(lambda: gpuarch.read_wheel(str(unpacked), LIBS, tool), meta)
