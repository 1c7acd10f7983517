"""What follows a recorded validation: the site's ``revalidation`` actions.

After each run recorded in the site's history (:func:`hpcstack.validate.history.record_validation`),
:func:`after_record` compares the stack's verdicts before and after the run
(:func:`hpcstack.validate.verdict.verdicts`) and, for each tier whose verdict changed to DEGRADED
or FAILED (:func:`changes`):

* ``revalidation.notify``: one message to the apprise URLs (https://github.com/caronc/apprise,
  ``apprise.Apprise().add(url)`` then ``notify(title=, body=)``): the verdict's lines, what
  changed since the last OK run first (:meth:`~hpcstack.validate.verdict.StackVerdict.lines`);
* ``revalidation.deprecate_on_failed`` (opt-in, FAILED only): the stack is deprecated with the
  lifecycle's own :func:`hpcstack.lifecycle.deprecation.deprecate` (no date: it stays loadable,
  its modulefile warns; ``hpcstack module undeprecate`` reverts it).

Neither raises: a failure is one warning line (the run's record stands).
"""

from __future__ import annotations

import sys

#: The verdicts that are told and acted on.
ALERTS = ("DEGRADED", "FAILED")


def config_of(site) -> dict:
    """The site's ``revalidation`` section (``{}`` without one)."""
    from hpcstack.site import revalidation_of

    return revalidation_of(site)


def changes(before: list, after: list, stack: str) -> list:
    """The verdicts of ``stack`` in ``after`` that are DEGRADED or FAILED and were not so (the
    same verdict) in ``before``."""
    old = {(v.stack, v.tier): v.verdict for v in before}
    return [v for v in after if v.stack == stack and v.verdict in ALERTS and old.get((v.stack, v.tier)) != v.verdict]


def message(site_name: str, verdict) -> tuple[str, str]:
    """The notification's title and body for one verdict."""
    title = f"hpcstack {site_name}: {verdict.stack} [{verdict.tier}] {verdict.verdict}"
    return title, "\n".join(verdict.lines()) + f"\n\n(hpcstack status --site {site_name} for details)"


def notify(urls: list[str], title: str, body: str, apprise_module=None) -> bool:
    """Send one message through apprise to ``urls``; True when apprise says it was sent.

    Raises:
        ImportError: apprise is not installed (and none was given).
    """
    if apprise_module is None:
        import apprise as apprise_module
    sender = apprise_module.Apprise()
    for url in urls:
        sender.add(url)
    return bool(sender.notify(title=title, body=body))


def after_record(site, before: list, after: list, stack: str, *, apprise_module=None, deprecate=None,
                 err=None) -> list[str]:
    """Run the site's actions for ``stack``'s changed verdicts; return one line per action taken.

    Args:
        site: the site (its ``revalidation`` section).
        before, after (list[StackVerdict]): the verdicts before and after the run.
        stack (str): ``NAME/VERSION``.
        apprise_module, deprecate: stand-ins for apprise and
            :func:`hpcstack.lifecycle.deprecation.deprecate` (tests).
        err: where warnings go (default stderr).
    """
    err = err or sys.stderr
    cfg = config_of(site)
    done = []
    for v in changes(before, after, stack):
        urls = list(cfg.get("notify") or [])
        if urls:
            try:
                sent = notify(urls, *message(site.name, v), apprise_module=apprise_module)
                done.append(f"notified {len(urls)} URL(s): {v.stack} [{v.tier}] {v.verdict}" if sent else
                            f"notification of {v.stack} [{v.tier}] {v.verdict} not sent (apprise said no)")
            except Exception as exc:  # noqa: BLE001 - any failure of a notification service is one line
                done.append(f"notification of {v.stack} [{v.tier}] {v.verdict} failed: {exc}")
        if v.verdict == "FAILED" and cfg.get("deprecate_on_failed"):
            try:
                if deprecate is None:
                    from hpcstack.lifecycle.deprecation import deprecate
                deprecate(site, v.stack, None, None,
                          f"its validation ({v.tier}) FAILED" + (f" since {v.since[:10]}" if v.since else ""))
                done.append(f"deprecated {v.stack} (revalidation.deprecate_on_failed)")
            except Exception as exc:  # noqa: BLE001 - the run's record stands
                done.append(f"deprecation of {v.stack} failed: {exc}")
    for line in done:
        print(f"hpcstack: {line}", file=err)
    return done


def after_recorded(site, stack: str, before: list, after: list) -> None:
    """After a run is recorded (what :func:`hpcstack.validate.history.record_validation` is given
    to call): the site's ``revalidation`` actions on a verdict that changed (:func:`after_record`)
    and the status file ``module load`` reads (:mod:`hpcstack.validate.statusfile`). Never raises:
    a failure is one warning line.

    Args:
        site: the site.
        stack (str): ``NAME/VERSION``.
        before, after (list[Run]): the site's history before and after the run was recorded.
    """
    from hpcstack.errors import HpcstackError
    from hpcstack.validate import statusfile, verdict

    try:
        after_record(site, verdict.site_verdicts(site, before), verdict.site_verdicts(site, after), stack)
        statusfile.write_status_file(site, after)
    except (HpcstackError, OSError, ValueError) as exc:
        print(f"warning: the status file or the site's revalidation actions: {exc}", file=sys.stderr)
