"""The ``CudaWheelArchs`` component: the GPU architectures of a prebuilt CUDA wheel, checked
against the site's GPUs before anything is written, and again once installed."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import partial

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install import gpuarch
from hpcstack.install.actions import ActionBase, ExecContext
from hpcstack.install.components.base import Component, PlanContext
from hpcstack.install.components.sanity import PythonCheck, PythonSnippet
from hpcstack.install.plan import SANITYCHECK, WHEELS


def _verify_installed(cc_list: tuple[int, ...], package: str, cuda: str | None, report: str) -> list[str]:
    """The sanity check's half: the architectures the installed package printed (``sm_XY`` and
    ``compute_XY`` words), checked with :func:`gpuarch.runs_on`; fails closed on no words."""
    sass = tuple(int(a) for a in re.findall(r"\bsm_(\d+)\b", report))
    ptx = tuple(int(a) for a in re.findall(r"\bcompute_(\d+)\b", report))
    if not sass and not ptx:
        return [f"the installed {package} reported no GPU architectures: {report.strip()[:200]!r}"]
    rec = gpuarch.WheelArchs(f"the installed {package}", "", cuda, sass, ptx)
    return rec.problems(cc_list)


#: The notes printed by this process (each once).
_NOTED: set = set()


def _snippet(expression: str, cc_list: tuple[int, ...], package: str) -> str:
    """The sanity check's code: print the architectures ``expression`` names, and exit with one
    line naming the capabilities they do not serve (the rule of :func:`gpuarch.runs_on`)."""
    return f"""import re
archs = ({expression})
archs = archs if isinstance(archs, str) else " ".join(str(a) for a in archs)
print(archs)
sass = [int(a) for a in re.findall(r"\\bsm_(\\d+)\\b", archs)]
ptx = [int(a) for a in re.findall(r"\\bcompute_(\\d+)\\b", archs)]
bad = [cc for cc in {list(cc_list)!r} if not (any(a // 10 == cc // 10 and a % 10 <= cc % 10 for a in sass)
                                             or any(p <= cc for p in ptx))]
if bad:
    sys.exit({json.dumps(package + " GPU architectures: ")} + archs + " do not run on compute capability "
             + ", ".join("%d.%d" % divmod(cc, 10) for cc in bad))
"""


@dataclass(frozen=True)
class WheelArchCheck(ActionBase):
    """The preflight of :class:`CudaWheelArchs`: the lock's wheels of ``package`` against the
    site's compute capabilities, from the record beside the lock (:mod:`hpcstack.install.gpuarch`).

    Args:
        lock (str): the lock file the site installs.
        package (str): the package whose wheels carry the CUDA code (``torch``).
        cc_list (tuple[int, ...]): the site's compute capabilities.
        python_version (str | None): the site's Python ``X.Y`` (which wheel of the pin it gets).
        libraries (tuple[str, ...]): the wheel members with the CUDA code (for reading a wheel).
        site_record (str): the site's own record file, ``<cache_dir>/gpu-archs.json``: what the
            install read from a wheel that the recipe's record lacks; read after the recipe's.

    Where neither record holds the site's wheel, the install's preflight (not ``--dry-run``,
    which never downloads) downloads it by the lock's hashes from the pin's index into a
    temporary directory, reads it (:func:`gpuarch.read_wheel`), deletes it, and keeps the answer
    in ``site_record`` when it passed (a refused site gets nothing written); where that fails (no
    network, no cuobjdump) it prints one note and the sanity check decides.

    Raises:
        ConfigError: (preflight, dry-run, execute) a capability the wheels do not run on, or a
            lock without the package.
    """

    lock: str
    package: str
    cc_list: tuple[int, ...]
    python_version: str | None = None
    libraries: tuple = ()
    site_record: str = ""

    def commands(self) -> tuple:
        return ()

    def _pins(self) -> list:
        from hpcstack.install.lockfile import read_lock

        pins = [p for p in read_lock(self.lock) if p.name.lower() == self.package.lower()]
        if not pins:
            raise ConfigError([f"{self.lock}: no pin of {self.package} (CudaWheelArchs)"])
        return pins

    def answer(self, read_wheels: bool = False) -> gpuarch.ArchAnswer:
        """What the records say (:func:`gpuarch.check_pin`); with ``read_wheels``, a pin that no
        record covers has its wheel downloaded and read (see the class docstring)."""
        where = gpuarch.record_path(self.lock)
        try:
            records = gpuarch.load_records(self.site_record) if self.site_record else {}
        except HpcstackError:
            records = {}  # a damaged cache is read again from the wheel
        records.update(gpuarch.load_records(where))
        answer = gpuarch.ArchAnswer()
        for pin in self._pins():
            one = gpuarch.check_pin(pin, records, self.cc_list, self.python_version, where)
            if one.note and read_wheels and self.python_version and self.libraries:
                one = self._read(pin, records, where) or one
            answer.problems += one.problems
            answer.checked += one.checked
            answer.note = answer.note or one.note
        return answer

    def _read(self, pin, records: dict, where: str) -> gpuarch.ArchAnswer | None:
        """Download and read the site's wheel of ``pin``; None where that fails."""
        import tempfile

        from hpcstack.install.runner import console

        console.print(f"reading the GPU architectures of {pin.name}=={pin.version} from its wheel "
                      f"({where} records none for Python {self.python_version}) …", markup=False)
        try:
            with tempfile.TemporaryDirectory(prefix="hpcstack-gpu-archs-") as tmp:
                rec = gpuarch.read_wheel(gpuarch.download_wheel(pin, self.python_version, tmp), self.libraries)
        except (HpcstackError, OSError) as exc:
            console.print(f"note: could not read the wheel: {exc}", markup=False)
            return None
        if rec.sha256 not in pin.hashes:
            return None
        records = {**records, rec.sha256: rec}
        one = gpuarch.check_pin(pin, records, self.cc_list, self.python_version, where)
        if not one.problems and self.site_record:
            try:
                os.makedirs(os.path.dirname(self.site_record), exist_ok=True)
                mine = gpuarch.load_records(self.site_record) if os.path.exists(self.site_record) else {}
                gpuarch.save_records(self.site_record, {**mine, rec.sha256: rec}, self.package)
            except (OSError, HpcstackError):
                pass  # a cache: the next install reads the wheel again
        return one

    def preflight(self, env: dict[str, str]) -> list[str]:
        """Problems for the install's preflight (:func:`hpcstack.install.runner.preflight`),
        reading the wheel where no record covers it; prints the note when that fails too (the
        sanity check then decides)."""
        return self._report(self.answer(read_wheels=True))

    def _report(self, answer: gpuarch.ArchAnswer) -> list[str]:
        if answer.note and answer.note not in _NOTED:  # the install's preflight runs twice
            from hpcstack.install.runner import console

            _NOTED.add(answer.note)
            console.print(f"note: {answer.note}", markup=False)
        return answer.problems

    def dry_run_check(self) -> list[str]:
        """The same check for ``--dry-run`` (:func:`hpcstack.install.runner.plan_checks`), from
        the records only (a dry-run downloads nothing)."""
        return self._report(self.answer())

    def to_bash(self) -> str:
        ccs = " ".join(str(c) for c in self.cc_list)
        return (f"# before this script runs, hpcstack checks the GPU architectures of {self.package} "
                f"recorded in {gpuarch.record_path(self.lock)} against compute capabilities {ccs} "
                "(and says so where none is recorded)")

    def execute(self, ctx: ExecContext) -> None:
        answer = self.answer()
        ctx.log.write(f"GPU architectures of {self.package}: "
                      + ("; ".join(answer.problems) or answer.note
                         or "; ".join(r.describe() for r in answer.checked)) + "\n")
        if answer.problems:
            raise HpcstackError(answer.problems[0])


@dataclass(frozen=True)
class CudaWheelArchs(Component):
    """Check that a prebuilt CUDA wheel runs on the site's GPUs (``toolchain.cuda.cc_list``).

    Before anything is written (the install's preflight and ``--dry-run``), the architectures
    recorded for the locked wheel (``hpcstack lock`` reads them with cuobjdump into
    ``<lock stem>.gpu-archs.json``, :mod:`hpcstack.install.gpuarch`) are checked: SASS ``sm_AB``
    runs on capability ``X.Y`` when ``A == X`` and ``B <= Y``; PTX ``compute_AB`` on any
    ``X.Y >= A.B``. A capability none of them serves is one line naming the wheel, its CUDA
    version and the architectures it has, exit status 2.
    Where no record exists (a lock whose index was not reachable where it was written) the
    install reads the wheel itself (:class:`WheelArchCheck`); ``--dry-run`` says so in one line.
    The sanity check evaluates ``archs`` in the installed stack and checks the answer the same
    way, in the stack's interpreter, so every CUDA stack is checked once installed, record or
    not, before it is published.
    A site without CUDA (or without ``cc_list``) gets neither.

    Args:
        package (str): the locked package that carries the CUDA code, e.g. ``"torch"``.
        libraries (tuple[str, ...]): the wheel members with its CUDA code (:mod:`fnmatch`
            patterns), e.g. ``("torch/lib/libtorch_cuda*.so",)``.
        archs (str): a Python expression, evaluated in the stack after ``imports``, whose value
            names the installed package's architectures as ``sm_XY``/``compute_XY`` words (a
            string or a list of them), e.g. ``"torch._C._cuda_getArchFlags()"`` (it answers
            without a GPU; ``torch.cuda.get_arch_list()`` returns ``[]`` there).
        imports (tuple[str, ...]): modules the expression needs (merged into the one sanity
            interpreter), e.g. ``("torch",)``.

    Example:
        ``CudaWheelArchs("torch", ("torch/lib/libtorch_cuda*.so",),
        archs="torch._C._cuda_getArchFlags()", imports=("torch",))``
    """

    package: str
    libraries: tuple[str, ...]
    archs: str
    imports: tuple[str, ...] = ()

    def lock_file(self, ctx: PlanContext) -> str:
        """The lock the site installs: that of the recipe's :class:`PipWheels` component."""
        from hpcstack.install.components.wheels import PipWheels

        wheels = ctx.recipe.component(PipWheels)
        if wheels is None:
            raise ConfigError([f"recipe {ctx.recipe.full_name}: CudaWheelArchs needs a PipWheels component"])
        return wheels.lock_file(ctx)

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}``: the preflight's check in ``wheels``, the installed
        package's check in ``sanitycheck``; nothing on a site without CUDA capabilities."""
        tc = ctx.toolchain
        if not (tc.has_cuda and tc.cuda_cc_list):
            return {}
        ccs = tuple(tc.cuda_cc_list)
        check = WheelArchCheck(self.lock_file(ctx), self.package, ccs, ctx.python_version or None,
                               tuple(self.libraries), os.path.join(ctx.cache_dir, "gpu-archs.json"))
        snippet = PythonSnippet(f"{self.package} GPU architectures", _snippet(self.archs, ccs, self.package),
                                verify=partial(_verify_installed, ccs, self.package, tc.cuda_version),
                                record="gpu-archs.txt")
        stubs = tc.cuda_stubs
        return {WHEELS: [check],
                SANITYCHECK: [PythonCheck(ctx.python, tuple(self.imports), checks=(snippet,),
                                          prepend={"LD_LIBRARY_PATH": stubs} if stubs else {})]}
