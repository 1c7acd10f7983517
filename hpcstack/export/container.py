"""Container specs: the stack as a Docker image (``--format docker``) or an Apptainer image
(``--format apptainer``), written with hpccm (NVIDIA's HPC Container Maker,
https://github.com/NVIDIA/hpc-container-maker).

The file builds the same plan inside the image that ``hpcstack install`` runs on the site: the
image is a machine of its own, described by the site config's ``container`` section (its base,
its package manager's packages for compilers, MPI, the module tool and Python, the commands that
make it a machine of the site, and what of the site config differs inside). In order:

1. the base: ``base_image`` (``FROM``), or ``rootfs``: a root filesystem tar (``mmdebstrap
   --variant=minbase bookworm rootfs.tar``) for ``FROM scratch`` + ``ADD rootfs.tar /``;
2. the image's tools trust the image's CA bundle (``SSL_CERT_FILE``, ``PIP_CERT``,
   ``REQUESTS_CA_BUNDLE``): a site's own CAs added at build time end up in it;
3. the packages, by role (hpccm's ``packages`` building block: apt or yum by ``distro``);
4. hpcstack's dependencies from the requirements file its wheel carries, with every hash
   (``pip install --require-hashes``), then hpcstack from its wheel
   (``hpcstack-<version>-py3-none-any.whl`` next to the file: ``uv
   build``), in ``/opt/hpcstack/tool``, ``/usr/local/bin/hpcstack`` linking to it;
5. ``setup``: e.g. the localhost bring-up from hpcstack's own data (the base ``python`` module);
6. the site config used inside, then ``hpcstack install RECIPE --site`` it;
7. the module's variables set directly (``PATH``, ``PYTHONPATH``, ``HPCSTACK_<NAME>_ROOT`` and
   what components add), so every process in the image sees the stack; login shells can also
   ``module load`` it;
8. labels: recipe, site, lock file and its sha256, hpcstack version;
9. the runscript (entrypoint): ``hpcstack validate RECIPE --site … --local``, the validation
   trainer on the site's launcher (arguments are appended: ``--ranks 2``).

Caches: the install inside uses ``/var/cache/hpcstack`` as its cache directory (uv's wheel cache,
Horovod's build cache, sources) and pip's. Bind-mount a host's cache there at build time
(``buildah bud --volume DIR:/var/cache/hpcstack``, ``docker build`` has no such option:
``RUN --mount`` needs BuildKit) and nothing is downloaded or compiled twice; without one, the
install downloads into the directory and the same ``RUN`` removes it, so it never reaches a layer.

What hpccm cannot express, written as text through its ``raw`` primitive: ``ADD`` of a root
filesystem tar (hpccm's ``copy`` is ``COPY``, which does not unpack), and Apptainer's ``Bootstrap:
scratch`` with the tar unpacked in ``%setup`` (hpccm's ``baseimage`` always writes ``Bootstrap:
docker``). Everything else is hpccm's building blocks and primitives.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
from pathlib import Path

import yaml

from hpcstack import __version__
from hpcstack.errors import ConfigError
from hpcstack.export.formats import register_exporter

#: hpcstack's dependencies with the sha256 of every file, inside its wheel
#: (``requirements/hpcstack.txt`` of the repository, written by ``scripts/lock-requirements``).
WHEEL_REQUIREMENTS = "hpcstack/data/requirements/hpcstack.txt"
#: The cache directory of the install inside the image (bind-mount a host's cache here).
CACHE_DIR = "/var/cache/hpcstack"
#: Where the site config used inside the image goes.
SITE_DIR = "/opt/hpcstack/site-configs"
TOOL_VENV = "/opt/hpcstack/tool"
DIST_DIR = "/opt/hpcstack/dist"
#: ``container.distro`` -> (hpccm's distro name, the distribution's CA bundle).
DISTROS = {
    "debian12": ("ubuntu22", "/etc/ssl/certs/ca-certificates.crt"),   # apt, as Ubuntu's
    "ubuntu22": ("ubuntu22", "/etc/ssl/certs/ca-certificates.crt"),
    "ubuntu24": ("ubuntu24", "/etc/ssl/certs/ca-certificates.crt"),
    "rockylinux8": ("rockylinux8", "/etc/pki/tls/certs/ca-bundle.crt"),
    "rockylinux9": ("rockylinux9", "/etc/pki/tls/certs/ca-bundle.crt"),
}
#: A base image named by digest (``NAME[:TAG]@sha256:HEX``): a tag can be moved to another image.
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
#: Package roles of ``container.packages``, in the order they are installed.
PACKAGE_ROLES = ("compilers", "mpi", "modules", "python", "other")


def container_section(site) -> dict:
    """The site's validated ``container`` section.

    Raises:
        ConfigError: none, neither or both of ``base_image`` and ``rootfs``, or a ``base_image``
            named without its digest (exit 2).
    """
    section = site.raw.get("container")
    if not section:
        raise ConfigError([f"{site.path}: container: missing section (the image's base_image or rootfs, "
                           "its packages and Python; see site-configs/localhost.yaml)"])
    if ("base_image" in section) == ("rootfs" in section):
        raise ConfigError([f"{site.path}: container: give one of base_image (an image to start FROM) "
                           "and rootfs (a root filesystem tar for FROM scratch + ADD)"])
    image = section.get("base_image")
    if image is not None and not DIGEST.search(image):
        raise ConfigError([f"{site.path}: container.base_image: {image!r} is named by tag only; name it by "
                           "digest too (NAME:TAG@sha256:<64 hex digits>), so that every build starts from "
                           "the same image (docker buildx imagetools inspect NAME:TAG shows the digest)"])
    return section


def inside_site(site):
    """The site config the image is installed with: the site's, less ``container`` and
    ``slurm`` (the image validates with ``--local``) and less ``layout``, ``squashfs`` and
    ``filesystem`` (the stack is a directory in the image), with ``container.site_changes`` on top
    (top-level keys replaced), the image's Python, and the cache in :data:`CACHE_DIR` (copied
    into the stack, not hard-linked: it is a mount at build time).

    Args:
        site (hpcstack.site.Site): the site.

    Returns:
        tuple[hpcstack.site.Site, dict]: the inside site and its config as written into the image.

    Raises:
        ConfigError: no usable ``container`` section, or the resulting config is not a valid site
            config (one line per problem, named ``container.site_changes``).
    """
    from hpcstack.site import _build, check_config

    section = container_section(site)
    # neither layout: squashfs nor filesystem: parallel is carried in (the latter would make squashfs
    # the default): the container is the image, its stack a directory on the image's own file system
    # (no FUSE in a build)
    raw = {k: copy.deepcopy(v) for k, v in site.raw.items()
           if k not in ("container", "slurm", "layout", "squashfs", "filesystem")}
    raw.update(copy.deepcopy(section.get("site_changes") or {}))
    raw["python"] = {**(raw.get("python") or {}), "version": section["python"]}
    raw["cache_dir"] = CACHE_DIR
    raw["installer"] = {**(raw.get("installer") or {}), "wheel_cache": None, "link_mode": "copy"}
    problems = check_config(raw, f"{site.path}: container.site_changes")
    if problems:
        raise ConfigError(problems)
    path = Path(SITE_DIR) / f"{raw['name']}.yaml"
    return _build(raw, path, None, None, str(path)), raw


def lock_of(recipe, site) -> tuple[str, str] | None:
    """``(lock file name, sha256)`` of the lock the recipe installs on ``site``, or None."""
    from hpcstack.install.components.wheels import PipWheels

    for c in recipe.components:
        if isinstance(c, PipWheels):
            lock = c.lock_for(site.toolchain, site.python_version, f"site {site.name}")
            path = Path(c.lock_path(recipe.directory, lock))
            return path.name, hashlib.sha256(path.read_bytes()).hexdigest()
    return None


def module_variables(recipe, site) -> dict[str, str]:
    """The modulefile's environment as variables (``PATH=<stack>/bin:…:$PATH``), in its order.

    Raises:
        ValueError: a component's environment change of an unknown kind.
    """
    from hpcstack.install.layout import StackLayout
    from hpcstack.install.components.base import PlanContext
    from hpcstack.install.components.modulefile import Modulefile
    from hpcstack.modules import writer

    prefix = StackLayout.for_site(site, recipe.name, recipe.version).prefix
    ctx = PlanContext(site=site, recipe=recipe, prefix=prefix, stage_dir="", cache_dir="",
                      python_version=site.python_version, jobs=1,
                      modulefile=writer.modulefile_path(site.module_root, recipe.name, recipe.version,
                                                         site.modules.syntax))
    context = Modulefile().context(ctx)
    out: dict[str, str] = {context.root_variable: context.prefix}
    for change in context.changes:
        old = out.get(change.name, f"${change.name}")
        if change.kind == "prepend-path":
            out[change.name] = f"{change.value}:{old}"
        elif change.kind == "append-path":
            out[change.name] = f"{old}:{change.value}"
        elif change.kind == "setenv":
            out[change.name] = change.value
        elif change.kind == "unsetenv":
            out[change.name] = ""
        else:
            raise ValueError(f"environment change {change.kind!r} has no variable form")
    # a variable unset before (PYTHONPATH) must not end in an empty entry (the working directory)
    return {k: v[:-len(f":${k}")] if v.endswith(f":${k}") and k != "PATH" else v for k, v in out.items()}


def _shell_word(text: str) -> str:
    """``text`` as one shell word, quoted the most readable way that is still exact."""
    if "'" not in text:
        return f"'{text}'"
    if not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


class ContainerSpec:
    """What the Docker and Apptainer exporters share; :attr:`container_format` is hpccm's."""

    container_format = ""
    #: the exporter needs no plan of the site itself (``hpcstack export`` then resolves none)
    needs_plan = False

    def render(self, recipe, site, plan) -> str:
        """Return the container spec's text.

        Args:
            recipe (hpcstack.recipe.Recipe): the recipe (loaded for ``site``; reloaded for the
                site inside the image).
            site (hpcstack.site.Site): the site with a ``container`` section.
            plan (hpcstack.install.plan.Plan): the site's plan (not used: the image's plan is
                the inside site's).

        Raises:
            ConfigError: no usable ``container`` section (exit 2).
        """
        import hpccm
        from hpccm.building_blocks import packages
        from hpccm.primitives import baseimage, comment, environment, label, raw, runscript, shell
        from hpccm.primitives import copy as hcopy

        from hpcstack.loader import reload_recipe

        section = container_section(site)
        inside, inside_raw = inside_site(site)
        inside_recipe = reload_recipe(recipe, inside)
        distro, ca_bundle = DISTROS[section.get("distro", "debian12")]
        site_file = f"{SITE_DIR}/{inside.name}.yaml"
        wheel = f"hpcstack-{__version__}-py3-none-any.whl"
        lock = lock_of(inside_recipe, inside)
        hpccm.config.set_container_format(self.container_format)
        hpccm.config.set_singularity_version("3.5")      # %files before %post; Apptainer reads it
        hpccm.config.set_linux_distro(distro)

        stage = hpccm.Stage()
        stage += comment(
            f"{recipe.full_name} for site {site.name} as a container image: {recipe.whatis}.\n"
            f"Written by hpcstack {__version__}: hpcstack export {recipe.full_name} --site {site.ref} "
            f"--format {self.name}.\n"
            f"Build context: this file, {wheel} (`uv build` of hpcstack)"
            + (f" and {section['rootfs']} (mmdebstrap --variant=minbase bookworm {section['rootfs']})"
               if "rootfs" in section else "") + ".\n"
            f"Share a cache of wheels and builds: mount a directory at {CACHE_DIR} while building, e.g.\n"
            + self.build_hint(recipe), reformat=False)
        if "rootfs" in section:
            # hpccm cannot express this: its copy primitive writes COPY (which does not unpack a
            # tar) and its baseimage always bootstraps from a registry
            tar = section["rootfs"]
            stage += raw(docker=f"FROM scratch\nADD {tar} /",
                         singularity=f'Bootstrap: scratch\n\n%setup\n    tar -C "${{APPTAINER_ROOTFS:-$SINGULARITY_ROOTFS}}" -xf {tar}')
            hpccm.config.set_linux_distro(distro)
        else:
            stage += baseimage(image=section["base_image"], _distro=distro, _docker_env=False)
        stage += comment("the image's tools trust the image's CA bundle (a site's CAs added at build time too)")
        stage += environment(variables={"SSL_CERT_FILE": ca_bundle, "PIP_CERT": ca_bundle,
                                        "REQUESTS_CA_BUNDLE": ca_bundle}, _export=True)
        pkgs = [p for role in PACKAGE_ROLES for p in (section.get("packages") or {}).get(role, [])]
        if pkgs:
            stage += comment("compilers, MPI, the module tool and Python from the package manager")
            stage += packages(ospackages=pkgs)
        stage += comment(f"hpcstack {__version__} from its wheel")
        stage += hcopy(src=wheel, dest=f"{DIST_DIR}/{wheel}")
        # its dependencies from the requirements file inside the wheel, every file's sha256
        # checked (--require-hashes), then the wheel itself without dependencies
        requirements = f"{DIST_DIR}/requirements.txt"
        stage += shell(commands=[
            f"PIP_CACHE_DIR={CACHE_DIR}/pip python3 -m venv {TOOL_VENV}",
            f"{TOOL_VENV}/bin/python -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1])"
            f".read(\"{WHEEL_REQUIREMENTS}\").decode())' {DIST_DIR}/{wheel} > {requirements}",
            f"PIP_CACHE_DIR={CACHE_DIR}/pip {TOOL_VENV}/bin/pip install --disable-pip-version-check "
            f"-q --require-hashes -r {requirements}",
            f"PIP_CACHE_DIR={CACHE_DIR}/pip {TOOL_VENV}/bin/pip install --disable-pip-version-check "
            f"-q --no-deps {DIST_DIR}/{wheel}",
            f"ln -sfn {TOOL_VENV}/bin/hpcstack /usr/local/bin/hpcstack",
            *self.cache_cleanup()])
        if section.get("setup"):
            stage += comment("make the image a machine of the site ($HPCSTACK_DATA: hpcstack's own "
                             "recipes, site configs and scripts)")
            stage += shell(commands=[
                f"export HPCSTACK_DATA=$({TOOL_VENV}/bin/python -c "
                "'import hpcstack; print(hpcstack.data_root())')",
                *section["setup"]])
        stage += comment(f"the site config used inside (site {site.name}: " +
                         ("its container.site_changes, " if section.get("site_changes") else "") +
                         f"Python {section['python']}, the cache in {CACHE_DIR}), then the install")
        yaml_lines = yaml.safe_dump(inside_raw, sort_keys=False, width=1000).splitlines()
        stage += shell(commands=[
            f"mkdir -p {SITE_DIR}",
            "printf '%s\\n' \\\n        " + " \\\n        ".join(_shell_word(line) for line in yaml_lines)
            + f" \\\n        > {site_file}",
            f"hpcstack install {inside_recipe.full_name} --site {site_file}",
            *self.cache_cleanup()])
        stage += comment(f"the module's environment, set directly (login shells can also "
                         f"`module load {inside_recipe.full_name}`)")
        stage += environment(variables=module_variables(inside_recipe, inside), _export=True)
        labels = {"org.opencontainers.image.title": f"{recipe.full_name} ({site.name})",
                  "org.opencontainers.image.description": recipe.whatis,
                  "org.hpcstack.recipe": recipe.full_name, "org.hpcstack.site": site.name,
                  "org.hpcstack.version": __version__}
        if lock:
            labels.update({"org.hpcstack.lock": lock[0], "org.hpcstack.lock.sha256": lock[1]})
        stage += label(metadata={k: json.dumps(v) for k, v in labels.items()})
        stage += comment("the validation trainer on the site's launcher; arguments are appended (--ranks 2)")
        stage += runscript(commands=[f"hpcstack validate {inside_recipe.full_name} --site {site_file} --local"])
        return str(stage).rstrip("\n") + "\n"

    def cache_cleanup(self) -> list[str]:
        """Remove the cache unless a host's cache is mounted there (it must not reach a layer)."""
        return [f"if ! mountpoint -q {CACHE_DIR}; then rm -rf {CACHE_DIR}; fi"]

    def build_hint(self, recipe) -> str:
        raise NotImplementedError


@register_exporter
class Dockerfile(ContainerSpec):
    """A Dockerfile (also Podman's and buildah's Containerfile) that builds the stack in an image."""

    name = "docker"
    description = "a Dockerfile building the stack in an image (hpccm; site's container section)"
    suffix = ".Dockerfile"
    container_format = "docker"

    def build_hint(self, recipe) -> str:
        tag = f"hpcstack-{recipe.name}:{recipe.version}"
        return (f"  buildah --storage-driver vfs bud --isolation chroot --volume $PWD/cache:{CACHE_DIR} -t {tag} .\n"
                f"Run: podman run --rm {tag} --ranks 2   (the validation; or any command after --entrypoint)")


@register_exporter
class ApptainerDefinition(ContainerSpec):
    """An Apptainer (Singularity) definition file that builds the stack in an image."""

    name = "apptainer"
    description = "an Apptainer definition file building the stack in an image (hpccm; site's container section)"
    suffix = ".def"
    container_format = "singularity"

    def build_hint(self, recipe) -> str:
        sif = f"{recipe.name}-{recipe.version}.sif"
        return (f"  apptainer build --bind $PWD/cache:{CACHE_DIR} {sif} {recipe.name}-{recipe.version}.def\n"
                f"Run: apptainer run {sif} --ranks 2   (the validation; apptainer exec {sif} CMD for any command)")
