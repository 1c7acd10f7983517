"""The built-in export formats: the plan as a stand-alone bash script, and as JSON."""

from __future__ import annotations

from hpcstack import __version__
from hpcstack.export.formats import register_exporter


@register_exporter
class BashScript:
    """The install as one bash script (what ``hpcstack install --dry-run`` prints), for a site
    that reviews, or runs, the commands itself: every step's commands with their environment."""

    name = "bash"
    description = "the install as a stand-alone bash script (the dry-run)"
    suffix = ".sh"

    def render(self, recipe, site, plan) -> str:
        """Return the script text.

        Args:
            recipe (hpcstack.recipe.Recipe): the recipe (unused: the plan holds it all).
            site (hpcstack.site.Site): the site (unused).
            plan (hpcstack.install.plan.Plan): the resolved plan.
        """
        return plan.to_bash(__version__)


@register_exporter
class PlanJson:
    """The resolved plan as JSON: steps, actions, commands, environment, paths."""

    name = "json"
    description = "the resolved plan as JSON"
    suffix = ".json"

    def render(self, recipe, site, plan) -> str:
        """Return the JSON text (see :meth:`hpcstack.install.plan.Plan.to_json`)."""
        return plan.to_json(__version__)
