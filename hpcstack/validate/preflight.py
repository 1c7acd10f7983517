"""Before ``hpcstack validate`` submits: does Slurm's accounting let the submitting user run the
jobs on the account and QOS they name? And when sbatch refuses a job anyway, one line that says
which option is the likely cause.

On a cluster that enforces associations and QOS (``AccountingStorageEnforce=associations,qos``,
https://slurm.schedmd.com/slurm.conf.html#OPT_AccountingStorageEnforce) sbatch refuses a job whose
account is not one of the user's associations, or whose QOS the association does not allow, with
"Invalid account or account/partition combination specified" or "Invalid qos specification". Those
words name neither the site config's key nor what the user may use instead; this module asks
``sacctmgr`` first and says both in one line.

What it reads (``sacctmgr -nP``: no header, fields separated by ``|``, sacctmgr(1)):

* :func:`association_command`: ``sacctmgr -nP show user <user> withassoc
  format=User,DefaultAccount,Cluster,Account,Partition,QOS,DefaultQOS``, one line per
  association of the user (``DefaultAccount`` is a field of the user, not of the association:
  ``show assoc`` cannot give it, ``show user … withassoc`` gives both). An empty ``Partition``
  is an association for every partition; ``QOS`` is a comma-separated list.
* :func:`qos_command`: ``sacctmgr -nP show qos format=Name``, the QOS that exist.

The parsing and the rule are pure functions (:func:`parse_associations`,
:func:`check_associations`, :func:`sbatch_refusal`); :func:`preflight` runs the commands.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

from hpcstack.fsutil import CHILD_CWD

#: The fields :func:`association_command` asks for, in this order.
ASSOCIATION_FIELDS = ("User", "DefaultAccount", "Cluster", "Account", "Partition", "QOS", "DefaultQOS")
#: The QOS a job gets when neither it nor its association names one (Slurm creates ``normal`` and
#: uses it as the default: https://slurm.schedmd.com/qos.html).
SLURM_DEFAULT_QOS = "normal"

ACCOUNT_KEY = "--account (slurm.account)"
QOS_KEY = "--qos (slurm.qos)"
PARTITION_KEY = "--partition (slurm.partition)"


def association_command(user: str, cluster: str | None = None) -> list[str]:
    """``sacctmgr -nP show user <user> withassoc [where cluster=<cluster>] format=…``
    (:data:`ASSOCIATION_FIELDS`)."""
    where = ["where", f"cluster={cluster}"] if cluster else []
    return ["sacctmgr", "-nP", "show", "user", user, "withassoc", *where,
            "format=" + ",".join(ASSOCIATION_FIELDS)]


def qos_command() -> list[str]:
    """``sacctmgr -nP show qos format=Name``: the QOS names, one a line."""
    return ["sacctmgr", "-nP", "show", "qos", "format=Name"]


@dataclass(frozen=True)
class Association:
    """One line of :func:`association_command`'s output.

    Attributes:
        user, default_account, cluster, account (str): as sacctmgr prints them (lower case).
        partition (str): empty for an association that holds for every partition.
        qos (tuple[str, ...]): the QOS the association allows.
        default_qos (str): its default QOS; empty when it has none.
    """

    user: str
    default_account: str
    cluster: str
    account: str
    partition: str
    qos: tuple[str, ...]
    default_qos: str


def parse_associations(text: str) -> list[Association]:
    """Parse ``sacctmgr -nP show user U withassoc format=`` :data:`ASSOCIATION_FIELDS` output.

    Lines of another shape, and lines without an account (a user listed without associations),
    are left out.

    Example:
        >>> [a.qos for a in parse_associations("alice|proj1|twin|proj1||gpu,short|gpu\\n")]
        [('gpu', 'short')]
    """
    found = []
    for line in text.splitlines():
        parts = line.rstrip("\n").split("|")
        if len(parts) != len(ASSOCIATION_FIELDS) or not parts[3].strip():
            continue
        user, default_account, cluster, account, partition, qos, default_qos = (p.strip() for p in parts)
        found.append(Association(user, default_account.lower(), cluster, account.lower(), partition,
                                 tuple(q.strip().lower() for q in qos.split(",") if q.strip()),
                                 default_qos.lower()))
    return found


def parse_qos_names(text: str) -> set[str]:
    """The QOS names of ``sacctmgr -nP show qos format=Name`` (one a line)."""
    return {line.split("|")[0].strip().lower() for line in text.splitlines() if line.strip()}


def _names(values) -> str:
    return ", ".join(sorted(values)) or "none"


def check_associations(user: str, account: str | None, partition: str | None, qos: str | None,
                       assoc_text: str, qos_text: str = "", cluster: str | None = None) -> list[str]:
    """Would Slurm's accounting accept a job of ``user`` on ``account``, ``partition``, ``qos``?

    The account is the one given, else the user's default account (``DefaultAccount``). It must
    be one of the user's associations (on ``partition`` where the user's associations of that
    account name partitions). The QOS (given, else the association's ``DefaultQOS``, else Slurm's
    ``normal``) must exist and be one the association allows.

    Args:
        user (str): the user who submits (``slurm.submit_as`` when hpcstack runs as root).
        account (str | None): ``--account``/``slurm.account`` (or ``SBATCH_ACCOUNT``); None:
            the user's default.
        partition (str | None): the partition the job names; None: the cluster's default (no
            partition check).
        qos (str | None): ``--qos``/``slurm.qos``; None: the association's default.
        assoc_text (str): :func:`association_command`'s output.
        qos_text (str): :func:`qos_command`'s output; empty: existence is not checked.
        cluster (str | None): keep only associations of this cluster; None: all.

    Returns:
        list[str]: one line per problem, each naming ``--account (slurm.account)``,
        ``--partition (slurm.partition)`` or ``--qos (slurm.qos)`` and what the user's
        associations allow; empty when the job would be accepted.

    Example:
        >>> check_associations("alice", "proj9", None, None, "alice|proj1|c|proj1||normal|\\n")
        ["--account (slurm.account): user alice has no association with account 'proj9' (alice's accounts: proj1; default: proj1)"]
    """
    rows = [a for a in parse_associations(assoc_text)
            if a.user == user and (cluster is None or a.cluster in ("", cluster))]
    if not rows:
        return [f"{ACCOUNT_KEY}: user {user} has no association in Slurm's accounting, so Slurm "
                f"refuses every job of {user}; ask the site to add {user} to an account"]
    accounts = {a.account for a in rows}
    default = next((a.default_account for a in rows if a.default_account), "")
    allowed_accounts = f"{user}'s accounts: {_names(accounts)}; default: {default or 'none'}"
    if account is None:
        if not default:
            return [f"{ACCOUNT_KEY}: no account given and user {user} has no default account "
                    f"({allowed_accounts}); give --account"]
        account, given = default, False
    else:
        account, given = account.lower(), True
    mine = [a for a in rows if a.account == account]
    if not mine:
        return [f"{ACCOUNT_KEY}: user {user} has no association with account {account!r} "
                f"({allowed_accounts})"]
    where = f"account {account!r}" + ("" if given else f" ({user}'s default)")
    if partition:
        exact = [a for a in mine if a.partition == partition]
        mine = exact or [a for a in mine if not a.partition]
        if not mine:
            parts = {a.partition for a in rows if a.account == account}
            return [f"{PARTITION_KEY}: user {user}'s {where} is associated with partition(s) "
                    f"{_names(parts)} only, not {partition!r}"]
        where += f" on partition {partition!r}"
    allowed = {q for a in mine for q in a.qos}
    defaults = {a.default_qos for a in mine if a.default_qos}
    existing = parse_qos_names(qos_text)
    if qos is not None:
        qos = qos.lower()
        if existing and qos not in existing:
            return [f"{QOS_KEY}: QOS {qos!r} does not exist (the cluster's QOS: {_names(existing)})"]
        if allowed and qos not in allowed:
            return [f"{QOS_KEY}: QOS {qos!r} is not allowed for user {user} in {where} "
                    f"(allowed: {_names(allowed)}; default: {_names(defaults)})"]
        return []
    effective = next(iter(sorted(defaults)), SLURM_DEFAULT_QOS)
    if allowed and effective not in allowed:
        return [f"{QOS_KEY}: no QOS given, and the default {effective!r} is not allowed for user {user} "
                f"in {where} (allowed: {_names(allowed)}); give --qos"]
    return []


#: Words of Slurm's refusals -> the option that is the likely cause (first match wins). From
#: Slurm's error strings (``src/common/slurm_errno.c``: ESLURM_INVALID_ACCOUNT "Invalid account
#: or account/partition combination specified", ESLURM_INVALID_QOS "Invalid qos specification",
#: ESLURM_INVALID_PARTITION_NAME, ESLURM_INVALID_GRES, ESLURM_INVALID_FEATURE,
#: ESLURM_INVALID_TIME_LIMIT, ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE, ESLURM_ACCOUNTING_POLICY)
#: and from what a site's job_submit filter says (Cirrus refuses ``--ntasks``/``--cpus-per-task``
#: as #SBATCH options on GPU jobs, and ``--mem``).
REFUSAL_CAUSES = (
    (r"ntasks|cpus-per-task|tasks per node", "slurm.task_options / slurm.tasks_per_node / slurm.cpus_per_task"),
    (r"--mem\b|memory", "the job's memory request (slurm.mem / slurm.mem_per_cpu / slurm.mem_per_gpu, "
                         "or the cluster's default where none is set)"),
    (r"qos", QOS_KEY),
    (r"account|budget|association", ACCOUNT_KEY),
    (r"partition", PARTITION_KEY),
    (r"gres|generic resource|gpus-per|gpu:", "slurm.gpus_per_node / slurm.gpu_request"),
    (r"feature|constraint", "slurm.constraint"),
    (r"time limit", "slurm.time_limit"),
    (r"node configuration|node count", "--nodes / slurm.tasks_per_node / slurm.cpus_per_task / slurm.gpus_per_node"),
    (r"policy|limit", "--qos (slurm.qos) / slurm.time_limit / --nodes"),
)


def sbatch_refusal(stderr: str, returncode: int = 1) -> str:
    """One line for a job sbatch refused: ``sbatch refused the job: <Slurm's message> (likely
    cause: <option>)``.

    Slurm's message is sbatch's error lines without their ``sbatch: error:`` prefix, joined with
    ``; ``; the option is the first of :data:`REFUSAL_CAUSES` whose words the message holds
    (none named when none matches).

    Example:
        >>> sbatch_refusal("sbatch: error: Batch job submission failed: Invalid qos specification\\n")
        'sbatch refused the job: Batch job submission failed: Invalid qos specification (likely cause: --qos (slurm.qos))'
    """
    lines = []
    for line in stderr.splitlines():
        text = re.sub(r"^\s*sbatch:\s*(error|fatal)?:?\s*", "", line).strip()
        text = " ".join(text.split())
        if text and text not in lines:
            lines.append(text)
    message = "; ".join(lines)[:800] or f"exit status {returncode}"
    cause = next((option for words, option in REFUSAL_CAUSES if re.search(words, message, re.I)), None)
    return f"sbatch refused the job: {message}" + (f" (likely cause: {cause})" if cause else "")


def preflight(user: str, account: str | None, partition: str | None, qos: str | None, *,
              run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
              which: Callable[[str], str | None] = shutil.which) -> tuple[list[str], str | None]:
    """Ask ``sacctmgr`` and check the associations (:func:`check_associations`).

    Args:
        user (str): the submitting user.
        account, partition, qos (str | None): what the job will name (None: Slurm's default).
        run (Callable): ``subprocess.run`` or a stand-in.
        which (Callable): ``shutil.which`` or a stand-in.

    Returns:
        tuple[list[str], str | None]: the problems (one line each), and a note when the check
        could not run (no ``sacctmgr``, or it failed: no slurmdbd); then sbatch has the last word.
    """
    if not which("sacctmgr"):
        return [], "sacctmgr not found: the account and QOS are not checked before submitting"

    def ask(argv: list[str]) -> subprocess.CompletedProcess | None:
        try:
            return run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       cwd=CHILD_CWD, env={**os.environ, "LC_ALL": "C"})
        except (OSError, subprocess.SubprocessError):
            return None

    assoc = ask(association_command(user, _cluster_name(ask)))
    if assoc is None or assoc.returncode != 0:
        why = " ".join((assoc.stderr if assoc is not None else "did not run").split())[:200]
        return [], f"sacctmgr could not list {user}'s associations ({why}): not checked before submitting"
    names = ask(qos_command())
    qos_text = names.stdout if names is not None and names.returncode == 0 else ""
    return check_associations(user, account, partition, qos, assoc.stdout, qos_text), None


def _cluster_name(ask: Callable[[list[str]], subprocess.CompletedProcess | None]) -> str | None:
    """``ClusterName`` of ``scontrol show config``; None when it cannot be read."""
    done = ask(["scontrol", "show", "config"])
    if done is None or done.returncode != 0:
        return None
    match = re.search(r"^ClusterName\s*=\s*(\S+)\s*$", done.stdout, re.M)
    return match.group(1) if match else None
