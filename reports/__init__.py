"""Fuzz-run reports: the summary (``reports.summary``) and its markdown/HTML rendering (``reports.render``).

Generated output goes under ``reports/out/`` (gitignored). matplotlib is optional: only
``reports.render.coverage_png`` imports it, lazily.
"""
