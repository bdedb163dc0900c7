"""Fuzz-run reports: the summary (``kvfence.engine.summary``) and its markdown/HTML rendering
(``kvfence.reports.render``).

Generated output goes under ``reports/out/`` (gitignored). matplotlib is optional: only
``kvfence.reports.render.coverage_png`` imports it, lazily.
"""
