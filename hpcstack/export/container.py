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

hpccm writes every value it is given as it is, so each value is quoted here, for the language it
lands in, before hpccm sees it: environment values as one shell word in the Apptainer
``%environment`` and ``%post`` (:func:`hpcstack.templates.sh_quote`) and in the Dockerfile's own
quoting in ``ENV`` (double quotes, ``\\ " $`` escaped: Dockerfile reference, "Environment
replacement"), the only live parts being the ``$NAME`` references to a path variable's earlier
value (:class:`Ref`); ``ADD`` and ``ENTRYPOINT`` in their JSON-array form; commands' words with
``sh_quote``; comment text with :func:`hpcstack.templates.comment`. A value no language can hold
on one line (a control character: a newline would start a new instruction, or a new
``%setup`` section, which Apptainer runs on the build host) is refused, one line, exit 2 (the
site loader refuses them in the config already). The root filesystem tar's name is refused unless
it is a plain file name (:data:`ROOTFS_NAME`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from hpcstack import __version__
from hpcstack.errors import ConfigError
from hpcstack.export.formats import register_exporter
from hpcstack.schema import CONTROL
from hpcstack.templates import comment as comment_text
from hpcstack.templates import sh_quote

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
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}\Z")
#: Package roles of ``container.packages``, in the order they are installed.
PACKAGE_ROLES = ("compilers", "mpi", "modules", "python", "other")
#: ``container.rootfs``: a file name of letters, digits and ``._+,=@%~/-``, not starting with
#: ``-`` (it is an argument of ``tar`` in the Apptainer ``%setup``, which runs on the build host,
#: and the source of the Dockerfile's ``ADD``).
ROOTFS_NAME = re.compile(r"(?!-)[\w.+,=@%~/-]+")
#: A Dockerfile word that needs no quotes: nothing Docker's word processing reads (quotes,
#: ``\\``, ``$``, white space).
_DOCKER_PLAIN = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


@dataclass(frozen=True)
class Ref:
    """A live reference to a variable's value before the image sets it (``$PATH`` in
    ``PATH=<stack>/bin:$PATH``): the one part of an environment value that is not literal.

    Args:
        name (str): the variable's name.
    """

    name: str


def _one_line(value: str, what: str) -> str:
    """``value`` if it holds no control character (:data:`hpcstack.schema.CONTROL`).

    Raises:
        ConfigError: it holds one: a newline would end the instruction (Dockerfile) or start a
            section (an Apptainer definition's ``%setup`` runs on the build host); one line.
    """
    if CONTROL.search(value):
        raise ConfigError([f"{what}: {value[:60]!r}: holds a control character (newline, ...); a container "
                           "spec cannot hold it on one line"])
    return value


def _setup_command(cmd: str, what: str) -> str:
    """One of ``container.setup``'s commands (shell code by design, written as it is), if it
    stays on its line of the spec.

    Args:
        cmd (str): the command.
        what (str): ``<site file>: container.setup``, for the error line.

    Raises:
        ConfigError: a control character; a first word starting with ``%`` (Apptainer starts a
            section at any line whose first word does, and a ``%setup`` section runs on the build
            host: apptainer's ``pkg/build/types/parser/deffile.go``); a trailing backslash (it
            joins the next line of the spec).
    """
    _one_line(cmd, what)
    words = cmd.split()
    if words and words[0].startswith("%"):
        raise ConfigError([f"{what}: {cmd[:60]!r}: a command may not start with % (Apptainer would read "
                           "a new section, and %setup runs on the build host)"])
    if cmd.rstrip().endswith("\\"):
        raise ConfigError([f"{what}: {cmd[:60]!r}: a command may not end with a backslash (it would "
                           "join the next line of the container spec)"])
    return cmd


def _env_name(name: str) -> str:
    """``name`` if it is an environment variable's name (letters, digits, ``_``).

    Raises:
        ConfigError: it is not.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ConfigError([f"environment variable {name[:60]!r}: not a variable name (letters, digits and _)"])
    return name


def docker_word(text: str) -> str:
    """``text`` as one literal word of a Dockerfile ``ENV``/``LABEL`` value: as it is when plain,
    else in double quotes with ``\\``, ``"`` and ``$`` escaped (the Dockerfile reference,
    "Environment replacement": ``\\$`` is a literal ``$``).

    Args:
        text (str): one line (no control character: see :func:`_one_line`).
    """
    if _DOCKER_PLAIN.fullmatch(text):
        return text
    return '"' + re.sub(r'([\\"$])', r"\\\1", text) + '"'


def _merged(parts) -> list:
    """Adjacent literal parts joined (so each is quoted once)."""
    out: list = []
    for part in parts:
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        else:
            out.append(part)
    return out


def shell_value(parts, what: str = "value") -> str:
    """An environment value for ``export NAME=…`` in bash/sh: literals quoted with
    :func:`hpcstack.templates.sh_quote`, each :class:`Ref` as ``"$NAME"``.

    Args:
        parts (Iterable[str | Ref]): the value's parts.
        what (str): what the value is, for the error line.

    Raises:
        ConfigError: a literal with a control character.
    """
    return "".join(f'"${p.name}"' if isinstance(p, Ref) else sh_quote(_one_line(p, what))
                   for p in _merged(parts)) or "''"


def docker_value(parts, what: str = "value") -> str:
    """An environment value for a Dockerfile ``ENV NAME=…``: literals with :func:`docker_word`,
    each :class:`Ref` as ``${NAME}``.

    Args:
        parts (Iterable[str | Ref]): the value's parts.
        what (str): what the value is, for the error line.

    Raises:
        ConfigError: a literal with a control character.
    """
    return "".join(f"${{{p.name}}}" if isinstance(p, Ref) else
                   (docker_word(_one_line(p, what)) if p else '""') for p in _merged(parts)) or '""'


def container_section(site) -> dict:
    """The site's validated ``container`` section.

    Raises:
        ConfigError: none, neither or both of ``base_image`` and ``rootfs``, a ``base_image``
            named without its digest, or a ``rootfs`` that is not a plain file name (exit 2).
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
    tar = section.get("rootfs")
    if tar is not None and not (isinstance(tar, str) and ROOTFS_NAME.fullmatch(tar)):
        raise ConfigError([f"{site.path}: container.rootfs: {str(tar)[:60]!r}: give a file name of letters, digits "
                           "and ._+,=@%~/- not starting with - (it is written into the Apptainer %setup, which "
                           "runs on the build host, and the Dockerfile's ADD)"])
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

    wheels = recipe.component(PipWheels)
    if wheels is None:
        return None
    lock = wheels.lock_for(site.toolchain, site.python_version, f"site {site.name}")
    path = Path(wheels.lock_path(recipe.directory, lock))
    return path.name, hashlib.sha256(path.read_bytes()).hexdigest()


def module_variables(recipe, site) -> dict[str, tuple]:
    """The modulefile's environment as variables, in its order: each value a tuple of literal
    parts (``str``) and :class:`Ref` parts, the earlier value of a path variable
    (``PATH`` = ``("<stack>/bin:", Ref("PATH"))``), for :func:`shell_value` or
    :func:`docker_value` to quote.

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
    out: dict[str, tuple] = {context.root_variable: (context.prefix,)}
    for change in context.changes:
        old = out.get(change.name, (Ref(change.name),))
        if change.kind == "prepend-path":
            out[change.name] = (change.value, ":", *old)
        elif change.kind == "append-path":
            out[change.name] = (*old, ":", change.value)
        elif change.kind == "setenv":
            out[change.name] = (change.value,)
        elif change.kind == "unsetenv":
            out[change.name] = ("",)
        else:
            raise ValueError(f"environment change {change.kind!r} has no variable form")
    # a variable unset before (PYTHONPATH) must not get an empty entry (the working directory)
    for name, parts in out.items():
        if name != "PATH" and parts[-2:] == (":", Ref(name)):
            out[name] = parts = parts[:-2]
        if name != "PATH" and parts[:2] == (Ref(name), ":"):
            out[name] = parts[2:]
    return out


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

        from hpcstack.session import rerun_recipe

        section = container_section(site)
        inside, inside_raw = inside_site(site)
        inside_recipe = rerun_recipe(recipe, inside)
        distro, ca_bundle = DISTROS[section.get("distro", "debian12")]
        hpccm.config.set_container_format(self.container_format)
        hpccm.config.set_singularity_version("3.5")      # %files before %post; Apptainer reads it
        hpccm.config.set_linux_distro(distro)

        stage = hpccm.Stage()
        for part in (self._base(recipe, site, section, distro, ca_bundle), self._tool(site, section),
                     self._install(recipe, site, section, inside, inside_raw, inside_recipe)):
            for primitive in part:
                stage += primitive
        return self.checked(str(stage).rstrip("\n") + "\n")

    def _base(self, recipe, site, section: dict, distro: str, ca_bundle: str) -> list:
        """The header comment, the base (``FROM``/``Bootstrap``), the CA bundle's variables and
        the packages: hpccm primitives and building blocks, in order."""
        import hpccm
        from hpccm.building_blocks import packages
        from hpccm.primitives import baseimage, comment, environment, raw

        c = comment_text     # every value in a comment stays on its line
        wheel = f"hpcstack-{__version__}-py3-none-any.whl"
        out = [comment(
            f"{c(recipe.full_name)} for site {c(site.name)} as a container image: {c(recipe.whatis)}.\n"
            f"Written by hpcstack {__version__}: hpcstack export {c(recipe.full_name)} --site {c(site.ref)} "
            f"--format {self.name}.\n"
            f"Build context: this file, {wheel} (`uv build` of hpcstack)"
            + (f" and {c(section['rootfs'])} (mmdebstrap --variant=minbase bookworm {c(section['rootfs'])})"
               if "rootfs" in section else "") + ".\n"
            f"Share a cache of wheels and builds: mount a directory at {CACHE_DIR} while building, e.g.\n"
            + self.build_hint(recipe), reformat=False)]
        if "rootfs" in section:
            # hpccm cannot express this: its copy primitive writes COPY (which does not unpack a
            # tar) and its baseimage always bootstraps from a registry
            tar = section["rootfs"]
            out.append(raw(docker="FROM scratch\nADD " + json.dumps([tar, "/"]),
                           singularity='Bootstrap: scratch\n\n%setup\n    tar -C "${APPTAINER_ROOTFS:-$SINGULARITY_ROOTFS}" '
                                       f"-xf {sh_quote(tar)}"))
            hpccm.config.set_linux_distro(distro)
        else:
            out.append(baseimage(image=_one_line(section["base_image"], "container.base_image"), _distro=distro,
                                 _docker_env=False))
        out.append(comment("the image's tools trust the image's CA bundle (a site's CAs added at build time too)"))
        out.append(environment(variables={k: self.env_value((ca_bundle,), k) for k in
                                          ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE")}, _export=True))
        pkgs = [p for role in PACKAGE_ROLES for p in (section.get("packages") or {}).get(role, [])]
        if pkgs:
            out.append(comment("compilers, MPI, the module tool and Python from the package manager"))
            out.append(packages(ospackages=[sh_quote(_one_line(p, "container.packages")) for p in pkgs]))
        return out

    def _tool(self, site, section: dict) -> list:
        """hpcstack from its wheel (its dependencies hash-checked) and the site's ``setup``."""
        from hpccm.primitives import comment, shell
        from hpccm.primitives import copy as hcopy

        wheel = f"hpcstack-{__version__}-py3-none-any.whl"
        out = [comment(f"hpcstack {__version__} from its wheel"), hcopy(src=wheel, dest=f"{DIST_DIR}/{wheel}")]
        # its dependencies from the requirements file inside the wheel, every file's sha256
        # checked (--require-hashes), then the wheel itself without dependencies
        requirements = f"{DIST_DIR}/requirements.txt"
        out.append(shell(commands=[
            f"PIP_CACHE_DIR={CACHE_DIR}/pip python3 -m venv {TOOL_VENV}",
            f"{TOOL_VENV}/bin/python -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1])"
            f".read(\"{WHEEL_REQUIREMENTS}\").decode())' {DIST_DIR}/{wheel} > {requirements}",
            f"PIP_CACHE_DIR={CACHE_DIR}/pip {TOOL_VENV}/bin/pip install --disable-pip-version-check "
            f"-q --require-hashes -r {requirements}",
            f"PIP_CACHE_DIR={CACHE_DIR}/pip {TOOL_VENV}/bin/pip install --disable-pip-version-check "
            f"-q --no-deps {DIST_DIR}/{wheel}",
            f"ln -sfn {TOOL_VENV}/bin/hpcstack /usr/local/bin/hpcstack",
            *self.cache_cleanup()]))
        if section.get("setup"):
            out.append(comment("make the image a machine of the site ($HPCSTACK_DATA: hpcstack's own "
                               "recipes, site configs and scripts)"))
            # the site's own commands (shell code by design), each on its one line
            out.append(shell(commands=[
                f"export HPCSTACK_DATA=$({TOOL_VENV}/bin/python -c "
                "'import hpcstack; print(hpcstack.data_root())')",
                *(_setup_command(cmd, f"{site.path}: container.setup") for cmd in section["setup"])]))
        return out

    def _install(self, recipe, site, section: dict, inside, inside_raw: dict, inside_recipe) -> list:
        """The inside site config and the install, the module's variables, the labels and the
        runscript."""
        from hpccm.primitives import comment, environment, label, raw, shell

        c = comment_text
        site_file = f"{SITE_DIR}/{inside.name}.yaml"
        out = [comment(f"the site config used inside (site {c(site.name)}: " +
                       ("its container.site_changes, " if section.get("site_changes") else "") +
                       f"Python {c(section['python'])}, the cache in {CACHE_DIR}), then the install")]
        yaml_lines = yaml.safe_dump(inside_raw, sort_keys=False, width=1000).splitlines()
        out.append(shell(commands=[
            f"mkdir -p {SITE_DIR}",
            "printf '%s\\n' \\\n        "
            + " \\\n        ".join(_shell_word(_one_line(line, "container.site_changes")) for line in yaml_lines)
            + f" \\\n        > {sh_quote(site_file)}",
            shlex.join(["hpcstack", "install", inside_recipe.full_name, "--site", site_file]),
            *self.cache_cleanup()]))
        out.append(comment(f"the module's environment, set directly (login shells can also "
                           f"`module load {c(inside_recipe.full_name)}`)"))
        out.append(environment(variables={_env_name(k): self.env_value(v, f"the module's {k}")
                                          for k, v in module_variables(inside_recipe, inside).items()},
                               _export=True))
        labels = {"org.opencontainers.image.title": f"{recipe.full_name} ({site.name})",
                  "org.opencontainers.image.description": recipe.whatis,
                  "org.hpcstack.recipe": recipe.full_name, "org.hpcstack.site": site.name,
                  "org.hpcstack.version": __version__}
        lock = lock_of(inside_recipe, inside)
        if lock:
            labels.update({"org.hpcstack.lock": lock[0], "org.hpcstack.lock.sha256": lock[1]})
        out.append(label(metadata={k: self.label_value(v) for k, v in labels.items()}))
        out.append(comment("the validation trainer on the site's launcher; arguments are appended (--ranks 2)"))
        out.append(raw(**self.entrypoint(["hpcstack", "validate", inside_recipe.full_name, "--site", site_file,
                                          "--local"])))
        return out

    def checked(self, text: str) -> str:
        """The spec's text, after checking that it holds only the instructions or sections
        hpcstack wrote (the last guard: every value was quoted or refused before)."""
        return text

    def env_value(self, parts, what: str) -> str:
        """An environment value quoted for this format's ``ENV``/``export`` (:func:`shell_value`,
        :func:`docker_value`).

        Args:
            parts (Iterable[str | Ref]): the value's parts.
            what (str): the variable, for the error line.

        Raises:
            ConfigError: a control character in the value.
        """
        raise NotImplementedError

    def label_value(self, text: str) -> str:
        """A label's value: a JSON string (one line whatever it holds)."""
        return json.dumps(text)

    @staticmethod
    def entrypoint(argv: list[str]) -> dict[str, str]:
        """The runscript as hpccm's ``raw`` keywords: Docker's ``ENTRYPOINT`` in JSON-array form,
        Apptainer's ``%runscript`` as one ``exec`` with its words quoted (``"$@"`` appended)."""
        return {"docker": "ENTRYPOINT " + json.dumps(argv),
                "singularity": f'%runscript\n    exec {shlex.join(argv)} "$@"'}

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

    def env_value(self, parts, what: str) -> str:
        return docker_value(parts, what)

    def label_value(self, text: str) -> str:
        """A JSON string with ``$`` escaped: Docker substitutes variables in ``LABEL`` values."""
        return json.dumps(text).replace("$", "\\$")

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

    def env_value(self, parts, what: str) -> str:
        return shell_value(parts, what)

    #: The sections hpcstack writes, each header alone on its line.
    SECTIONS = re.compile(r"%(setup|environment|post|files|labels|runscript)")

    def checked(self, text: str) -> str:
        """Apptainer starts a section at every line whose first word starts with ``%``
        (``pkg/build/types/parser/deffile.go``, ``scanDefinitionFile``), wherever the line is:
        every such line must be a header hpcstack wrote, and ``%setup`` (run on the build host)
        at most the one that unpacks the root filesystem.

        Raises:
            ConfigError: any other such line (one line naming it).
        """
        setups = 0
        for number, line in enumerate(text.split("\n"), 1):
            words = line.split()
            if not words or not words[0].startswith("%"):
                continue
            if not self.SECTIONS.fullmatch(line):
                raise ConfigError([f"the Apptainer definition's line {number} ({line[:60]!r}) would start a section "
                                   "hpcstack did not write; a value of the site config starts with %"])
            setups += line == "%setup"
        if setups > 1:
            raise ConfigError(["the Apptainer definition would hold more than one %setup section"])
        return text

    def build_hint(self, recipe) -> str:
        sif = f"{recipe.name}-{recipe.version}.sif"
        return (f"  apptainer build --bind $PWD/cache:{CACHE_DIR} {sif} {recipe.name}-{recipe.version}.def\n"
                f"Run: apptainer run {sif} --ranks 2   (the validation; apptainer exec {sif} CMD for any command)")
