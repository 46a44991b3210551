"""The collector after start-up: a served gateway that kept Python's default cyclic
garbage collection spent about a tenth of its event loop in full collections at 2,000 messages/s
(each one walked the ~200,000 objects of the imported libraries and the opened store, 100 ms or
more: the p99), and a few per cent more in young ones. ``settle_heap`` runs once the daemon
listens: one full collection, then ``gc.freeze()`` moves every object alive then (modules, the
settings, the store's state at open) out of the collector's sight (reference counting still
frees them), and the young generation's threshold is raised, since nearly everything a request
allocates is freed by reference counting before a collection could see it."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 7000  # default 700: a young collection every few requests


def settle_heap() -> None:
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
