"""Speaking speed: audio time-stretched with its pitch kept.

`speed` 0.5-2.0 (1.0: as the model speaks) is a setting of the speech API and of jobs.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)
SPEED_MIN, SPEED_MAX = 0.5, 2.0


def check_speed(speed) -> float:
    """`speed` as a float within SPEED_MIN..SPEED_MAX (None: 1.0); else ValueError saying the range."""
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not SPEED_MIN <= speed <= SPEED_MAX:
        raise ValueError(f"speed must be a number from {SPEED_MIN} to {SPEED_MAX} (1.0: the model's own pace), "
                         f"got {speed!r}")
    return float(speed)
