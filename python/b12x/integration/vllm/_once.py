"""Messages the adapters log once per process (vLLM calls them per layer and per step)."""

from __future__ import annotations

import logging
from typing import Any

# (logger name, text) of every message logged so far; tests reset it.
LOGGED: set[tuple[str, str]] = set()


def log_once(logger: logging.Logger, level: int, message: str, *args: Any) -> None:
    """Logs ``message % args`` on `logger` the first time this process sees that text there."""
    text = message % args if args else message
    if (logger.name, text) not in LOGGED:
        LOGGED.add((logger.name, text))
        logger.log(level, text)
