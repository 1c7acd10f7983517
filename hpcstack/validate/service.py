"""The validation service: ``hpcstack validate`` for any recipe, in one place.

``hpcstack validate`` parses its arguments and hands them over as a :class:`ValidationRequest`;
:class:`ValidationService` checks the request against the recipe's validation (its backends, the
options each mode takes), picks the mode and runs it:

* **Slurm jobs** (:func:`hpcstack.validate.validation.slurm_validation`), the default for a site
  with a ``slurm`` section; ``--collect DIR`` reports on the jobs of an earlier ``--no-wait``;
* **local** (:func:`hpcstack.validate.validation.local_validation`), with ``--local`` or for a
  site without a ``slurm`` section.

Bad requests raise :class:`hpcstack.errors.ConfigError` with one line per problem (exit status 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcstack.errors import ConfigError
from hpcstack.validate.validation import (collect, local_validation, parse_nodes, slurm_validation,
                                          validation_settings)
from hpcstack.install.components.validation import validation_of

#: ``--backend`` values that mean every backend of the recipe.
ALL_BACKENDS = ("all", "both")


@dataclass(frozen=True)
class ValidationRequest:
    """What ``hpcstack validate`` was asked to do (the command line's options).

    Attributes:
        nodes (str | None): ``--nodes`` as given (``"1,2"``).
        backend (str | None): a backend of the recipe, ``all`` (``both``), or None (the recipe's).
        partition, qos, account (str | None): Slurm overrides.
        output_dir (str | None): where the jobs write.
        no_wait (bool): submit and return.
        then_collect (list[str] | None): submit, then a collector job running this argv with
            ``--collect DIR`` once the jobs end (:func:`hpcstack.validate.validation.submit_collector`).
        collect (str | None): report on an earlier ``--no-wait`` run's directory.
        local (bool): run on this host.
        ranks (int | None): ranks of a local run.
        workload (str | None): a named workload of the recipe.
        dry_run (bool): print, run nothing.
        as_json (bool): JSON output.
        tier (str | None): the history's tier of the run (``--tier``; None: ``install`` for a
            build's first validation, else ``manual``).
    """

    nodes: str | None = None
    backend: str | None = None
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    output_dir: str | None = None
    no_wait: bool = False
    then_collect: list | None = None
    collect: str | None = None
    local: bool = False
    ranks: int | None = None
    workload: str | None = None
    dry_run: bool = False
    as_json: bool = False
    tier: str | None = None


def requested_backends(recipe, backend: str | None) -> list[str] | None:
    """The backends ``--backend`` names: None (the recipe's default), all of them, or one.

    Raises:
        ConfigError: not a backend of the recipe's validation (the line lists them).
    """
    if backend is None:
        return None
    spec = validation_of(recipe)
    if backend in ALL_BACKENDS:
        return list(spec.backends)
    if backend not in spec.backends:
        raise ConfigError([f"--backend {backend}: not a backend of {recipe.full_name}'s validation "
                           f"(known: {', '.join([*spec.backends, 'all'])})"])
    return [backend]


class ValidationService:
    """Validate one recipe's installed stack at one site.

    Args:
        site (hpcstack.site.Site): the site.
        recipe (hpcstack.recipe.Recipe): the recipe, with a Validation component.
        policy (hpcstack.trust.Policy | None): whom to trust with the validation's directory (the
            command's :class:`hpcstack.session.Session` policy); default root and the running account.

    Example:
        ``ValidationService(site, recipe).run(ValidationRequest(nodes="1,2"))``
    """

    def __init__(self, site, recipe, policy=None):
        self.site = site
        self.recipe = recipe
        self.policy = policy

    def run(self, request: ValidationRequest) -> int:
        """Run the validation the request asks for.

        Returns:
            int: 0 PASS, 1 FAIL.

        Raises:
            ConfigError: options that do not fit the mode, an unknown backend, bad ``--nodes``.
            HpcstackError: the stack is not installed, Slurm or the launcher failed.
        """
        r, site, recipe = request, self.site, self.recipe
        slurm_only = {"--nodes": r.nodes, "--partition": r.partition, "--qos": r.qos,
                      "--account": r.account, "--output-dir": r.output_dir,
                      "--no-wait": r.no_wait, "--collect": r.collect, "--then-collect": r.then_collect}
        if r.local or not site.slurm:
            why = "--local" if r.local else f"site {site.name} has no slurm section (local launcher)"
            problems = [f"{opt}: not used with {why}" for opt, value in slurm_only.items() if value]
            local = validation_settings(site, recipe, workload=r.workload).spec.local_backends
            backend = None
            if r.backend is not None and r.backend not in ALL_BACKENDS:
                if r.backend not in local:
                    problems.append(f"--backend {r.backend}: the local launcher runs the "
                                    f"{', '.join(local) or 'no'} backend only")
                backend = r.backend
            if r.ranks is not None and r.ranks < 1:
                problems.append("--ranks: must be at least 1")
            if r.dry_run and r.as_json:
                problems.append(f"--json: not with --dry-run and {why} (that dry run prints the commands as bash)")
            if problems:
                raise ConfigError(problems)
            return local_validation(site, recipe, ranks=r.ranks, dry_run=r.dry_run, as_json=r.as_json,
                                    workload=r.workload, backend=backend, policy=self.policy)
        if r.ranks is not None:
            raise ConfigError(["--ranks: only with --local (Slurm jobs take --nodes and the site's "
                               "slurm.tasks_per_node)"])
        if r.collect:
            clash = [opt for opt, value in (("--dry-run", r.dry_run), ("--no-wait", r.no_wait),
                                            ("--nodes", r.nodes), ("--output-dir", r.output_dir),
                                            ("--workload", r.workload)) if value]
            if clash:
                raise ConfigError([f"{opt}: not used with --collect" for opt in clash])
            return collect(site, recipe, r.collect, as_json=r.as_json, policy=self.policy, tier=r.tier)
        return slurm_validation(
            site, recipe, nodes=parse_nodes(r.nodes) if r.nodes else None,
            backends=requested_backends(recipe, r.backend), partition=r.partition, qos=r.qos,
            account=r.account, output_dir=r.output_dir, dry_run=r.dry_run, no_wait=r.no_wait,
            as_json=r.as_json, workload=r.workload, policy=self.policy, tier=r.tier,
            then_collect=None if r.dry_run else r.then_collect)
