"""Source builds: a :class:`~attnforge.resolve.types.BuildSpec` in, a wheel out, with progress and a log.

``execute(spec, home=...)`` is the entry point; :mod:`attnforge.build.progress` defines the events a caller
can render; a failed build raises :class:`BuildFailure` carrying a :class:`~attnforge.diagnose.Diagnosis`.
"""

from __future__ import annotations

from attnforge.build.execute import BuildFailure, BuildResult, build_environment, execute
from attnforge.build.progress import HeartbeatEvent, NullReporter, Phase, PhaseEvent, Reporter, StepEvent
from attnforge.build.sccache import SccacheStats

__all__ = ["BuildFailure", "BuildResult", "HeartbeatEvent", "NullReporter", "Phase", "PhaseEvent", "Reporter",
           "SccacheStats", "StepEvent", "build_environment", "execute"]
