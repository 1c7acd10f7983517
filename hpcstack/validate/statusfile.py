"""The status file that ``module load`` reads: one line per DEGRADED or FAILED stack.

Where (:func:`status_file_path`): ``<module_root>/.hpcstack-status.json``, beside the
modulefiles that read it (a dot file: neither Environment Modules nor Lmod takes it for a
module); on a site that names ``revalidation.state_dir``, ``<state_dir>/status/<site>.json``
instead: the scheduled runs record from the compute nodes, which may see the module root
read-only (Perlmutter's ``/global/common/software``) but write the state directory. The
modulefiles name the path of their site's config when they were written (a module root's
file that older modulefiles read is still rewritten where it can be). Who writes: root,
through the gate (:func:`hpcstack.gate.write_atomic`, 0644, its directory 0755), after each run
recorded in the site's history (:func:`hpcstack.validate.history.record_validation`) and on each
``hpcstack status`` as root (:func:`write_status_file`). Who reads: every generated
modulefile, on load only, with the module tool's own file reading (Tcl ``open``/``read`` in a
``catch``; Lua ``io.open`` in ``pcall``): it finds the line of its own stack and prints
``NAME/VERSION: FAILED since 2026-11-29 (hpcstack status for details)``; nothing when the file
is missing, unreadable, or does not name the stack.

The file is JSON, and tiny, in a fixed shape a modulefile can search without a JSON parser
(:func:`render`): one stack per line, ``"NAME/VERSION": "VERDICT since DATE",``.
"""

from __future__ import annotations

import errno
import os

from hpcstack.modules.writer import STATUS_FILE  # the name the modulefiles read
from hpcstack.site import status_file_path  # where it is (the modulefiles name it too)

#: At most this many bytes are read by a modulefile.
MAX_READ = 65536
#: The verdicts a load line is printed for, worst first.
SHOWN = ("FAILED", "DEGRADED")


def stack_lines(verdicts: list) -> dict[str, str]:
    """``{stack: "VERDICT since YYYY-MM-DD"}`` for each stack with a DEGRADED or FAILED tier
    (:class:`~hpcstack.validate.verdict.StackVerdict`): the worst tier's, since its start."""
    out: dict[str, tuple[int, str]] = {}
    for v in verdicts:
        if v.verdict not in SHOWN:
            continue
        rank = SHOWN.index(v.verdict)
        text = v.verdict + (f" since {v.since[:10]}" if v.since else "")
        if v.stack not in out or rank < out[v.stack][0]:
            out[v.stack] = (rank, text)
    return {stack: text for stack, (_, text) in sorted(out.items())}


def render(lines: dict[str, str], generated: str) -> str:
    """The file's text: JSON, one stack per line (what the modulefiles search for)."""
    import json

    body = ",\n".join(f"{json.dumps(stack)}: {json.dumps(text)}" for stack, text in lines.items())
    return ('{"generated": ' + json.dumps(generated) + ', "stacks": {'
            + (f"\n{body}\n" if body else "") + "}}\n")


def write_status_file(site, runs: list | None = None, pol=None) -> str | None:
    """As root: write the site's status file (:func:`status_file_path`) from its history
    (``runs``, else read). Returns the path written; None as another user, or without a module
    root where the file goes there.

    Raises:
        GateError: the file or a directory above it is not root's to write (the gate).
        OSError: it cannot be written (a read-only module root, seen from a compute node).
    """
    from hpcstack import gate
    from hpcstack.validate import history, verdict

    path = status_file_path(site)
    if os.geteuid() != 0 or not getattr(site, "module_root", None):
        return None
    if path == os.path.join(site.module_root, STATUS_FILE):       # in the module root: only where it is
        if not os.path.isdir(site.module_root):
            return None
    else:
        gate.mkdir(os.path.dirname(path), 0o755, parents=True, pol=pol)
    if runs is None:
        runs = history.read_runs(history.history_path(site), pol)
    text = render(stack_lines(verdict.site_verdicts(site, runs)), history.now_iso())
    gate.write_atomic(path, text, 0o644, pol=pol)
    legacy = os.path.join(site.module_root, STATUS_FILE)
    if path != legacy and os.path.isfile(legacy):
        # modulefiles written before the site named its state_dir read this one: kept up to
        # date where it can be written (a login node), left as it is where the module root is
        # read-only (a compute node)
        try:
            gate.write_atomic(legacy, text, 0o644, pol=pol)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
    return path
