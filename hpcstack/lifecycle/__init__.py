"""A stack over the years: vulnerability audits, offline bundles, deprecation and retirement."""
