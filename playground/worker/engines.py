"""The loaded engine of this worker process: one model at a time, loaded lazily on first use.

Owns: the model cache keyed by (record id, engine settings), so a changed admin record loads
anew and the previous model's memory is freed first. `inference.engine` (torch) is imported
only when a model is first loaded, so importing this module stays cheap.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

from playground.models import LanguageModel

if TYPE_CHECKING:
    from inference.engine import Engine

logger = logging.getLogger(__name__)

_loaded: tuple[tuple[Any, ...], Engine] | None = None


def get_engine(model: LanguageModel) -> Engine:
    """The engine for `model`, loading it (and dropping the previous one) when needed."""
    global _loaded
    config = model.to_engine_config()
    key = (model.pk, config)
    if _loaded is not None and _loaded[0] == key:
        return _loaded[1]
    _loaded = None
    gc.collect()  # free the previous model's memory before loading the next
    from inference.engine import Engine

    logger.info("loading model %r (%s)", model.name, config)
    engine = Engine.load(config, progress=lambda message: logger.info("%s: %s", model.name, message))
    _loaded = (key, engine)
    return engine
