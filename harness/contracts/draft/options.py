"""The flags the draft kernel and the window rail declare (``kvfence.contract.Option``): the config fields a user
pins (``--topk 2``), the §6 family's fields (docs/contract.md §6) and how the family and the request lengths are
drawn. ``kvfence fuzz --contract draft --help`` lists them; a value given reaches ``draws`` as ``domain.pin``.
``--shard`` deals out topk, steps and pages over the domain's ranges (``kvfence.contracts.draft.domain``)."""

from __future__ import annotations

from typing import Tuple

from kvfence.contract import Option
from kvfence.contracts.draft.domain import DOMAINS

_PINNED = "pin this config field (default: drawn by Hypothesis)"
_POSITIVE = (1, None)


def _topks(domain: str) -> Tuple[int, ...]:
    return tuple(range(1, DOMAINS[domain].max_topk + 1))


def _steps(domain: str) -> Tuple[int, ...]:
    return tuple(range(1, DOMAINS[domain].max_steps + 1))


def _pages(domain: str) -> Tuple[int, ...]:
    return tuple(DOMAINS[domain].page_sizes)


OPTIONS: Tuple[Option, ...] = (
    Option("seq_len_limit", str, "ctx", "longest request: ctx, or ctx-steps (requests keep num_steps of draft "
                                        "headroom)", choices=("ctx", "ctx-steps")),
    Option("topk", int, None, _PINNED, bounds=_POSITIVE, shard=_topks),
    Option("num_steps", int, None, _PINNED, bounds=_POSITIVE, shard=_steps),
    Option("page_size", int, None, _PINNED, bounds=_POSITIVE, shard=_pages),
    Option("ctx", int, None, _PINNED, bounds=_POSITIVE),
    Option("max_bs", int, None, _PINNED, bounds=_POSITIVE),
    Option("window", int, None, "pin window_size, the sliding window (0: none; default: drawn when the kernel takes "
                                "it)", bounds=(0, None)),
    Option("sink", int, None, "pin sink_size, the attention sinks kept beside the window (default: drawn when the "
                              "kernel takes it)", bounds=(0, None)),
    Option("entry_page_size", int, None, "pin ENTRY_PAGE_SIZE, tokens per req_to_token entry, a power of two "
                                         "(default: drawn when the kernel takes it)", bounds=_POSITIVE),
    Option("translate", str, None, "pin TRANSLATE, reads through a drawn v2p page table (default: drawn when the "
                                   "kernel takes it)", choices=("on", "off")),
    Option("family", str, "auto", "draw the §6 fields (window, sinks, entry page size, translation) for a kernel "
                                  "that takes them: auto = in every example on the CPU domain and in one example in "
                                  "four on the GPU domain (there §6 cases are verified on the host, so those "
                                  "examples are configs of at most 16 MiB and 4 batches); on = in every example, "
                                  "off = never (default: auto)", choices=("auto", "on", "off"), canary="off"),
)
