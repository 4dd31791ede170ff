"""The inference engine: plain Python + torch + transformers + jinja2.

Must not import Django, Celery or Channels (tests/engine/test_import_boundary.py enforces it).
"""

import os

# Set before torch loads its OpenMP runtime, which reads it once: torch's OpenMP workers then
# sleep between ops instead of spinning. The CPU kernels (inference/kernels/) run on a thread pool
# of their own, and spinning workers took the cores from it: on a 2-core EPYC, SmolLM2 in bfloat16
# decoded one stream at 53 tok/s with them spinning and 79 asleep; 8 int4 streams 153 and 291.
# A value already set wins; a process that imported torch before this package keeps torch's.
STARTING_OPENMP_ENV = {k: v for k, v in os.environ.items() if k == "OMP_WAIT_POLICY"}  # for llama.cpp's runs
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from inference.config import BUNDLED_MODEL, EngineConfig  # noqa: E402 (after the OpenMP setting)
from inference.events import Alternative, Beam, BeamStep, Event, Finished, Prefilled, Step  # noqa: E402
from inference.sampling_params import SamplingParams  # noqa: E402

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
