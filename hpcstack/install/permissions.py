"""The permissions of a stack: who may read it (everyone), who may write it (its owner, and the
site's software group where ``permissions`` says so), and the umask an install runs under.

A site's ``permissions`` section (``{group: hpcsw, mode: "g+rwX,g+s"}``) gives its stacks to a
shared software group; whatever it says, nothing is world-writable and everything stays
world-readable. The permissions step of every plan (:func:`permission_actions`) applies it;
:func:`stack_umask` and :func:`reapply_permissions` keep what is written after that step the same.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import TYPE_CHECKING

from hpcstack.errors import ConfigError
from hpcstack.fsutil import CHILD_CWD, current_user
from hpcstack.install.actions import Run
from hpcstack.site import Site

if TYPE_CHECKING:
    from hpcstack.install.components.base import PlanContext


#: The permissions every stack gets: everything readable by all, directories searchable by all,
#: nothing writable by group or others; a site's ``permissions.mode`` comes after it.
BASE_MODE = "u+rwX,go+rX,go-w"
#: A symbolic ``chmod`` mode (``g+rwX``, ``g+s``, ``u=rwX,g=rX``); octal modes are refused, as
#: they would also clear the execute bits of scripts.
_SYMBOLIC_MODE = re.compile(r"^[ugoa]*([-+=]([rwxXst]*|[ugo]))+(,[ugoa]*([-+=]([rwxXst]*|[ugo]))+)*$")


def permission_settings(site: Site) -> tuple[str | None, str]:
    """Return ``(group, chmod mode)`` for the site's stacks, from its ``permissions`` section.

    ``permissions: {group: hpcsw, mode: "g+rwX,g+s"}`` gives the stack to a shared software
    group and lets the group write it; whatever the mode, nothing is world-writable
    (``o-w`` comes last) and everything stays world-readable.

    Args:
        site (Site): the site; its ``permissions`` section, if any.

    Returns:
        tuple[str | None, str]: the group (None: the installing user's) and the symbolic mode
        for ``chmod -R``, :data:`BASE_MODE` first.

    Raises:
        ConfigError: a mode that is not a symbolic chmod mode, or one that asks for world write.
    """
    section = site.raw.get("permissions") or {}
    group, mode = section.get("group"), section.get("mode")
    full = BASE_MODE
    if mode:
        if not _SYMBOLIC_MODE.match(mode):
            raise ConfigError([f"{site.path}: permissions.mode: {mode!r} is not a symbolic chmod mode "
                               "(e.g. 'g+rwX' or 'g+rwX,g+s')"])
        if any(_gives_world_write(clause) for clause in mode.split(",")):
            raise ConfigError([f"{site.path}: permissions.mode: {mode!r} makes the stack world-writable; "
                               "give write access to a group instead (group: NAME, mode: 'g+rwX')"])
        full += f",{mode},o-w"
    return group, full


def _gives_world_write(clause: str, whom: str = "o") -> bool:
    """True if one clause of a symbolic mode (``o+w``, ``+w``, ``a=rwX``, ``o=u``) lets others
    (``whom="o"``) or the group (``whom="g"``) write."""
    who = re.match(r"^[ugoa]*", clause).group(0)
    if who and not set(who) & {whom, "a"}:
        return False
    copies = {"o": ("u", "g"), "g": ("u",)}[whom]
    return any(op in "+=" and ("w" in perms or perms in copies)
               for op, perms in re.findall(r"([-+=])([rwxXstugo]*)", clause[len(who):]))


def stack_umask(site: Site) -> int:
    """The file-mode creation mask an install runs under, whatever the admin's own umask.

    ``0o022`` (directories 0755, files 0644: readable by every user, writable by the owner
    only), or ``0o002`` where the site's ``permissions.mode`` gives the group write access
    (``g+rwX``), so that what is written after the permissions step (logs, records, the
    modulefile) follows the same rule as the rest of the stack. Spack and EasyBuild set the
    umask of their installs in the same way (EasyBuild's ``--umask``).

    Args:
        site (Site): the site; its ``permissions.mode``.

    Returns:
        int: the umask, ``0o022`` or ``0o002``.

    Raises:
        ConfigError: a bad ``permissions`` section (see :func:`permission_settings`).
    """
    permission_settings(site)
    mode = (site.raw.get("permissions") or {}).get("mode") or ""
    return 0o002 if any(_gives_world_write(c, "g") for c in mode.split(",") if c) else 0o022


def reapply_permissions(site: Site, directory: str) -> None:
    """Give ``directory`` (recursively) the group and mode of the permissions step again.

    For the files a run writes after that step (the step records, logs and timings of the
    module step in ``<build>/.hpcstack``): the permissions step covers every file of a stack.
    Best effort: a failure here leaves the umask's modes (see :func:`stack_umask`).

    Args:
        site (Site): the site (:func:`permission_settings`).
        directory (str): the directory; nothing happens when it is not one.

    Raises:
        ConfigError: a bad ``permissions`` section.
    """
    group, mode = permission_settings(site)
    if not os.path.isdir(directory):
        return
    if group:
        subprocess.run(["chgrp", "-R", "-P", group, directory], capture_output=True, cwd=CHILD_CWD)
    subprocess.run(["chmod", "-R", mode, directory], capture_output=True, cwd=CHILD_CWD)


def permission_actions(site: Site, ctx: PlanContext) -> list:
    """The permissions step: group (if the site names one) and mode on the build and its parents.

    The parents (``<install_root>/<name>``, and for a build of hpcstack 0.2.0's layout the
    ``.builds`` directories under it) get the same group and mode without recursion, so users
    can reach the stack whatever the admin's umask; only those the installing user owns
    (``find -user``), as another member of a shared group may have made them.

    Args:
        site (Site): the site (:func:`permission_settings`, ``install_root``).
        ctx (PlanContext): the plan's context (the recipe, the prefix and the build prefix).

    Returns:
        list[hpcstack.install.actions.Run]: ``chgrp`` (with a group) and ``chmod`` commands.

    Raises:
        ConfigError: a bad ``permissions`` section.
    """
    group, mode = permission_settings(site)
    top = os.path.join(site.install_root, ctx.recipe.name)
    parents = [top]
    parent = os.path.dirname(ctx.build_prefix)
    while ctx.build_prefix != ctx.prefix and parent.startswith(top + os.sep):
        parents.insert(1, parent)
        parent = os.path.dirname(parent)
    owned = ("find", *parents, "-maxdepth", "0", "-user", current_user())
    actions = []
    if group:
        actions += [Run(("chgrp", "-R", "-P", group, ctx.build_prefix)),
                    Run((*owned, "-exec", "chgrp", group, "{}", "+"))]
    actions += [Run(("chmod", "-R", mode, ctx.build_prefix)), Run((*owned, "-exec", "chmod", mode, "{}", "+"))]
    return actions
