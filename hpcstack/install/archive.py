"""Archive safety: what ``hpcstack action unpack`` and :class:`hpcstack.install.actions.Unpack`
unpack, and what they refuse.

An sdist is a tar archive from the network, unpacked as root: every member is checked on the
archive's own tree before anything is written (:func:`unsafe_members`, the rules of Python's
``tarfile`` ``data`` filter), and what is unpacked gets the unpacking user's ownership and no
set-id bits (:func:`safe_unpack`).
"""

from __future__ import annotations

import os
import shutil
import tarfile

from hpcstack.errors import HpcstackError

#: Symbolic links followed while resolving one name before the name is refused as a loop
#: (Linux's own limit, ``MAXSYMLINKS``).
_MAX_LINK_HOPS = 40


def _resolve_in_archive(name: str, links: dict[str, str], follow_last: bool = True) -> list[str] | None:
    """Resolve a relative name inside the unpacked tree, following the archive's own symbolic links.

    Nothing of the filesystem is read: the tree is the archive's, whose links are ``links``
    (resolved location -> link target). A ``..`` that would leave the root, an absolute link
    target or more than :data:`_MAX_LINK_HOPS` links give None, even where a later component would
    come back inside (the strict reading).

    Args:
        name (str): a member's name or a link target joined to its directory ("a/b/../c").
        links (dict[str, str]): the symbolic links unpacked so far, by resolved location.
        follow_last (bool): follow a link in the last component too (False for the location
            where a link or hard link is created: tarfile replaces what is there).

    Returns:
        list[str] | None: the resolved components below the root, or None when the name leaves it.
    """
    todo = list(reversed(name.split("/")))
    cur: list[str] = []
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not cur:
                return None
            cur.pop()
            continue
        cur.append(part)
        target = links.get("/".join(cur))
        if target is not None and (todo or follow_last):
            hops += 1
            if hops > _MAX_LINK_HOPS or target.startswith("/"):
                return None
            cur.pop()
            todo.extend(reversed(target.split("/")))
    return cur


def unsafe_member(member: tarfile.TarInfo, dest: str, links: dict[str, str] | None = None) -> str | None:
    """Return why ``member`` may not be unpacked into ``dest``, or None when it may.

    The rules of ``tarfile.data_filter`` (Python >= 3.11.4), applied to the archive's own tree
    rather than to the filesystem (so that links unpacked earlier count before they exist): an
    absolute name, a name that leaves ``dest`` (``..``, or through one of the archive's symbolic
    links, as in ``a -> .``, ``a/b -> ..``, ``a/b/x``), a symbolic link that is absolute or leads
    outside ``dest``, a hard link to a path outside ``dest``, a device file or FIFO.

    Args:
        member (tarfile.TarInfo): the member.
        dest (str): the directory being unpacked into (only named in messages).
        links (dict[str, str] | None): the archive's symbolic links unpacked before this member,
            by resolved location (see :func:`unsafe_members`); None for none.
    """
    links = links or {}
    if member.name.startswith("/") or os.path.isabs(member.name):
        return "an absolute path"
    is_link = member.issym() or member.islnk()
    where = _resolve_in_archive(member.name, links, follow_last=not is_link)
    if where is None:
        return "a path outside the directory"
    if is_link and not where:
        return "a link in place of the directory itself"
    if not is_link and "/".join(_resolve_in_archive(member.name, links, follow_last=False) or []) in links:
        return "a member in place of one of the archive's symbolic links"
    if member.issym():
        if member.linkname.startswith("/"):
            return f"a symbolic link to the absolute path {member.linkname!r}"
        target = "/".join([*where[:-1], member.linkname])
        if _resolve_in_archive(target, {**links, "/".join(where): member.linkname}) is None:
            return f"a symbolic link outside the directory ({member.linkname!r})"
    if member.islnk() and (member.linkname.startswith("/") or _resolve_in_archive(member.linkname, links) is None):
        return f"a hard link outside the directory ({member.linkname!r})"
    if member.isdev():
        return "a device file or FIFO"
    return None


def unsafe_members(members: list[tarfile.TarInfo], dest: str) -> tuple[tarfile.TarInfo, str] | None:
    """Return the first member that may not be unpacked into ``dest`` and why, or None.

    Two passes over the archive's own tree (nothing of the filesystem is read, so this is the
    same on every Python version, with or without tarfile's extraction filters):

    1. in archive order, each member against the symbolic links unpacked before it (what the
       filesystem holds when tarfile writes that member): :func:`unsafe_member`;
    2. every symbolic and hard link again against all of the archive's links (the finished tree
       that the build then reads and writes).

    Args:
        members (list[tarfile.TarInfo]): the archive's members, in order.
        dest (str): the directory being unpacked into.

    Returns:
        tuple[tarfile.TarInfo, str] | None: the member and the reason, e.g.
        ``(<a/b/x>, "a path outside the directory")``.
    """
    links: dict[str, str] = {}
    for m in members:
        reason = unsafe_member(m, dest, links)
        if reason:
            return m, reason
        if m.issym():   # a link in place of an earlier one replaces it, as tarfile does
            links["/".join(_resolve_in_archive(m.name, links, follow_last=False))] = m.linkname
        elif m.islnk():
            links.pop("/".join(_resolve_in_archive(m.name, links, follow_last=False)), None)
    for m in members:
        if m.issym():
            where = _resolve_in_archive(m.name, links, follow_last=False)
            target = "/".join([*(where or [""])[:-1], m.linkname])
            if where is None or _resolve_in_archive(target, links) is None:
                return m, f"a symbolic link outside the directory ({m.linkname!r})"
        if m.islnk() and _resolve_in_archive(m.linkname, links) is None:
            return m, f"a hard link outside the directory ({m.linkname!r})"
    return None


def _empty_directory(path: str) -> None:
    """Remove everything inside ``path`` (links themselves, never what they point to)."""
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)


def safe_unpack(archive: str, dest: str) -> None:
    """Unpack ``archive`` into ``dest`` (emptied first), refusing it whole if a member is unsafe.

    Every member is checked (:func:`unsafe_members`, on the archive's own tree, so the check is
    the same where Python has no extraction filters, e.g. Debian 12's 3.11.2) before anything is
    unpacked; then members are unpacked with the current user's ownership (as GNU tar's
    ``--no-same-owner``), without set-user-id, set-group-id or sticky bits and without group or
    other write permission, through tarfile's ``data`` filter where Python has it.

    Args:
        archive (str): the tar archive (compressed or not).
        dest (str): the directory; removed and made anew.

    Raises:
        HpcstackError: an unsafe member (named, with the reason), or an archive that cannot be
            read or unpacked; ``dest`` is then left empty.
    """
    shutil.rmtree(dest, ignore_errors=True)
    if os.path.lexists(dest):
        os.unlink(dest)
    os.makedirs(dest)
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            bad = unsafe_members(members, dest)
            if bad:
                raise HpcstackError(f"{archive}: unsafe member {bad[0].name!r} ({bad[1]}); refusing to unpack")
            for m in members:
                m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
                if not m.issym():
                    m.mode &= 0o755
                    m.mode |= 0o700 if m.isdir() else 0o600
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=members, numeric_owner=True, **kwargs)
    except (tarfile.TarError, EOFError, OSError) as exc:
        _empty_directory(dest)
        raise HpcstackError(f"cannot unpack {archive}: {exc}") from None
    except BaseException:
        _empty_directory(dest)
        raise
