"""Full garbage collections hold the GIL, so the event loop, for as long as they walk every tracked object: about
100 ms on a shared 2-core machine for the ~100,000 objects of a gateway with its ledger's SQLAlchemy loaded (measured
with ``gc.callbacks`` in tests/integration/test_bridge_bounds.py's setting). The objects of start-up (modules,
classes, functions, the config) live as long as the process: ``gc.freeze`` moves them to the permanent generation,
where no collection walks them, and a full collection then costs what the requests in flight hold."""

from __future__ import annotations

import gc


def freeze_startup(*, full: bool = True) -> None:
    """Collect what start-up left (a full collection before the first request; only the young generations later,
    when the loop is serving), then freeze what is left."""
    gc.collect() if full else gc.collect(1)
    gc.freeze()
