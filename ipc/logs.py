"""How every process of a run logs (launcher, Granian, API workers, engine): text or JSON lines.

One `logging.config.dictConfig` for all of them: the launcher applies it, hands it to Granian
(which applies it again in each worker) and the engine process applies it from its
EngineConfig. A record may carry `fields` (a dict: the access line's figures) and a
`request_id` (set in the API workers while a request runs); both formats show them.
"""
from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
import time

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The logger of the --log-requests lines (prompts and messages): off unless asked for, at any --log-level.
REQUESTS_LOGGER = "rill.requests"
_LOGGED_OFF = logging.CRITICAL + 10


def _text_value(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    # Quoted when it could be misread as several pairs or lines; json escapes newlines.
    if not text or any(c in text for c in ' "=\n\r\t'):
        return json.dumps(text, ensure_ascii=False)
    return text


def _extras(record: logging.LogRecord) -> dict:
    fields = dict(getattr(record, "fields", None) or {})
    request_id = getattr(record, "request_id", None)
    if request_id is not None:
        fields.setdefault("request_id", request_id)
    return fields


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`, one line per record."""

    def __init__(self):
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if not extras:
            return line
        pairs = " ".join(f"{k}={_text_value(v)}" for k, v in extras.items() if v is not None and v is not False)
        head, sep, rest = line.partition("\n")  # a traceback stays below the pairs
        return f"{head} {pairs}{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, pid, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process or os.getpid(),
        }
        for key, value in _extras(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_config(level: str, log_format: str = "text", log_requests: bool = False) -> dict:
    """The dictConfig of a run; Granian's own loggers go through the same handler."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {LOG_FORMATS}")
    level = level.upper()
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"rill": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "rill", "stream": "ext://sys.stderr"}},
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "_granian": {"level": level, "handlers": [], "propagate": True},
            "granian.access": {"level": level, "handlers": [], "propagate": True},
            REQUESTS_LOGGER: {"level": logging.DEBUG if log_requests else _LOGGED_OFF},
        },
    }


def configure_logging(level: str, log_format: str = "text", log_requests: bool = False) -> dict:
    """Apply the run's logging config in this process; returns it (for Granian's workers)."""
    config = log_config(level, log_format, log_requests)
    logging.config.dictConfig(config)
    logging.captureWarnings(True)  # warnings.warn(...) as log records, in the same format
    return config


def route_transformers_logs() -> None:
    """transformers prints through a handler of its own: its records go through ours instead, once it is imported.
    Called where the engine imports it (its config reader's fallback, its models, the grammar compiler's tokenizer)
    and after start-up; not before, as the native runner needs none of its 1.5 s of imports."""
    if "transformers" not in sys.modules:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
