"""A request's `priority` (vLLM's field: lower runs first), honoured under --scheduling-policy priority
(engine_proc/sched/priority.py). Under fcfs a non-zero priority is a 400, as vLLM answers it: the caller
would otherwise believe it was honoured."""
from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from rill.asgi.errors import APIError
from rill.engine_proc.sched.priority import MAX_PRIORITY

Priority = Annotated[int, Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]


def request_priority(priority: int, limits) -> int:
    """The priority to send the engine; a 400 naming `priority` when this server schedules first come, first served."""
    if priority and limits.scheduling_policy != "priority":
        raise APIError(400, "`priority` is honoured only when the server runs with `--scheduling-policy priority`; "
                            "this one serves requests first come, first served.", param="priority")
    return priority
