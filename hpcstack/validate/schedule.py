"""Re-validation on a schedule: tiers, scrontab entries, missed slots, the probe's decision.

Tiers (:func:`tiers_of`): a recipe's validation file may declare ``tiers:`` (``smoke``, ``full``,
``probe``, each with ``schedule`` (a cron line's five time fields), ``nodes`` and ``workload`` (a
named workload of the file)); a tier it leaves out takes :data:`DEFAULT_TIERS`:

* ``smoke`` daily (``0 3 * * *``): one node, the recipe's ``smoke`` workload when it names one
  (sanity only: imports, collectives, a few training steps), else the site's workload;
* ``full`` weekly (``0 4 * * 0``): the recipe's node counts and workload, judged against the
  references (the validation ``hpcstack validate`` runs without ``--tier``);
* ``probe`` every 6 hours (``30 */6 * * *``): a one-node job whose fingerprint.json is compared
  with that of the last OK ``install`` or ``full`` run (:func:`probe_decision`); when it
  differs, the ``full`` tier runs.

The schedule lives in Slurm's per-user cron, scrontab (https://slurm.schedmd.com/scrontab.html):
``#SCRON`` lines give the options of the job the next cron line starts. hpcstack's entries
(:func:`entries_text`) each begin with a :data:`MARKER` comment naming the site, stack and tier,
so that :func:`install_entries` and :func:`remove_entries` edit only hpcstack's own blocks of a
table read with ``scrontab -l`` and written back with ``scrontab FILE`` (:class:`Scrontab`); the
account's other entries stay as they were. The table is root's on every site: each run records into root's history (with ``slurm.submit_as`` the
validation jobs it submits run as that account, as ``hpcstack validate`` as root submits them). Each job runs
``python -I -m hpcstack`` with ``--chdir`` and ``--output`` in root's 0755
``<install_root>/.hpcstack/schedule/logs`` (:func:`make_log_dir`). What was installed is kept in ``<install_root>/.hpcstack/schedule/<site>.json``
(written through the gate, root only): the cron line of each stack and tier and when it was
installed, which :func:`missed_slots` reads.

Missed slots: scrontab starts no job for a slot while the previous one is pending or running,
and a down node or a full queue leaves a slot without a run. Each scheduled run and ``hpcstack
status`` compare the slots expected since the last recorded run (or the installation) with the
runs recorded, and record each slot without a run as NOT-RUN with the reason ``slot missed``
(:func:`record_missed`): never a pass.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

from hpcstack.errors import ConfigError, HpcstackError

#: The scheduled tiers and their defaults (schedule, node counts, named workload).
SCHEDULED_TIERS = ("smoke", "full", "probe")
DEFAULT_SCHEDULES = {"smoke": "0 3 * * *", "full": "0 4 * * 0", "probe": "30 */6 * * *"}
#: The first line of each of hpcstack's scrontab entries.
MARKER = "# hpcstack schedule: site {site}, stack {stack}, tier {tier}"
_MARKER_RE = re.compile(r"^# hpcstack schedule: site (\S+), stack (\S+), tier (\S+)\s*$")
#: The reason of a NOT-RUN recorded for a slot without a run.
SLOT_MISSED = "slot missed"
#: How far back missed slots are looked for (days), and at most how many are recorded at once.
MAX_LOOKBACK_DAYS = 35
MAX_MISSED = 200
#: The scrontab job's time limit: it records missed slots, submits the tier's jobs and their collector
#: job (hpcstack validate --then-collect), and ends: nothing waits on a node.
WRAPPER_TIME = "00:30:00"
#: The schedule's state file under ``<install_root>/.hpcstack``.
SCHEDULE_DIR = "schedule"
#: The jobs' output directory under the schedule's (root's, 0755): never ``slurm.output_root``,
#: where a user could plant a link at the predictable ``%j`` name that slurmstepd follows.
LOG_DIR = "logs"

_FIELD = r"(\*|[0-9]{1,2}(-[0-9]{1,2})?)(/[0-9]{1,2})?"
#: A cron line's five time fields (numbers, ranges, steps and lists; no names, no @daily).
CRON_PATTERN = rf"^{_FIELD}(,{_FIELD})*( {_FIELD}(,{_FIELD})*){{4}}$"
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


@dataclass(frozen=True)
class Tier:
    """One scheduled tier of a stack.

    Attributes:
        name (str): ``smoke``, ``full`` or ``probe``.
        schedule (str): the cron line's five time fields, in slurmctld's local time.
        nodes (tuple[int, ...]): node counts of its jobs (empty: the recipe's).
        workload (str | None): a named workload of the validation file (None: the site's).
    """

    name: str
    schedule: str
    nodes: tuple = ()
    workload: str | None = None


def tiers_of(spec, site=None) -> dict[str, Tier]:
    """The tiers of a recipe's validation (:class:`~hpcstack.install.components.validation.ValidationSpec`):
    its ``tiers`` over :data:`DEFAULT_SCHEDULES`; smoke and probe on one node by default, each
    with the workload of its own name (``smoke``, ``probe``) where the file names one. The
    site's ``revalidation.schedule`` (``site``: a :class:`~hpcstack.site.Site`, or None) sets
    a tier's cron line over both."""
    declared = dict(getattr(spec, "tiers", None) or {})
    from hpcstack.site import revalidation_of

    own = revalidation_of(site).get("schedule") or {}
    named = set(spec.names()) if hasattr(spec, "names") else set()
    defaults = {"smoke": Tier("smoke", DEFAULT_SCHEDULES["smoke"], (1,), "smoke" if "smoke" in named else None),
                "full": Tier("full", DEFAULT_SCHEDULES["full"]),
                "probe": Tier("probe", DEFAULT_SCHEDULES["probe"], (1,), "probe" if "probe" in named else None)}
    out = {}
    for name in SCHEDULED_TIERS:
        d, given = defaults[name], declared.get(name) or {}
        out[name] = Tier(name, own.get(name) or given.get("schedule", d.schedule), tuple(given.get("nodes", d.nodes)),
                         given.get("workload", d.workload))
    return out


# ----------------------------------------------------------------------------------- cron


def parse_cron(spec: str) -> tuple[set, set, set, set, set, bool, bool]:
    """The five fields of ``spec`` as sets (minute, hour, day of month, month, day of week with
    Sunday 0), and whether day of month and day of week are restricted (cron's rule: when both
    are, a day matching either runs).

    Raises:
        ConfigError: not five fields of numbers, ranges, steps and lists in range.
    """
    if not re.fullmatch(CRON_PATTERN, spec or ""):
        raise ConfigError([f"schedule {spec!r}: not five cron fields (e.g. '0 3 * * *')"])
    sets = []
    for text, (low, high) in zip(spec.split(), _RANGES):
        values: set = set()
        for part in text.split(","):
            body, _, step = part.partition("/")
            if body == "*":
                a, b = low, high
            elif "-" in body:
                a, b = (int(x) for x in body.split("-"))
            else:
                a = b = int(body)
                if step:
                    b = high
            if not (low <= a <= b <= high):
                raise ConfigError([f"schedule {spec!r}: {part!r} out of {low}-{high}"])
            values.update(range(a, b + 1, int(step) if step else 1))
        sets.append(values)
    sets[4] = {d % 7 for d in sets[4]}
    fields = spec.split()
    return (*sets, not fields[2].startswith("*"), not fields[4].startswith("*"))


def slots(spec: str, start: _dt.datetime, end: _dt.datetime) -> list[_dt.datetime]:
    """The times of ``spec`` in ``(start, end]`` (naive or aware alike: minutes of their clock)."""
    minutes, hours, doms, months, dows, dom_set, dow_set = parse_cron(spec)
    out = []
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    while day <= end:
        dow = (day.weekday() + 1) % 7
        in_dom, in_dow = day.day in doms, dow in dows
        match = (in_dom or in_dow) if (dom_set and dow_set) else (in_dom and in_dow)
        if day.month in months and match:
            for h in sorted(hours):
                for m in sorted(minutes):
                    t = day.replace(hour=h, minute=m)
                    if start < t <= end:
                        out.append(t)
        day += _dt.timedelta(days=1)
    return out


def _parse_time(text: str, tz) -> _dt.datetime:
    when = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when.astimezone(tz) if when.tzinfo else when.replace(tzinfo=tz)


def missed_slots(spec: str, started: list[str], now: _dt.datetime, since: _dt.datetime | None = None) -> list[_dt.datetime]:
    """The slots of ``spec`` that have no run: each slot ``s`` whose next slot has come (a slot
    still open may yet run) and with no ``started`` time in ``[s, next slot)``, after the last
    recorded run, or ``since`` (the schedule's installation) when that is later or no run is
    recorded.

    Args:
        spec (str): the cron time fields.
        started (list[str]): ISO 8601 start times of the tier's recorded runs (NOT-RUN included).
        now (datetime): aware; slots are taken in its time zone (slurmctld's local time).
        since (datetime | None): aware; where to start without a recorded run.

    Returns:
        list[datetime]: at most :data:`MAX_MISSED`, the newest, oldest first.
    """
    tz = now.tzinfo
    times = sorted(_parse_time(t, tz) for t in started)
    last = times[-1] if times else None
    if last is None and since is None:
        return []
    oldest = now - _dt.timedelta(days=MAX_LOOKBACK_DAYS)
    if since is not None and (last is None or since.astimezone(tz) > last):
        # no run since the schedule was installed: its slots start there (a run before it
        # belonged to no schedule, and the time between was no slot of this one)
        first = max(since.astimezone(tz), oldest)
    else:
        # the slot the last run belongs to is covered: start from the slot at or before it
        begin = max(last, oldest)
        prior = slots(spec, begin - _dt.timedelta(days=MAX_LOOKBACK_DAYS), begin)
        first = prior[-1] - _dt.timedelta(seconds=1) if prior else begin
    every = slots(spec, first, now + _dt.timedelta(days=32))
    out = []
    for s, nxt in zip(every, every[1:]):
        if nxt > now:
            break
        if not any(s <= t < nxt for t in times):
            out.append(s)
    return out[-MAX_MISSED:]


def record_missed(conn, stack: str, recipe: str, tier: str, spec: str, now: _dt.datetime,
                  since: _dt.datetime | None = None) -> list[str]:
    """Record each missed slot of ``stack`` in ``tier`` as NOT-RUN (:data:`SLOT_MISSED`, started
    at the slot's time, UTC); return the slots recorded (ISO 8601 UTC)."""
    from hpcstack.validate import history

    started = [r.started for r in history.runs(conn, stack, tier)]
    out = []
    for slot in missed_slots(spec, started, now, since):
        when = slot.astimezone(_dt.timezone.utc).isoformat(timespec="seconds")
        history.record_not_run(conn, stack, recipe, tier, f"{SLOT_MISSED} ({spec})", started=when)
        out.append(when)
    return out


# ----------------------------------------------------------------------------------- probe


#: Fingerprint keys that are not a change of the environment (each run has its own nodes).
PROBE_IGNORED = ("nodes",)


#: The tiers whose runs measure the stack at scale: the probe compares its fingerprint with the
#: last OK one of these (a smoke or manual run in between re-validates nothing at scale).
FULL_TIERS = ("install", "full")


def probe_decision(runs: list, probe_run) -> tuple[bool, list[str]]:
    """Does a probe's fingerprint differ from that of the last OK run at scale before it (the
    :data:`FULL_TIERS`: the environment the full tier last passed in)?

    Args:
        runs (list[history.Run]): the stack's runs, oldest first.
        probe_run (history.Run): the probe's own run.

    Returns:
        tuple[bool, list[str]]: True and the differences (fingerprint diff lines, nodes aside)
        when the full tier must run; True with one line when there is no OK run to compare with
        or the probe did not pass; False and ``[]`` when nothing changed.
    """
    from hpcstack.validate.fingerprint import diff

    if probe_run.state != "OK":
        return True, [f"the probe itself is {probe_run.state}"]
    before = [r for r in runs if r.state == "OK" and r.tier in FULL_TIERS and r.id != probe_run.id
              and (r.started, r.id) < (probe_run.started, probe_run.id)]
    if not before:
        return True, ["no OK run to compare with"]
    lines = [line for line in diff(before[-1].fingerprint, probe_run.fingerprint)
             if line.split(" ", 2)[1].rstrip(":") not in PROBE_IGNORED]
    return bool(lines), lines


# ----------------------------------------------------------------------------------- scrontab


@dataclass(frozen=True)
class Entry:
    """One scrontab entry of hpcstack: a stack's tier at a site."""

    site: str
    stack: str
    tier: Tier

    @property
    def marker(self) -> str:
        return MARKER.format(site=self.site, stack=self.stack, tier=self.tier.name)


def entry_lines(entry: Entry, command: list[str], slurm: dict | None = None,
                extra_args: list[str] = (), log_dir: str | None = None) -> list[str]:
    """The lines of one entry: the marker, its ``#SCRON`` options (job name, the site's
    partition (unless ``partition_option`` is false), QOS, account and constraint, :data:`WRAPPER_TIME`, ``--chdir`` and ``--output`` in
    ``log_dir``, root's directory (:func:`make_log_dir`); without one ``--chdir=/`` and no
    output), and the cron line that runs ``COMMAND validate STACK --site SITE --tier TIER``.
    Never ``slurm.output_root``: a world-writable directory there lets a user plant a link at
    the job's predictable output name, which slurmstepd opens following links."""
    s = slurm or {}
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", entry.stack)
    opts = [f"--job-name=hpcstack-{entry.tier.name}-{slug}", f"--time={WRAPPER_TIME}"]
    # as the validation jobs name them: no --partition where the site chooses nodes otherwise
    # (slurm.partition_option false: Perlmutter's -C gpu and a QOS)
    keys = ("partition", "qos", "account", "constraint") if s.get("partition_option", True) else ("qos", "account", "constraint")
    opts += [f"--{key}={s[key]}" for key in keys if s.get(key)]
    opts.append(f"--chdir={log_dir or '/'}")
    opts.append(f"--output={log_dir}/hpcstack-{entry.tier.name}-{slug}-%j.out" if log_dir else "--output=/dev/null")
    argv = [*command, "validate", entry.stack, "--site", entry.site, "--tier", entry.tier.name, "--then-collect",
            *extra_args]
    return [entry.marker, *(f"#SCRON {o}" for o in opts),
            f"{entry.tier.schedule} {' '.join(shlex.quote(a) for a in argv)}"]


def entries_text(entries: list[Entry], command: list[str], slurm: dict | None = None,
                 extra_args: list[str] = (), log_dir: str | None = None) -> str:
    """hpcstack's blocks for ``entries``, in order, as scrontab text."""
    return "".join("\n".join(entry_lines(e, command, slurm, extra_args, log_dir)) + "\n" for e in entries)


def _blocks(text: str) -> list[tuple[tuple | None, list[str]]]:
    """The table's lines in blocks: ``(key, lines)`` for each of hpcstack's entries (its marker,
    its ``#SCRON`` lines and its cron line), ``(None, [line])`` for every other line."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _MARKER_RE.match(lines[i])
        if not m:
            out.append((None, [lines[i]]))
            i += 1
            continue
        j = i + 1
        while j < len(lines) and (lines[j].startswith("#SCRON") or not lines[j].strip()):
            j += 1
        out.append((m.groups(), lines[i:j + 1]))
        i = j + 1
    return out


def remove_entries(text: str, site: str, stacks: list[str] | None = None) -> str:
    """The table without hpcstack's entries of ``site`` (of ``stacks`` only, when given); every
    other line as it was."""
    kept = [lines for key, lines in _blocks(text)
            if key is None or key[0] != site or (stacks is not None and key[1] not in stacks)]
    body = "\n".join(line for lines in kept for line in lines)
    return body + "\n" if body.strip() else ""


def install_entries(text: str, entries: list[Entry], command: list[str], slurm: dict | None = None,
                    extra_args: list[str] = (), log_dir: str | None = None) -> str:
    """The table with the entries of ``entries``' stacks replaced by ``entries`` (appended at
    the end); foreign lines and hpcstack's entries of other stacks kept."""
    stacks_by_site: dict[str, list[str]] = {}
    for e in entries:
        stacks_by_site.setdefault(e.site, []).append(e.stack)
    for site, stacks in stacks_by_site.items():
        text = remove_entries(text, site, stacks)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + entries_text(entries, command, slurm, extra_args, log_dir)


def listed_entries(text: str, site: str | None = None) -> list[tuple[str, str, str, str]]:
    """hpcstack's entries in a table: ``(site, stack, tier, cron line)``."""
    return [(*key, lines[-1]) for key, lines in _blocks(text) if key is not None and (site is None or key[0] == site)]


class Scrontab:
    """An account's scrontab: ``scrontab [-u USER] -l`` reads it, ``scrontab [-u USER] FILE``
    replaces it. ``run`` (default :func:`subprocess.run`) is what runs them (a test passes its own)."""

    def __init__(self, user: str | None = None, run=None, program: str = "scrontab"):
        self.user = user
        self.run = run or subprocess.run
        self.program = program

    def _argv(self, *args: str) -> list[str]:
        return [self.program, *(["-u", self.user] if self.user else []), *args]

    def _run(self, *args: str, text: str | None = None):
        """Run ``scrontab ARGS`` from :data:`~hpcstack.fsutil.CHILD_CWD` (never the caller's
        working directory); a missing or unrunnable program is an :class:`HpcstackError`."""
        from hpcstack.fsutil import CHILD_CWD

        try:
            return self.run(self._argv(*args), input=text, capture_output=True, text=True, cwd=CHILD_CWD)
        except OSError as exc:
            raise HpcstackError(f"{self.program}: {exc.strerror or exc} (is Slurm's scrontab installed?)") from None

    def read(self) -> str:
        """The table's text (``""`` when the account has none).

        Raises:
            HpcstackError: scrontab failed otherwise (its message).
        """
        p = self._run("-l")
        if p.returncode != 0:
            said = f"{p.stdout or ''} {p.stderr or ''}".lower()    # Slurm 22.05 says it on stdout
            if "no crontab" in said or "no scrontab" in said:
                return ""
            raise HpcstackError(f"scrontab -l failed: {(p.stderr or '').strip() or p.returncode}")
        return p.stdout

    def write(self, text: str) -> None:
        """Replace the table with ``text`` (given as ``/dev/stdin``, no temporary file; ``-r``
        when empty).

        Raises:
            HpcstackError: scrontab refused it (its message).
        """
        if not text.strip():
            p = self._run("-r")
        else:
            p = self._run("/dev/stdin", text=text)
        if p.returncode != 0 and "no crontab" not in (p.stderr or "").lower():
            raise HpcstackError(f"scrontab failed: {(p.stderr or '').strip() or p.returncode}")


# ----------------------------------------------------------------------------------- state


def state_path(site) -> str:
    """``<state root>/schedule/<site>.json`` (:func:`hpcstack.validate.history.state_root`:
    ``<install_root>/.hpcstack`` by default): what ``hpcstack schedule install`` installed."""
    from hpcstack.validate.history import state_root

    return os.path.join(state_root(site), SCHEDULE_DIR, f"{site.name}.json")


def log_dir_path(site) -> str:
    """``<state root>/schedule/logs``: where the scheduled jobs write their output."""
    return os.path.join(os.path.dirname(state_path(site)), LOG_DIR)


def make_log_dir(site, pol=None) -> str:
    """Make :func:`log_dir_path` through the gate (root's, 0755, the directories above it made
    0755) and return it.

    Raises:
        ConfigError: it is there but not the running account's (root's), or others can write it.
        GateError: a link or an untrusted directory on the way.
    """
    from hpcstack import gate

    path = log_dir_path(site)
    _, st = gate.mkdir(path, 0o755, parents=True, exact=True, pol=pol)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ConfigError([f"{path}: the scheduled jobs' output directory must be root's and not "
                           f"group/other-writable (found uid {st.st_uid}, mode {st.st_mode & 0o7777:o})"])
    return path


def read_state(site, pol=None) -> dict:
    """``{stack: {tier: {"schedule": CRON, "installed": ISO}}}``; ``{}`` when missing or unreadable."""
    from hpcstack import gate

    try:
        data = json.loads(gate.read_file(state_path(site), 1 << 20, pol) or b"{}")
    except (OSError, ValueError, HpcstackError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(site, state: dict, pol=None) -> None:
    """Write the state file through the gate (root's 0755 directory, 0644 file)."""
    from hpcstack import gate

    path = state_path(site)
    gate.mkdir(os.path.dirname(path), 0o755, parents=True, exact=False, pol=pol)
    gate.write_atomic(path, json.dumps(state, indent=1, sort_keys=True) + "\n", 0o644, pol=pol)


def record_missed_for_site(site, now: _dt.datetime | None = None, pol=None,
                           only: tuple[str, str] | None = None) -> list[str]:
    """As root: record the missed slots of every scheduled stack and tier of the site (or of
    ``only`` = (stack, tier)) in its history; return one line per slot. Nothing as another user
    or without a schedule."""
    from contextlib import closing

    from hpcstack.validate import history

    state = read_state(site, pol)
    if os.geteuid() != 0 or not state:
        return []
    now = now or _dt.datetime.now().astimezone()
    lines = []
    with closing(history.open_history(history.history_path(site), pol=pol)) as conn:
        for stack, tiers in sorted(state.items()):
            for tier, info in sorted((tiers or {}).items()):
                if only and (stack, tier) != only or tier not in SCHEDULED_TIERS:
                    continue
                since = _parse_time(info["installed"], now.tzinfo) if info.get("installed") else None
                recipe = info.get("recipe") or stack
                for when in record_missed(conn, stack, recipe, tier, info["schedule"], now, since):
                    lines.append(f"{stack} [{tier}]: NOT-RUN: {SLOT_MISSED} at {when}")
    return lines


def published_stacks(site) -> list[str]:
    """``NAME/VERSION`` of each stack published under the site's install root."""
    from hpcstack.install.layout import StackLayout

    out = []
    root = site.install_root
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except OSError:
        return []
    for name in names:
        try:
            versions = sorted(v for v in os.listdir(os.path.join(root, name)) if not v.startswith("."))
        except OSError:
            continue
        for version in versions:
            try:
                if StackLayout.for_site(site, name, version).published():
                    out.append(f"{name}/{version}")
            except (OSError, ValueError, HpcstackError):
                continue
    return out


def repo_args(session) -> list[str]:
    """The command's ``--repo`` directories as options (absolute), for the commands its entries
    and collector jobs run: they see the same recipes and site configs."""
    return [w for d in getattr(session, "_repo_dirs", ()) for w in ("--repo", os.path.abspath(d))]


def hpcstack_command() -> list[str]:
    """How the entries run hpcstack: this interpreter, ``-I -m hpcstack`` (isolated: neither the
    job's working directory nor ``PYTHON*`` variables go on ``sys.path``, so no planted
    ``hpcstack/__main__.py`` runs)."""
    return [sys.executable, "-I", "-m", "hpcstack"]


def remove_stack(site, stack: str, tab: Scrontab | None = None, pol=None) -> list[str]:
    """Remove a stack's entries (``hpcstack uninstall`` calls it): the table's blocks and the
    state's record; nothing when the schedule never named it. Returns what was removed.

    Raises:
        HpcstackError: scrontab failed or is not installed (the state is kept for a later
            ``hpcstack schedule remove``; ``hpcstack uninstall`` prints it as one warning line).
    """
    state = read_state(site, pol)
    if stack not in state:
        return []
    tab = tab or Scrontab()
    old = tab.read()
    new = remove_entries(old, site.name, [stack])
    if new != old:
        tab.write(new)
    tiers = sorted(state.pop(stack))
    write_state(site, state, pol)
    return [f"scrontab entry {stack} [{t}]" for t in tiers]


def cmd_schedule(args, session, tab: Scrontab | None = None) -> int:
    """``hpcstack schedule install|remove|list [STACK...]``.

    Raises:
        ConfigError: not root (install, remove), a site without ``slurm``, an unknown stack.
        HpcstackError: scrontab failed.
    """
    site = session.site
    if not site.slurm:
        raise ConfigError([f"site {site.name} has no slurm section: scrontab needs Slurm"])
    tab = tab or Scrontab()     # root's: each run records into root's history; a site's
    # slurm.submit_as is the account hpcstack validate itself submits the validation jobs as
    if args.action == "list":
        for site_name, stack, tier, line in listed_entries(tab.read(), site.name):
            print(f"{stack} [{tier}]: {line}")
        return 0
    if os.geteuid() != 0 and not args.dry_run:
        raise ConfigError([f"hpcstack schedule {args.action}: run it as root (the history it records "
                           "into and the schedule's state are root's)"])
    state = read_state(site, session.policy)
    old = tab.read()
    if args.action == "remove":
        stacks = list(args.stacks) or None
        new = remove_entries(old, site.name, stacks)
        for stack in list(state):
            if stacks is None or stack in stacks:
                del state[stack]
    else:
        stacks = list(args.stacks) or published_stacks(site)
        if not stacks:
            raise ConfigError([f"no stack is published for site {site.name} under {site.install_root}"])
        from hpcstack.validate.settings import validation_settings

        entries, now = [], _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        for stack in stacks:
            recipe = session.load_recipe(stack, site)
            for tier in tiers_of(validation_settings(site, recipe).spec, site).values():
                parse_cron(tier.schedule)
                entries.append(Entry(site.name, recipe.full_name, tier))
                prior = (state.get(recipe.full_name) or {}).get(tier.name) or {}
                installed = prior.get("installed") if prior.get("schedule") == tier.schedule else now
                state.setdefault(recipe.full_name, {})[tier.name] = {
                    "schedule": tier.schedule, "installed": installed or now,
                    "recipe": recipe.ref or recipe.full_name}
        extra = repo_args(session)
        logs = log_dir_path(site) if args.dry_run else make_log_dir(site, session.policy)
        new = install_entries(old, entries, hpcstack_command(), site.slurm, extra, logs)
    if args.dry_run:
        print(new, end="")
        return 0
    if new != old:
        tab.write(new)
    write_state(site, state, session.policy)
    print(f"scrontab of root: {len(listed_entries(new, site.name))} hpcstack entr(y/ies) for site {site.name}")
    return 0
