"""kvfence: differential fuzzing and memory-safety checks for EAGLE draft-decode kv-indices kernels.

The public API for a project's own tests (docs/own-kernel.md):

* ``kvfence.check_kernel("path/to/kernel.py:attr", sizing=..., max_examples=..., device=...)`` fuzzes a
  kernel, shrinks a failure and raises ``AssertionError`` with the findings and a repro command;
* ``kvfence.contracts.draft.strategies`` (``configs``, ``batches``, ``cases``) for a test's own ``@given``;
* the pytest plugin (``kvfence.pytest_plugin``, loaded by the installed package).

``import kvfence`` imports neither torch nor triton: the device (compiled or interpreted) must be
chosen before triton is imported (``kvfence.device``), so the API is loaded on first use.
"""

__all__ = ["check_kernel"]


def __getattr__(name):
    if name == "check_kernel":
        from kvfence.engine.api import check_kernel

        return check_kernel
    raise AttributeError(f"module 'kvfence' has no attribute {name!r}")
