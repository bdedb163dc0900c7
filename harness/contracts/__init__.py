"""kvfence's own contract records (``kvfence.contract.Contract``), one module per kernel family.

The engine never imports these modules: it loads each record by its entry point (``pyproject.toml``, group
``kvfence.contracts``), as it loads another package's. ``tables`` is the tier the page-table builders are
written in (tables, an element oracle, a launcher); ``draft`` holds the draft kernel and the window rail.
"""
