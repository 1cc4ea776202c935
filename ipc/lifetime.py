"""Child processes die with the process that started them, however it dies."""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to kill us when our parent dies (SIGKILL included, which runs no cleanup).

    The engine and the tensor-parallel ranks call it at start; so does each API worker, which
    leaves the launcher's process group (asgi/app.py) and so is out of reach of `kill -9 -PGID`.
    """
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: watch the parent instead
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
        return
    if os.getppid() != parent:  # it died before the request took hold
        os._exit(1)
