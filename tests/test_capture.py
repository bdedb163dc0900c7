"""A CUDA graph capture with Python's cyclic collector held off (kvfence.engine.capture).

A collection inside a capture can free a captured graph kept in a reference cycle; destroying it is a CUDA call
not permitted while a stream captures, and CUDA invalidates the capture in progress. The H200 suite failed
that way once in ``tests/test_properties.py`` (a clean case reported "operation failed due to a previous error
during capture"). A stand-in for ``torch.cuda`` records what the collector was doing during the capture, so
the tests run on any machine.
"""

import contextlib
import gc
import types

import kvfence.contracts.draft.runner as runner_module
from kvfence.contracts.draft.runner import capture_graph


def _stand_in_cuda(events):
    """``torch.cuda`` as far as ``capture_graph`` uses it; ``graph(...)`` marks the capture in ``events``."""

    @contextlib.contextmanager
    def graph(_graph, **_kw):
        events.append("capture")
        yield

    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    return types.SimpleNamespace(Stream=lambda *device: stream, current_stream=lambda *device: stream,
                                 stream=lambda s: contextlib.nullcontext(), synchronize=lambda *device: None,
                                 CUDAGraph=lambda: types.SimpleNamespace(replay=lambda: None), graph=graph)


def test_capture_graph_holds_off_the_collector_during_the_capture_only(monkeypatch):
    events = []
    monkeypatch.setattr(runner_module, "torch", types.SimpleNamespace(cuda=_stand_in_cuda(events)))

    def fn():
        events.append("collector on" if gc.isenabled() else "collector off")

    assert gc.isenabled()
    capture_graph(fn, "cuda")
    # The warm-up runs with the collector as it was; the capture without it; afterwards it is back.
    assert events == ["collector on", "capture", "collector off"]
    assert gc.isenabled()


def test_capture_graph_leaves_a_disabled_collector_disabled(monkeypatch):
    monkeypatch.setattr(runner_module, "torch", types.SimpleNamespace(cuda=_stand_in_cuda([])))
    gc.disable()
    try:
        capture_graph(lambda: None, "cuda")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_table_contract_launch_captures_with_the_collector_paused(monkeypatch):
    """The table contracts' graph launch (``kvfence.engine.tables.launch``): warm-up, capture, replay."""
    import torch

    from kvfence.contract import Table
    from kvfence.engine import tables

    events = []
    for name, value in vars(_stand_in_cuda(events)).items():
        monkeypatch.setattr(torch.cuda, name, value)
    record = types.SimpleNamespace(
        launch=lambda kernel, views, launch: events.append("collector on" if gc.isenabled() else "collector off"))
    buffers = tables.allocate_all([Table("out", width=4, rows=2)], "cpu")
    tables.launch(record, None, buffers, None, "cuda", graph=True)
    assert events == ["collector on", "capture", "collector off"]
    assert gc.isenabled()
