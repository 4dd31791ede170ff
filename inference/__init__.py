"""The inference engine: plain Python + torch + transformers + jinja2.

Must not import Django, Celery or Channels (tests/inference/test_import_boundary.py enforces it).
"""

from inference.config import BUNDLED_MODEL, EngineConfig
from inference.events import Alternative, Beam, BeamStep, Event, Finished, Prefilled, Step
from inference.sampling_params import SamplingParams

__all__ = [
    "BUNDLED_MODEL",
    "EngineConfig",
    "SamplingParams",
    "Alternative",
    "Beam",
    "BeamStep",
    "Event",
    "Finished",
    "Prefilled",
    "Step",
]
