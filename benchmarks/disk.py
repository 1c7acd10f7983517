#!/usr/bin/env python3
"""Files, directories and bytes of an installed stack and of the uv cache it hard-links from.

A big site's parallel file system pays per file and per directory (docs/benchmarks.md, "Big
sites"). For each tree given it prints the regular files, the directories and the size (each
inode counted once), and for the stack the bytes of its own: the files whose inode is not also
in the cache (the rest are hard links into the cache, which cost no space twice). Read-only;
counts, not timings, so one run is the figure.

Usage:
    python3 benchmarks/disk.py [--stack /opt/hpcstack/software/pytorch/2.3.1-gpu]
                               [--cache /var/cache/hpcstack/uv] [--raw FILE]

``--stack`` may be the stable prefix (a symbolic link): the build it points at is counted.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path


def walk(top: Path) -> dict:
    """Regular files, directories, bytes (each inode once) under ``top``, and its inodes.

    :param top: a directory; symbolic links inside it are not followed (nor counted as files).
    :returns: ``{"files", "dirs", "bytes", "inodes": {(dev, ino): size}}``.
    """
    files = dirs = 0
    inodes: dict[tuple[int, int], int] = {}
    for root, dirnames, filenames in os.walk(top):
        dirs += len(dirnames)
        for name in filenames:
            st = os.lstat(os.path.join(root, name))
            if not os.path.stat.S_ISREG(st.st_mode):
                continue
            files += 1
            inodes[(st.st_dev, st.st_ino)] = st.st_size
    return {"files": files, "dirs": dirs, "bytes": sum(inodes.values()), "inodes": inodes}


def main(argv: list[str] | None = None) -> int:
    """Count both trees and print one line each (also to ``--raw``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stack", default="/opt/hpcstack/software/pytorch/2.3.1-gpu")
    p.add_argument("--cache", default="/var/cache/hpcstack/uv")  # the machine's cache (root)
    p.add_argument("--raw", metavar="FILE", help="also write the report to FILE")
    args = p.parse_args(argv)
    missing = [f"disk: {x} is not a directory" for x in (args.stack, args.cache) if not Path(x).is_dir()]
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 2
    stack = Path(args.stack).resolve()
    s, c = walk(stack), walk(Path(args.cache))
    own = sum(size for key, size in s["inodes"].items() if key not in c["inodes"])
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    gb = 1e9
    lines = [f"disk: {platform.node()}; {when}",
             f"{'tree':<60} {'files':>8} {'dirs':>7} {'GB':>6}",
             f"{str(stack):<60} {s['files']:>8,} {s['dirs']:>7,} {s['bytes'] / gb:>6.2f}",
             f"{args.cache:<60} {c['files']:>8,} {c['dirs']:>7,} {c['bytes'] / gb:>6.2f}",
             f"the stack's own bytes (inodes not in the cache): {own / 1e6:,.0f} MB; "
             f"hard links into the cache: {(s['bytes'] - own) / gb:.2f} GB"]
    print("\n".join(lines))
    if args.raw:
        Path(args.raw).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
