"""The validation report, judging and rendering together: a name kept for existing imports.

Judging lives in :mod:`hpcstack.validate.judge` (sanity, performance references -> verdicts) and
rendering in :mod:`hpcstack.validate.render` (JSON, markdown, PNG); new code imports from those.
:mod:`hpcstack.site` imports :data:`FIGURES` from here.
"""

from hpcstack.validate.judge import (FIGURES, FigureOutcome, Reference, RunOutcome, RunVerdict, Verdict,
                                     build_report, fmt, judge, lookup_references, measured_figures,
                                     sanity_reasons, scaling_efficiency)
from hpcstack.validate.render import plot_scaling, to_markdown, write_report

__all__ = ["FIGURES", "FigureOutcome", "Reference", "RunOutcome", "RunVerdict", "Verdict", "build_report",
           "fmt", "judge", "lookup_references", "measured_figures", "plot_scaling", "sanity_reasons",
           "scaling_efficiency", "to_markdown", "write_report"]
