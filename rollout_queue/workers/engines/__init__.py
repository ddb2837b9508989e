"""Generation engines behind one interface (``workers.engines.base.Engine``).

Only the torch- and vLLM-free interface is re-exported here; ``make_engine`` imports the heavy
backend module lazily, so importing this package never pulls in torch or vLLM.
"""

from rollout_queue.workers.engines.base import (
    Engine,
    EngineError,
    FinishReason,
    RequestFailed,
    SampleOutput,
    SamplingConfig,
    make_engine,
)

__all__ = [
    "Engine",
    "EngineError",
    "FinishReason",
    "RequestFailed",
    "SampleOutput",
    "SamplingConfig",
    "make_engine",
]
