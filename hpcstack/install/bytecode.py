"""The bytecode of a stack's venv: ``.pyc`` files that name their source by its hash, not by its
modification time, so that the same files at the same path give the same bytes.

A ``.pyc`` Python writes by default (PEP 552 "timestamp") holds its source's modification time
and size: two installs of the same wheels compile different bytes wherever the sources were
unpacked at another time (another wheel cache, a bundle, an image), and a delivery compared file
by file then differs in its bytecode alone. hpcstack compiles the venv's bytecode
``unchecked-hash`` (PEP 552): the header holds the source's hash, and Python does not read the
source at import to check it (the same files opened as with a timestamp ``.pyc``: one ``stat`` of
the source, one read of the ``.pyc``; ``checked-hash`` would read and hash every source at every
import). A stack does not change after its install (a new build is a new directory), so nothing
checks it; a step that changes a ``.py`` of the venv after the packages are installed compiles it
again (:func:`compile_tree`), and ``python --check-hash-based-pycs always`` checks every source
against its ``.pyc`` when in doubt.

Who compiles: uv's ``--compile-bytecode`` with ``PYC_INVALIDATION_MODE=UNCHECKED_HASH``
(:data:`hpcstack.install.components.wheels.UV_BYTECODE_ENV`); with the pip backend and for
``installer.optimization_levels``, this module run by the venv's Python after the last package
(:func:`hpcstack.install.components.wheels.compile_run`). The bytes still hold each source's path
(``co_filename``, for tracebacks): two stacks at two prefixes differ there, which is why
``hpcstack compare`` leaves ``.pyc`` out.

This file is run as a script by the venv's Python (``python -I -B bytecode.py …``): it imports
the standard library alone.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a script: no other file of hpcstack/install may shadow a module it imports

import compileall  # noqa: E402
import py_compile  # noqa: E402

#: The invalidation mode of the venv's ``.pyc`` (PEP 552), as uv's ``PYC_INVALIDATION_MODE`` names it.
MODE_NAME = "UNCHECKED_HASH"


def sources(paths: list[str]) -> list[str]:
    """Every ``*.py`` file under ``paths`` (a file named there counts itself), in sorted order;
    links to directories are not followed, as ``compileall`` does not follow them.

    Args:
        paths (list[str]): directories (a venv's ``site-packages``) or files.

    Returns:
        list[str]: the files' paths.
    """
    found = []
    for top in paths:
        if os.path.isfile(top):
            found.append(top)
            continue
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not os.path.islink(os.path.join(root, d)))
            found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    return found


def _compile_one(args: tuple[str, tuple[int, ...]]) -> bool:
    path, levels = args
    return bool(compileall.compile_file(path, quiet=2, force=True, optimize=list(levels),
                                        invalidation_mode=py_compile.PycInvalidationMode[MODE_NAME]))


def compile_tree(paths: list[str], levels: tuple[int, ...] = (0,), workers: int = 1) -> tuple[int, list[str]]:
    """Compile every ``*.py`` under ``paths`` for each optimisation level in ``levels``
    (``__pycache__/NAME.cpython-XY[.opt-N].pyc``), ``unchecked-hash``, rewriting any ``.pyc``
    already there (a timestamp one an import wrote, too).

    A file that does not compile (Python 2 code a wheel vendors, say) is skipped and named in the
    result, as pip and uv skip it at install; Python compiles it in memory if it is ever imported.

    Args:
        paths (list[str]): directories or files.
        levels (tuple[int, ...]): optimisation levels: 0 (plain), 1 (``python -O``), 2 (``-OO``).
        workers (int): processes compiling at once (at least 1).

    Returns:
        tuple[int, list[str]]: how many files were compiled, and the files that were not.

    Raises:
        ValueError: a level other than 0, 1 or 2, or no level.
    """
    if not levels or any(level not in (0, 1, 2) for level in levels):
        raise ValueError(f"optimisation levels must be 0, 1 or 2, not {list(levels)}")
    files = sources(paths)
    jobs = [(f, tuple(sorted(set(levels)))) for f in files]
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_compile_one, jobs, chunksize=64))
    else:
        results = [_compile_one(job) for job in jobs]
    failed = [f for f, ok in zip(files, results) if not ok]
    return len(files) - len(failed), failed


def main(argv: list[str] | None = None) -> int:
    """``python bytecode.py [-j N] [-o LEVEL]... PATH...``: :func:`compile_tree`, then one line
    (``bytecode: N files compiled (unchecked-hash), levels 0, 1``) and one line per file that did
    not compile. Exit 0, or 2 for bad arguments or a path that does not exist."""
    import argparse

    parser = argparse.ArgumentParser(prog="bytecode.py", description=__doc__.splitlines()[0])
    parser.add_argument("-j", dest="workers", type=int, default=1, help="processes (default 1)")
    parser.add_argument("-o", dest="levels", type=int, action="append", choices=(0, 1, 2),
                        help="optimisation level (repeat; default 0)")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        print(f"bytecode.py: error: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    levels = tuple(sorted(set(args.levels or [0])))
    done, failed = compile_tree(args.paths, levels, max(1, args.workers))
    print(f"bytecode: {done} files compiled ({MODE_NAME.lower().replace('_', '-')}), "
          f"level{'s' if len(levels) > 1 else ''} {', '.join(map(str, levels))}")
    for path in failed:
        print(f"bytecode: not compiled (left to Python at import): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
