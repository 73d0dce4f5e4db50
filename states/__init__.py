"""`states/` knows models: routing (`states.routing`), one ModelState per file, pooling,
loading, and the runtime workers call.

The package itself imports nothing heavy, so `states.options` and `states.errors` (what
the front door needs to validate options) load without torch; the routing names below
resolve on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_ROUTING = (
    "STATES", "DecoderState", "EncoderDecoderState", "EncoderOnlyState", "Execution", "ModelState", "Pack",
    "RecurrentState", "UnclassifiedModelError", "init_model_state", "register_state", "resolve_state",
)
__all__ = list(_ROUTING)


def __getattr__(name: str) -> Any:
    if name in _ROUTING:
        return getattr(importlib.import_module("states.routing"), name)
    raise AttributeError(f"module 'states' has no attribute {name!r}")
