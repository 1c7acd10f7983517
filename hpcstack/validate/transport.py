"""The transport a validation's collectives really took, read from the libraries' own logs and
held to the site's fabric (``network:`` in the site config, :class:`hpcstack.site.NetworkConfig`).

**NCCL** (GPU jobs). The job runs with ``NCCL_DEBUG=INFO`` and
``NCCL_DEBUG_FILE=<job dir>/nccl-%h-%p.log`` (:func:`nccl_env`; NCCL expands ``%h`` to the host
and ``%p`` to the pid: one file per rank, and nothing more in the job's output). NCCL says there

* which network it picked: ``Using network IB`` / ``Socket`` / ``AWS Libfabric`` (NCCL >= 2.5;
  NCCL 2.3 wrote ``Using internal Network Socket``), after ``NET/IB : Using [0]mlx5_0:1/IB ...``,
  ``NET/IB : No device found.`` or ``NET/Socket : Using [0]eth0:...``; the aws-ofi-nccl plugin adds
  ``NET/OFI Selected Provider is cxi`` (``efa``, ``tcp`` ...);
* each channel's transport: ``Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3`` between
  nodes, ``via P2P/IPC/read``, ``via P2P/CUMEM``, ``via P2P/direct pointer`` or
  ``via SHM/direct/direct`` within a node (``Ring 00 : ...`` before NCCL 2.5);
* its version (``NCCL version 2.19.3+cuda12.3``) and its net plugin (``Plugin Path : ...``,
  ``NET/Plugin : No plugin found``, ``NET/Plugin: Failed to find ncclNetPlugin_v5 symbol.``,
  ``NET/OFI Using aws-ofi-nccl 1.6.0``).

The network a log shows is taken from its channels where it has any, else from ``Using network``,
else from the ``NET/...: Using`` lines (NCCL 2.4 initialises sockets even where it then uses IB,
so an IB line wins there). :func:`judge_nccl` fails a fall-back to TCP sockets on an InfiniBand or
Slingshot site, quoting the lines that show it and those that say why (``NET/IB : No device
found.``, ``NCCL_IB_DISABLE set by environment to 1.``); InfiniBand wants ``NET/IB`` (or the IB
SHARP plugin's ``IBext``), Slingshot ``NET/OFI`` with provider ``cxi``; ``network.nvlink`` wants
every intra-node channel peer to peer (a ``P2P`` channel proves peer access, not which link
carries it; a ``NET`` channel between two GPUs of one node is not told apart from one between
nodes). The NCCL actually loaded is reported beside the one the site's modules name.

**Open MPI** (CPU path). With ``--mca btl_base_verbose 100`` and the ``ob1`` PML each rank says
``mca: bml: Using vader btl for send to [[26641,1],1] on node vm``. :func:`judge_ompi` wants shared
memory (``vader``, ``sm``, ``smcuda``; ``self`` to itself) to a peer on its own node and TCP to a
peer on another, as the twins configure.

Sources: NCCL's environment variables (``NCCL_DEBUG``, ``NCCL_DEBUG_FILE``, ``NCCL_NET``,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html); the log lines of
tests/data/nccl-logs/ (NVIDIA/nccl, NVIDIA/nccl-tests, horovod/horovod, aws/aws-ofi-nccl issues,
named in its README) and tests/data/ompi-logs/ (made here with Open MPI 4.1.4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Name of the per-rank NCCL logs in a job's directory: ``nccl-<host>-<pid>.log``.
NCCL_LOG_PREFIX, NCCL_LOG_SUFFIX = "nccl-", ".log"
#: Lines quoted per failure, and the longest quoted line.
QUOTED, LINE_MAX = 3, 240


def nccl_env(directory: str) -> dict[str, str]:
    """The variables a GPU job sets so that every rank writes NCCL's choices to its own file.

    Example:
        >>> nccl_env("/scratch/v/n2")["NCCL_DEBUG_FILE"]
        '/scratch/v/n2/nccl-%h-%p.log'
    """
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{directory}/{NCCL_LOG_PREFIX}%h-%p{NCCL_LOG_SUFFIX}"}


@dataclass(frozen=True)
class Line:
    """One log line: the file it came from, its number (from 1) and its text."""

    source: str
    number: int
    text: str

    def quote(self) -> str:
        """``file:N: "text"``, control characters dropped and the text cut at :data:`LINE_MAX`."""
        text = "".join(c for c in self.text.strip() if c.isprintable())[:LINE_MAX]
        return f'{self.source}:{self.number}: "{text}"'


_VERSION = re.compile(r"NCCL version (\S+)")
_USING_NETWORK = re.compile(r"NCCL INFO Using (?:internal )?[Nn]etwork (.+?)\s*$")
_NET_INIT = re.compile(r"NCCL INFO NET/(IB|Socket) ?: (Using \[|No device found)")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([A-Za-z0-9_;+:-]+)")
_CHANNEL = re.compile(r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? : .* via (\S.*?)\s*$")
_PLUGIN = re.compile(r"Plugin Path : |NET/Plugin ?: |NET/OFI (?:Using|Initializing) aws-ofi-nccl|P2P plugin ")
_CAUSE = re.compile(r"NET/IB : No device found|NCCL_(?:IB_DISABLE|NET|IBEXT_DISABLE|NET_PLUGIN) set by environment"
                    r"|Failed to open libibverbs")
_WARN = re.compile(r"NCCL WARN ")


def net_kind(name: str) -> str:
    """NCCL's name of a network, as a kind: ``IB`` (``IB``, ``IBext``, ``IBext_v8``), ``Socket``,
    ``OFI`` (``AWS Libfabric``, ``Libfabric``, ``OFI``), else the name itself.

    Example:
        >>> [net_kind(n) for n in ("IBext_v8", "Socket", "AWS Libfabric")]
        ['IB', 'Socket', 'OFI']
    """
    low = name.strip().lower()
    if low.startswith("ib"):
        return "IB"
    if low.startswith("socket"):
        return "Socket"
    if "libfabric" in low or low.startswith("ofi"):
        return "OFI"
    return name.strip()


def _channel_kind(via: str) -> tuple[str, bool]:
    """``(kind, between nodes)`` of a channel's ``via`` text: ``NET/AWS Libfabric/7/GDRDMA`` ->
    ``("OFI", True)``, ``P2P/IPC/read`` -> ``("P2P/IPC", False)``, ``SHM/direct/direct`` -> ``("SHM", False)``."""
    if via.startswith("NET/"):
        return net_kind(via[4:].split("/")[0]), True
    parts = via.split("/")
    return ("/".join(parts[:2]) if parts[0] == "P2P" and len(parts) > 1 else parts[0]), False


@dataclass
class NcclLog:
    """What NCCL's INFO lines of one or more files say (:func:`parse_nccl`).

    Attributes:
        files (list[str]): the files read.
        versions (dict[str, Line]): NCCL version -> the first line that names it.
        networks (dict[str, list[Line]]): network kind -> the lines that show it in use (per
            file: channels, else ``Using network``, else ``NET/...: Using``).
        providers (dict[str, list[Line]]): aws-ofi-nccl's libfabric provider -> its lines.
        intra (dict[str, list[Line]]): intra-node channel kind (``P2P/IPC``, ``SHM``) -> lines.
        plugins (list[Line]): the net plugin's lines (its path, or that none was found).
        causes (list[Line]): lines that say why NCCL left a network out.
        warnings (list[Line]): ``NCCL WARN`` lines.
    """

    files: list = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    networks: dict = field(default_factory=dict)
    providers: dict = field(default_factory=dict)
    intra: dict = field(default_factory=dict)
    plugins: list = field(default_factory=list)
    causes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)


def parse_nccl(logs: dict[str, str]) -> NcclLog:
    """Parse NCCL ``NCCL_DEBUG=INFO`` output, one text per file (the lines may carry a launcher's
    prefix, ``[1,0]<stdout>:``).

    Args:
        logs (dict[str, str]): file name -> its text.
    """
    out = NcclLog(files=sorted(logs))
    for source in out.files:
        channels: dict[str, list[Line]] = {}
        chosen: dict[str, list[Line]] = {}
        init: dict[str, list[Line]] = {}
        for number, text in enumerate(logs[source].splitlines(), 1):
            line = Line(source, number, text)
            if m := _VERSION.search(text):
                out.versions.setdefault(m.group(1), line)
            if m := _CHANNEL.search(text):
                kind, between = _channel_kind(m.group(1))
                (channels if between else out.intra).setdefault(kind, []).append(line)
            elif m := _USING_NETWORK.search(text):
                chosen.setdefault(net_kind(m.group(1)), []).append(line)
            elif (m := _NET_INIT.search(text)) and m.group(2).startswith("Using"):
                init.setdefault(net_kind(m.group(1)), []).append(line)
            if m := _PROVIDER.search(text):
                out.providers.setdefault(m.group(1), []).append(line)
                init.setdefault("OFI", []).append(line)
            if _PLUGIN.search(text):
                out.plugins.append(line)
            if _CAUSE.search(text):
                out.causes.append(line)
            if _WARN.search(text):
                out.warnings.append(line)
        if not channels and not chosen and "IB" in init:
            init.pop("Socket", None)         # NCCL 2.4 sets up sockets, then uses IB
        for kind, lines in (channels or chosen or init).items():
            out.networks.setdefault(kind, []).extend(lines)
    return out


@dataclass(frozen=True)
class TransportRule:
    """What a site's GPU jobs must show (from ``network:`` and the modules that name NCCL).

    Attributes:
        fabric (str): ``infiniband``, ``slingshot``, ``ethernet`` or ``none`` (no check).
        nvlink (bool): intra-node channels must be peer to peer.
        nccl_module (str | None): the site's module that names NCCL (``nccl/2.21.5``), if any.
        nccl_home (str | None): ``toolchain.nccl.home``, as the site writes it.
    """

    fabric: str = "none"
    nvlink: bool = False
    nccl_module: str | None = None
    nccl_home: str | None = None

    @classmethod
    def of_site(cls, site) -> "TransportRule":
        """The rule of a :class:`hpcstack.site.Site`."""
        module = next((m for m in site.modules.stack_modules() if m.lower().startswith("nccl/")), None)
        return cls(site.network.fabric, site.network.nvlink, module, site.toolchain.nccl_home)

    @property
    def checks(self) -> bool:
        """True where the fabric or NVLink is to be checked."""
        return self.fabric != "none" or self.nvlink


@dataclass(frozen=True)
class TransportVerdict:
    """The judgement of one job's NCCL logs (:func:`judge_nccl`).

    Attributes:
        rule (TransportRule): what was expected.
        log (NcclLog): what the logs say.
        failures (list[str]): one line per failed check, with the quoted log lines.
    """

    rule: TransportRule
    log: NcclLog
    failures: list

    def to_dict(self) -> dict:
        """The verdict as data (a job's ``transport`` entry of ``report.json``)."""
        log, rule = self.log, self.rule
        return {"fabric": rule.fabric, "nvlink": rule.nvlink, "files": len(log.files),
                "inter_node": sorted(log.networks), "intra_node": sorted(log.intra),
                "ofi_providers": sorted(log.providers),
                "nccl": {"loaded": sorted(log.versions), "plugin": [ln.quote() for ln in log.plugins[:QUOTED]],
                         "module": rule.nccl_module, "home": rule.nccl_home},
                "warnings": [ln.quote() for ln in log.warnings[:QUOTED]],
                "ok": not self.failures, "failures": list(self.failures)}

    def nccl_line(self) -> str | None:
        """``NCCL loaded: 2.19.3+cuda12.3 (site: nccl/2.21.5, toolchain.nccl.home ${NCCL_DIR})``, or
        None where no log names a version."""
        if not self.log.versions:
            return None
        site = ", ".join(x for x in (self.rule.nccl_module,
                                     self.rule.nccl_home and f"toolchain.nccl.home {self.rule.nccl_home}") if x)
        return f"NCCL loaded: {', '.join(sorted(self.log.versions))} (site: {site or 'names none'})"


def _quotes(*groups) -> str:
    lines = [ln for group in groups for ln in group]
    more = f" (and {len(lines) - QUOTED} more)" if len(lines) > QUOTED else ""
    return "; ".join(ln.quote() for ln in lines[:QUOTED]) + more


_EXPECTED = {"infiniband": ("IB", "NET/IB"), "slingshot": ("OFI", "NET/OFI with provider cxi")}


def judge_nccl(logs: dict[str, str], rule: TransportRule, *, nodes: int = 1,
               require_logs: bool = False) -> TransportVerdict:
    """Hold one job's NCCL logs to the site's fabric.

    Args:
        logs (dict[str, str]): file name -> text (the job's ``nccl-*.log``).
        rule (TransportRule): what the site says.
        nodes (int): the job's node count (a multi-node job must show its network).
        require_logs (bool): no log at all is a failure (a job that completed with NCCL).

    Returns:
        TransportVerdict: ``failures`` empty when the logs show what the site's fabric gives.

    Example:
        >>> rule = TransportRule("infiniband")
        >>> judge_nccl({"a.log": "h:1:1 [0] NCCL INFO Using network Socket"}, rule).failures[0][:54]
        'fabric infiniband, but NCCL fell back to TCP sockets ('
    """
    log = parse_nccl(logs)
    failures: list[str] = []
    if not rule.checks:
        return TransportVerdict(rule, log, failures)
    if not log.files:
        if require_logs:
            failures.append(f"no NCCL log ({NCCL_LOG_PREFIX}*{NCCL_LOG_SUFFIX}) in the job's directory: "
                            "NCCL never started, or NCCL_DEBUG_FILE was not passed to the ranks")
        return TransportVerdict(rule, log, failures)
    want = _EXPECTED.get(rule.fabric)
    if want:
        kind, name = want
        if "Socket" in log.networks:
            failures.append(f"fabric {rule.fabric}, but NCCL fell back to TCP sockets (NET/Socket), "
                            f"expected {name}: {_quotes(log.networks['Socket'], log.causes)}")
        others = [k for k in log.networks if k not in (kind, "Socket")]
        if others:
            failures.append(f"fabric {rule.fabric}, but NCCL used {', '.join(sorted(others))}, expected {name}: "
                            f"{_quotes(*(log.networks[k] for k in sorted(others)))}")
        if not log.networks and nodes > 1:
            failures.append(f"fabric {rule.fabric}: no line of the {len(log.files)} NCCL log(s) shows the "
                            f"network NCCL used, expected {name}")
        if rule.fabric == "slingshot" and "OFI" in log.networks:
            wrong = {p: lines for p, lines in log.providers.items() if p != "cxi"}
            if wrong:
                failures.append(f"fabric slingshot, but NET/OFI selected provider {', '.join(sorted(wrong))}, "
                                f"expected cxi: {_quotes(*wrong.values())}")
            elif not log.providers:
                failures.append("fabric slingshot: no line names NET/OFI's provider, expected cxi: "
                                f"{_quotes(log.networks['OFI'])}")
    if rule.nvlink:
        host = {k: lines for k, lines in log.intra.items() if not k.startswith("P2P")}
        if host:
            failures.append(f"network.nvlink, but NCCL's channels within a node go through "
                            f"{', '.join(sorted(host))}, not P2P: {_quotes(*host.values())}")
    return TransportVerdict(rule, log, failures)


# ---------------------------------------------------------------------------------- Open MPI

_BML = re.compile(r"^\s*\[([^\]:]+):\d+\] mca: bml: Using (\S+) btl for send to \[\[[\d,]+\],(\d+)\] on node (\S+)")
#: Open MPI's shared-memory BTLs (``vader`` was renamed ``sm`` in Open MPI 5).
OMPI_SHARED = ("vader", "sm", "smcuda")


@dataclass(frozen=True)
class BmlSend:
    """One ``mca: bml: Using <btl> btl for send to [[job,vpid],peer] on node <node>`` line."""

    host: str
    btl: str
    peer: int
    node: str
    line: Line

    @property
    def same_node(self) -> bool:
        """The peer is on the sender's node (short host names compared)."""
        return self.host.split(".")[0] == self.node.split(".")[0]


def parse_ompi(logs: dict[str, str]) -> list[BmlSend]:
    """The BML's choices in Open MPI's ``btl_base_verbose`` output, one text per file."""
    sends = []
    for source in sorted(logs):
        for number, text in enumerate(logs[source].splitlines(), 1):
            if m := _BML.search(text):
                sends.append(BmlSend(m.group(1), m.group(2), int(m.group(3)), m.group(4), Line(source, number, text)))
    return sends


def ompi_env() -> dict[str, str]:
    """A CPU job's environment for :func:`judge_ompi`: Open MPI's BML says which BTL carries
    each peer (``btl_base_verbose``, https://docs.open-mpi.org/en/v5.0.x/mca.html), into the
    job's output.

    Example:
        >>> ompi_env()
        {'OMPI_MCA_btl_base_verbose': '100'}
    """
    return {"OMPI_MCA_btl_base_verbose": "100"}


@dataclass(frozen=True)
class OmpiRule:
    """What Open MPI's CPU path must use (:func:`judge_ompi`).

    Attributes:
        between (tuple[str, ...]): the BTLs allowed between nodes (empty: not checked).
    """

    between: tuple = ("tcp",)

    @classmethod
    def of_site(cls, site) -> "OmpiRule | None":
        """The rule of ``site``: TCP between nodes where its ``network.fabric`` is ``none`` or
        ``ethernet`` (localhost); None on a site with a fabric, whose MPI may not be Open MPI
        (Cray MPICH, ParaStation MPI, HPE MPT) and whose BTL depends on the build."""
        net = getattr(site, "network", None)
        fabric = getattr(net, "fabric", None) or "none"
        return cls(("tcp",)) if fabric in ("none", "ethernet") else None


@dataclass(frozen=True)
class OmpiVerdict:
    """One job's Open MPI transport, judged (the job's ``transport`` entry of ``report.json``).

    Attributes:
        rule (OmpiRule): what was expected; sends (list[BmlSend]): what the output says;
        failures (list[str]): one line per broken rule, quoting the lines.
    """

    rule: OmpiRule
    sends: list
    failures: list

    def to_dict(self) -> dict:
        """The verdict as data."""
        return {"mpi": "Open MPI", "within_node": sorted({s.btl for s in self.sends if s.same_node}),
                "between_nodes": sorted({s.btl for s in self.sends if not s.same_node}),
                "between_expected": list(self.rule.between), "ok": not self.failures,
                "failures": list(self.failures)}


def judge_ompi(logs: dict[str, str], *, between: tuple = ("tcp",)) -> list[str]:
    """Shared memory within a node, ``between`` (TCP; empty: not checked) across nodes: one failure line per rule
    broken, quoting the lines; also a failure where no line shows a choice (the output lacks
    ``btl_base_verbose``, or the ``ucx`` PML bypassed the BTLs).

    Example:
        >>> judge_ompi({"o": "[n1:7] mca: bml: Using tcp btl for send to [[5,1],1] on node n1"})[0][:44]
        'within a node Open MPI used tcp, not shared '
    """
    sends = parse_ompi(logs)
    if not sends:
        return ["no 'mca: bml: Using ... btl' line: run with --mca btl_base_verbose 100 and the ob1 PML"]
    inside = [s for s in sends if s.same_node and s.btl != "self" and s.btl not in OMPI_SHARED]
    across = [s for s in sends if not s.same_node and s.btl not in between] if between else []
    failures = []
    if inside:
        failures.append(f"within a node Open MPI used {', '.join(sorted({s.btl for s in inside}))}, not shared "
                        f"memory ({'/'.join(OMPI_SHARED)}): {_quotes([s.line for s in inside])}")
    if across:
        failures.append(f"between nodes Open MPI used {', '.join(sorted({s.btl for s in across}))}, "
                        f"expected {'/'.join(between)}: {_quotes([s.line for s in across])}")
    return failures
