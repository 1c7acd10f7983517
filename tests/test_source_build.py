"""The generic source build (hpcstack.install.components.source): the site toolchain's compilers
in the build environment, and a build key that changes with everything that changes the binary
(the MPI behind the wrapper, the compilers, the build settings) and with nothing else.

The compilers and MPI wrappers here are small shell scripts standing in for the site's: the key
runs them as it runs the real ones (``--version``, ``-showme``, ``-show``)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from hpcstack.install.components import Patch, SourceBuild
from hpcstack.install.components.base import PlanContext
from hpcstack.install.components.source import KEY_FORMAT, CachedWheelBuild
from hpcstack.install.plan import BUILD
from hpcstack.recipe import Recipe
from hpcstack.site import load_site

pytestmark = pytest.mark.unit

SHA = "0" * 64


def tool(path: Path, body: str) -> str:
    """An executable shell script at ``path``; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def openmpi_wrapper(path: Path, version: str = "4.1.4", under: str = "gcc") -> str:
    """An Open MPI style ``mpicc``: ``-showme``, ``-showme:version``, ``--version``."""
    return tool(path, f"""\
        case "$1" in
          -showme) echo "{under} -I/usr/lib/openmpi/include -lmpi" ;;
          -showme:version) echo "mpicc: Open MPI {version} (Language: C)" ;;
          --version) echo "{under} (Debian 12.2.0-14) 12.2.0" ;;
          *) exit 1 ;;
        esac
        """)


def mpich_wrapper(path: Path, version: str = "4.0.3") -> str:
    """An MPICH style ``mpicc``: ``-show`` and ``-v``, no ``-showme``."""
    return tool(path, f"""\
        case "$1" in
          -show) echo "gcc -I/usr/include/mpich -lmpich" ;;
          -v) echo "mpicc for MPICH version {version}"; echo "gcc version 12.2.0" >&2 ;;
          --version) echo "gcc (Debian 12.2.0-14) 12.2.0" ;;
          *) echo "unknown option $1" >&2; exit 1 ;;
        esac
        """)


def site_with(tmp_path: Path, name: str = "s", build_env: dict | None = None, **toolchain):
    """The localhost site with the given toolchain entries (and ``build.env``)."""
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["toolchain"].update(toolchain)
    if build_env:
        data.setdefault("build", {})["env"] = build_env
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_site(str(path))


def context(tmp_path: Path, site) -> PlanContext:
    recipe = Recipe("tiny", "1.0", "a tiny stack", directory=tmp_path)
    return PlanContext(site, recipe, prefix=str(tmp_path / "sw"), stage_dir=str(tmp_path / "stage"),
                       cache_dir=str(tmp_path / "cache"), python_version="3.11", jobs=2,
                       modulefile=str(tmp_path / "mf"))


def build_action(tmp_path: Path, site, component: SourceBuild | None = None) -> CachedWheelBuild:
    component = component or SourceBuild("tinypkg", "1.0", "file:///x/tinypkg-1.0.tar.gz", SHA,
                                         patches=(Patch("tiny.patch", SHA),))
    steps = component.contribute(context(tmp_path, site))
    return next(a for a in steps[BUILD] if isinstance(a, CachedWheelBuild))


def key(action: CachedWheelBuild) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CFLAGS", "MPICC", "CC", "CXX"))}
    return CachedWheelBuild.key_of(action.key_text(env))


def test_the_toolchain_compilers_and_mpi_wrappers_are_the_build_environment(tmp_path):
    site = site_with(tmp_path, cc="/site/bin/mpicc", cxx="/site/bin/mpicxx", fc="/site/bin/mpifort",
                     build_env={"CFLAGS": "-O2 -march=znver2"})
    component = SourceBuild("tinypkg", "1.0", "file:///x/tinypkg-1.0.tar.gz", SHA, env={"CFLAGS": "-O3", "FOO": "1"})
    env = component.build_env(context(tmp_path, site))
    assert {k: env[k] for k in ("CC", "CXX", "FC", "MPICC", "MPICXX", "MPIFC")} == {
        "CC": "/site/bin/mpicc", "CXX": "/site/bin/mpicxx", "FC": "/site/bin/mpifort",
        "MPICC": "/site/bin/mpicc", "MPICXX": "/site/bin/mpicxx", "MPIFC": "/site/bin/mpifort"}
    assert env["FOO"] == "1" and env["CFLAGS"] == "-O2 -march=znver2"  # the site's build.env wins
    assert env["MAKEFLAGS"] == "-j2"
    # the build command runs with them, and the key function exports them for its probes
    action = build_action(tmp_path, site, component)
    assert action.build.env["MPICC"] == "/site/bin/mpicc" and action.env["CXX"] == "/site/bin/mpicxx"
    assert "export MPICC=/site/bin/mpicc" in action.key_script()


def test_key_changes_when_the_mpi_behind_the_wrapper_changes(tmp_path):
    mpicc = tmp_path / "bin" / "mpicc"
    site = site_with(tmp_path, cc=openmpi_wrapper(mpicc))
    action = build_action(tmp_path, site)
    before = key(action)
    assert key(action) == before
    text = action.key_text(dict(os.environ))
    assert "--- MPI\ngcc -I/usr/lib/openmpi/include -lmpi\nmpicc: Open MPI 4.1.4 (Language: C)\n" in text
    openmpi_wrapper(mpicc, version="5.0.7")              # the site's Open MPI upgraded
    assert key(action) != before
    openmpi_wrapper(mpicc, under="clang")                # the same wrapper over another compiler
    assert key(action) != before
    openmpi_wrapper(mpicc)
    assert key(action) == before


def test_key_follows_an_mpich_wrapper(tmp_path):
    mpicc = tmp_path / "bin" / "mpicc"
    action = build_action(tmp_path, site_with(tmp_path, cc=mpich_wrapper(mpicc)))
    before = key(action)
    assert "mpicc for MPICH version 4.0.3" in action.key_text(dict(os.environ))
    mpich_wrapper(mpicc, version="4.2.0")
    assert key(action) != before


def test_key_changes_when_the_compiler_changes(tmp_path):
    a = openmpi_wrapper(tmp_path / "a" / "mpicc")
    b = openmpi_wrapper(tmp_path / "b" / "mpicc")        # same output, another compiler
    key_a = key(build_action(tmp_path, site_with(tmp_path, "a", cc=a)))
    assert key(build_action(tmp_path, site_with(tmp_path, "b", cc=b))) != key_a
    cxx = tool(tmp_path / "c" / "g++", 'echo "g++ (Debian 12.2.0-14) 12.2.0"\n')
    key_cxx = key(build_action(tmp_path, site_with(tmp_path, "c", cc=a, cxx=cxx)))
    assert key_cxx != key_a
    tool(tmp_path / "c" / "g++", 'echo "g++ (Debian 13.3.0-1) 13.3.0"\n')  # the compiler upgraded in place
    assert key(build_action(tmp_path, site_with(tmp_path, "c", cc=a, cxx=cxx))) != key_cxx


def test_key_covers_the_build_settings_but_not_parallelism(tmp_path):
    cc = openmpi_wrapper(tmp_path / "bin" / "mpicc")
    site = site_with(tmp_path, cc=cc)
    plain = key(build_action(tmp_path, site))
    tuned = SourceBuild("tinypkg", "1.0", "file:///x/tinypkg-1.0.tar.gz", SHA,
                        patches=(Patch("tiny.patch", SHA),), env={"MY_BUILD_OPTION": "on"})
    assert key(build_action(tmp_path, site, tuned)) != plain
    text = build_action(tmp_path, site, tuned).key_text(dict(os.environ))
    assert "MY_BUILD_OPTION=on" in text and "MAKEFLAGS" not in text
    assert text.startswith(f"{KEY_FORMAT}\npackage tinypkg 1.0\nsdist tinypkg-1.0.tar.gz sha256 {SHA}\n"
                           f"patch tiny.patch sha256 {SHA}\n")
    other_patch = SourceBuild("tinypkg", "1.0", "file:///x/tinypkg-1.0.tar.gz", SHA,
                              patches=(Patch("tiny.patch", "1" * 64),))
    assert key(build_action(tmp_path, site, other_patch)) != plain


def test_key_probes_python_abi_and_cuda_only_where_used(tmp_path):
    site = site_with(tmp_path, fc="mpifort", cuda={"home": "/opt/cuda-12.4", "version": "12.4"},
                     nccl={"home": "/opt/nccl"})
    ctx = context(tmp_path, site)
    probes = dict(SourceBuild("x", "1", "file:///x-1.tar.gz", SHA).key_probes(ctx))
    assert "SOABI" in probes["python"] and "EXT_SUFFIX" in probes["python"]
    assert "CUDA" not in probes and "NCCL" not in probes and "Fortran compiler" in probes
    gpu = SourceBuild("x", "1", "file:///x-1.tar.gz", SHA, cuda=True)
    probes = dict(gpu.key_probes(ctx))
    assert probes["CUDA"] == "/opt/cuda-12.4/bin/nvcc --version" and "/opt/nccl/include/nccl.h" in probes["NCCL"]
    assert gpu.build_env(ctx)["CUDA_HOME"] == "/opt/cuda-12.4"
    assert "CUDA_HOME" not in SourceBuild("x", "1", "file:///x-1.tar.gz", SHA).build_env(ctx)


def test_key_is_the_same_online_and_from_a_bundle(tmp_path):
    """``install --from BUNDLE`` gives the build ``PIP_NO_INDEX`` and ``PIP_FIND_LINKS`` (the
    bundle's path): where a build requirement comes from, not what is compiled. The key of the
    same build online and from any copy of the bundle is one, and a real build setting still counts."""
    from hpcstack.lifecycle.bundle import FORMAT, use_bundle

    cc = openmpi_wrapper(tmp_path / "bin" / "mpicc")
    site = site_with(tmp_path, cc=cc, build_env={"CFLAGS": "-O2"})
    recipe = context(tmp_path, site).recipe
    texts = []
    for copy in ("bundle", "elsewhere/bundle"):
        bundle = tmp_path / copy
        bundle.mkdir(parents=True)
        (bundle / "manifest.json").write_text(
            f'{{"format": "{FORMAT}", "recipe": "{recipe.full_name}", "site": "{site.name}", "files": {{}}}}')
        offline = build_action(tmp_path, use_bundle(site, recipe, None, bundle))
        # the build itself still fetches from the bundle alone
        assert offline.build.env["PIP_NO_INDEX"] == "1"
        assert offline.build.env["PIP_FIND_LINKS"] == str(bundle / "build")
        texts.append(offline.key_text(dict(os.environ)))
    online = build_action(tmp_path, site).key_text(dict(os.environ))
    assert texts == [online, online]
    assert "--- variables\nCC=" in online and "CFLAGS=-O2\n" in online and "PIP_" not in online
    # a site's own mirror or proxy neither
    mirror = site_with(tmp_path, "m", cc=cc, build_env={
        "CFLAGS": "-O2", "PIP_INDEX_URL": "https://mirror.example/simple",
        "UV_INDEX_URL": "https://mirror.example/simple", "https_proxy": "http://proxy.example:3128",
        "PIP_FIND_LINKS": "/srv/wheels"})
    assert build_action(tmp_path, mirror).key_text(dict(os.environ)) == online
    tuned = site_with(tmp_path, "t", cc=cc, build_env={"CFLAGS": "-O3", "PIP_NO_INDEX": "1"})
    assert build_action(tmp_path, tuned).key_text(dict(os.environ)) != online
