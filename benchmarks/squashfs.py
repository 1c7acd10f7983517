#!/usr/bin/env python3
"""Metadata calls of ``import torch, horovod.torch`` from a stack's venv on disk and from its
squashfs image (``layout: squashfs``).

On a parallel file system every ``stat``/``openat``/``readlink`` that names a path on it is a round
trip to the metadata server. This script takes an installed stack read-only (default: the
end-to-end stack's published build), packs its venv with ``mksquashfs`` as the install's
``image`` step does, mounts the image with ``squashfuse`` at a path as deep as the build's venv
(the image holds the venv; run through its own ``bin/python``, which finds its ``pyvenv.cfg``
beside it), and counts the metadata calls of the import both ways (``strace -f``): in total,
on paths inside the venv (its directory on disk; the mounted image) and on paths elsewhere
(the base Python's standard library, ``/proc``, ``/etc``…). Calls inside the image are answered
on the node by the kernel and squashfuse; the parallel file system serves only the image file.

It prints a table and the ratios, and with ``--json FILE`` writes the figures. The image goes
under ``--root`` (default /var/tmp/squashfs-bench, about 4 GB for the PyTorch stack) and is
unmounted and removed at the end unless ``--keep``. Needs root (or ``/dev/fuse`` and
``user_allow_other``), ``mksquashfs``, ``squashfuse`` and ``strace``. Takes 3–6 minutes on a
loaded 2-core machine, most of it ``mksquashfs -processors 1``.

Usage:
    python3 benchmarks/squashfs.py [--stack /var/tmp/hpcstack-e2e/software/pytorch/2.3.1-gpu]
                                   [--root DIR] [--comp lz4] [--processors 1] [--runs 5] [--keep]
                                   [--raw FILE]

The import's wall time runs ``--runs`` rounds once the image is mounted, alternating the venv on
disk and the image, and prints the median and spread of each and of their ratio per round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from install import IMPORT, OPEN_CALLS, READLINK_CALLS, STAT_CALLS, clean_env  # noqa: E402
from stats import fmt, load_average, ratios  # noqa: E402

DEFAULT_STACK = "/var/tmp/hpcstack-e2e/software/pytorch/2.3.1-gpu"


def log(msg: str) -> None:
    print(f"[squashfs] {msg}", file=sys.stderr, flush=True)


def count_calls(trace: Path, inside: list[str], fs_top: str) -> dict:
    """Count the metadata calls of an ``strace -f`` log, in total and by kind, and by where the
    path they name lies: ``inside`` the venv (on disk, or the mounted image), elsewhere on the
    stack's file system (under ``fs_top``, the directory that stands for the parallel file
    system: the directories above the venv, which every ``realpath`` walks), or on the node's
    own (``/usr``, ``/etc``, ``/proc``…); with the distinct paths of each. Calls on a file
    descriptor alone (``fstat``, ``newfstatat(fd, "", …, AT_EMPTY_PATH)``) are counted apart."""
    calls = {"open": 0, "stat": 0, "readlink": 0, "inside": 0, "fs_outside": 0, "node": 0, "fd_only": 0}
    distinct: dict[str, set] = {"inside": set(), "fs_outside": set(), "node": set()}

    def under(path: str, roots: list[str]) -> bool:
        return any(path == r.rstrip("/") or path.startswith(r.rstrip("/") + "/") for r in roots)

    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"^(?:\[pid\s+)?\d*\]?\s*(\w+)\(", line)
        if not m:
            continue
        call = m.group(1)
        kind = ("open" if call in OPEN_CALLS else "stat" if call in STAT_CALLS
                else "readlink" if call in READLINK_CALLS else None)
        if not kind:
            continue
        calls[kind] += 1
        p = re.search(r'"([^"]*)"', line)
        if not p or not p.group(1):
            calls["fd_only"] += 1
            continue
        path = p.group(1)
        where = "inside" if under(path, inside) else "fs_outside" if under(path, [fs_top]) else "node"
        calls[where] += 1
        distinct[where].add(path)
    calls["metadata"] = calls["open"] + calls["stat"] + calls["readlink"]
    for where, paths in distinct.items():
        calls[f"{where}_paths"] = len(paths)
    return calls


def traced_import(python: str, out: Path, inside: list[str], fs_top: str) -> dict:
    """``strace -f`` one ``python -c IMPORT`` and count its calls (:func:`count_calls`)."""
    names = ",".join(sorted(OPEN_CALLS | STAT_CALLS | READLINK_CALLS))
    subprocess.run(["strace", "-f", "-qq", "-e", f"trace={names}", "-o", str(out), python, "-c", IMPORT],
                   check=True, env=clean_env(PYTHONNOUSERSITE="1"), cwd="/")
    return count_calls(out, inside, fs_top)


def wall_once(python: str) -> float:
    """Wall seconds of one import with ``python``."""
    t0 = time.monotonic()
    subprocess.run([python, "-c", IMPORT], check=True, env=clean_env(PYTHONNOUSERSITE="1"), cwd="/")
    return time.monotonic() - t0


def wall_alternating(disk: str, image: str, runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds of ``runs`` rounds of the import from disk and from the image, alternating
    which goes first (round 1 disk then image, round 2 image then disk, ...)."""
    on_disk, on_image = [], []
    for i in range(runs):
        for which in (("disk", "image") if i % 2 == 0 else ("image", "disk")):
            if which == "disk":
                on_disk.append(wall_once(disk))
            else:
                on_image.append(wall_once(image))
    return on_disk, on_image


def count_tree(path: str) -> tuple[int, int]:
    """(files and links, directories) under ``path``."""
    files = dirs = 0
    for _, dnames, fnames in os.walk(path):
        dirs += len(dnames)
        files += len(fnames)
    return files, dirs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default=DEFAULT_STACK, help="a stack's prefix (its published build is used)")
    ap.add_argument("--root", default="/var/tmp/squashfs-bench", help="where the image and traces go")
    ap.add_argument("--comp", default="lz4", help="mksquashfs -comp (as the site's squashfs.compression)")
    ap.add_argument("--processors", type=int, default=1, help="mksquashfs -processors")
    ap.add_argument("--runs", type=int, default=5, help="alternating rounds of the timed import, each way")
    ap.add_argument("--raw", metavar="FILE", help="also write the printed report to FILE")
    ap.add_argument("--fs-top", help="the directory that stands for the parallel file system (default: the "
                    "fifth directory above the build, /var for /var/tmp/hpcstack-e2e/software/pytorch/<build>)")
    ap.add_argument("--keep", action="store_true", help="leave the image mounted and in place")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args()
    for tool in ("mksquashfs", "squashfuse", "strace", "mountpoint"):
        if not shutil.which(tool):
            sys.exit(f"{tool} missing (apt-get install squashfs-tools squashfuse fuse3 strace)")
    build = os.path.realpath(args.stack)
    venv = os.path.join(build, "venv")
    if not os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        sys.exit(f"{venv}: no venv there (is {args.stack} installed?)")
    root = Path(args.root)
    # the mount point as deep as the build's venv: <root>/<the build's last 5 components>/venv
    mount = root.joinpath(*Path(build).parts[-5:], "venv")
    image = root / "venv.sqsh"
    root.mkdir(parents=True, exist_ok=True)
    # the directory above the install root stands for the parallel file system (as /work on Cirrus)
    fs_top = args.fs_top or str(Path(build).parents[4])
    figures: dict = {"fs_top": fs_top, "stack": args.stack, "build": build, "comp": args.comp, "processors": args.processors}
    figures["venv_files"], figures["venv_dirs"] = count_tree(venv)
    log(f"before: import from {venv} on disk (strace) …")
    figures["before"] = traced_import(os.path.join(args.stack, "venv", "bin", "python"), root / "strace-before.txt",
                                      [venv, os.path.join(args.stack, "venv")], fs_top)
    try:
        if subprocess.run(["mountpoint", "-q", str(mount)]).returncode != 0:
            log(f"mksquashfs {venv} -comp {args.comp} -processors {args.processors} …")
            t0 = time.monotonic()
            subprocess.run(["mksquashfs", venv, str(image), "-noappend", "-comp", args.comp, "-processors",
                            str(args.processors), "-quiet", "-no-progress"], check=True)
            figures["mksquashfs_s"] = round(time.monotonic() - t0, 1)
            mount.mkdir(parents=True, exist_ok=True)
            subprocess.run(["squashfuse", "-o", "ro,allow_other,default_permissions", str(image), str(mount)],
                           check=True)
        figures["image_bytes"] = image.stat().st_size
        log(f"after: import from the image mounted at {mount} (strace) …")
        python = str(mount / "bin" / "python")
        figures["after"] = traced_import(python, root / "strace-after.txt", [str(mount)], str(root))
        log(f"wall time: {args.runs} rounds, disk and image alternating …")
        figures["before_wall"], figures["after_wall"] = wall_alternating(
            os.path.join(args.stack, "venv", "bin", "python"), python, args.runs)
    finally:
        if not args.keep:
            subprocess.run(["fusermount3", "-u", str(mount)], check=False)
            image.unlink(missing_ok=True)
    before, after = figures["before"], figures["after"]
    lines: list[str] = []
    out = lines.append
    out(f"stack {args.stack} -> {build}")
    out(f"venv: {figures['venv_files']:,} files, {figures['venv_dirs']:,} directories")
    if "mksquashfs_s" in figures:
        out(f"mksquashfs -comp {args.comp} -processors {args.processors}: {figures['mksquashfs_s']} s, "
              f"image {figures['image_bytes'] / 1e9:.2f} GB")
    out(f"{'import torch, horovod.torch':34} {'on disk':>10} {'image':>10}")
    for key in ("metadata", "open", "stat", "readlink", "fd_only", "inside", "inside_paths", "fs_outside",
                "fs_outside_paths", "node", "node_paths"):
        out(f"  {key:32} {before[key]:>10,} {after[key]:>10,}")
    out(f"  {'wall s (median)':32} {statistics.median(figures['before_wall']):>10.2f} "
          f"{statistics.median(figures['after_wall']):>10.2f}")
    out(f"  wall on disk:  {fmt(figures['before_wall'])}")
    out(f"  wall in image: {fmt(figures['after_wall'])}")
    out(f"  image / disk per round: {fmt(ratios(figures['before_wall'], figures['after_wall']), 'x')}; "
        f"load after: {load_average()}")
    on_fs = (before["inside"] + before["fs_outside"], after["fs_outside"])
    on_fs_paths = (before["inside_paths"] + before["fs_outside_paths"], after["fs_outside_paths"])
    out(f"on the stack's file system ({fs_top} and the like): {on_fs[0]:,} calls on {on_fs_paths[0]:,} "
          f"paths before, {on_fs[1]:,} calls on {on_fs_paths[1]:,} paths with the image "
          f"({on_fs[1] / max(on_fs[0], 1):.0%} of the calls, {on_fs_paths[1] / max(on_fs_paths[0], 1):.1%} "
          f"of the paths); {after['inside']:,} calls are answered inside the image, on the node")
    print("\n".join(lines))
    if args.raw:
        Path(args.raw).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
