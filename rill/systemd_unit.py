"""`rill systemd-unit`: a systemd service unit for `rill serve` (deploy/rill.service is its output)."""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

DEFAULT_CACHE_DIR = "/var/cache/rill"
DEFAULT_ENV_FILE = "/etc/rill/rill.env"
# After --shutdown-timeout: ending what is left (up to 5 s), the workers' stop (5 s), the
# engine's stop (up to 10 s), and cleanup. systemd's SIGKILL must not come before that.
STOP_MARGIN_S = 30
_PLAIN = re.compile(r"^[\w@%+=:,./-]+$")

STATE_STORE = "sqlite:////var/lib/rill/state.db"  # in StateDirectory=rill

def systemd_quote(arg: str) -> str:
    """One word of an ExecStart= line: `%` and `$` escaped, quoted when it holds anything odd."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stop_timeout_s(shutdown_timeout_s: float) -> int:
    return math.ceil(shutdown_timeout_s) + STOP_MARGIN_S


def render_unit(*, rill: str, user: str, serve_flags: list[str], shutdown_timeout_s: float,
                cache_dir: str = DEFAULT_CACHE_DIR, watchdog_s: int = 60, env_file: str = DEFAULT_ENV_FILE) -> str:
    """The unit text. `serve_flags` go to `rill serve` as given (after --shutdown-timeout and
    --cache-dir); $RILL_ARGS from the environment file adds more at start."""
    argv = [rill, "serve", "--shutdown-timeout", f"{shutdown_timeout_s:g}", "--cache-dir", cache_dir,
            "--state-store", STATE_STORE, *serve_flags]
    exec_start = " ".join(systemd_quote(a) for a in argv) + " $RILL_ARGS"
    if cache_dir == DEFAULT_CACHE_DIR:
        cache_lines = "# Created and owned for User= by systemd, writable under ProtectSystem=strict.\nCacheDirectory=rill"
    else:
        cache_lines = f"# Create it, owned by {user}, before the first start.\nReadWritePaths={cache_dir}"
    watchdog = (f"WatchdogSec={watchdog_s}" if watchdog_s else "# WatchdogSec= is off (rill systemd-unit --watchdog-sec 0)")
    return f"""\
# Rill, an OpenAI-compatible LLM inference server. Made by `rill systemd-unit`.
# Install: copy to /etc/systemd/system/rill.service, add the user (useradd --system {user}),
# put flags in {env_file} (see deploy/rill.env.example), then: systemctl enable --now rill
[Unit]
Description=Rill OpenAI-compatible LLM inference server
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
# Only the launcher (the main process) speaks sd_notify: READY=1 once the engine is loaded and
# HTTP answers, STATUS= with running and waiting requests and tokens/s, STOPPING=1 when draining.
NotifyAccess=main
User={user}
EnvironmentFile=-{env_file}
Environment=HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME={cache_dir}/huggingface XDG_CACHE_HOME={cache_dir}
ExecStart={exec_start}
Restart=on-failure
RestartSec=5
# Exit status 2 is a bad command line: restarting would not fix it.
RestartPreventExitStatus=2
# The first start converts the bundled model (about 25 s on 2 cores); large models load longer.
TimeoutStartSec=15min
# SIGTERM goes to the launcher alone: it drains (in-flight requests get --shutdown-timeout),
# then stops the workers and the engine itself. Under the default KillMode=control-group the
# workers would get SIGTERM directly and cut their streams.
KillMode=mixed
TimeoutStopSec={stop_timeout_s(shutdown_timeout_s)}
# The launcher pings only while the engine's busy loop answers it: a hung engine is restarted.
# The engine's longest step must stay well under half of this.
{watchdog}
LimitNOFILE=65536

# Hardening. Rill needs: the cache folder writable, /tmp (its sockets; private here),
# /dev/shm (kept by PrivateDevices=), AF_UNIX for its ZeroMQ sockets, AF_INET/AF_INET6 for HTTP.
# No MemoryDenyWriteExecute=: torch and ctypes need executable memory. A GPU needs its device
# nodes: drop PrivateDevices= (or add DeviceAllow=) there. A port below 1024 needs
# AmbientCapabilities=CAP_NET_BIND_SERVICE and the same in CapabilityBoundingSet=.
{cache_lines}
# The Responses API's and Conversations' state (docs/state-store.md), kept across restarts:
# created and owned for User= by systemd. A --state-store in the flags (redis://...) wins.
StateDirectory=rill
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
ProtectProc=invisible
SystemCallArchitectures=native
# Unexpected system calls fail with EPERM instead of killing the process.
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
CapabilityBoundingSet=
UMask=0077

[Install]
WantedBy=multi-user.target
"""


def render_socket_unit(listen: str) -> str:
    """The socket unit for socket activation: systemd binds `listen` (host:port, or a Unix socket path) and
    passes it to rill.service (rill/listening.py)."""
    mode = "# Who may connect to the Unix socket.\nSocketMode=0660\n" if listen.startswith("/") else ""
    return f"""\
# Rill's listening socket, held by systemd. Made by `rill systemd-unit --socket {listen}`.
# Install beside rill.service as /etc/systemd/system/rill.socket, then: systemctl enable --now rill.socket
# systemd binds it and passes it to rill.service (socket activation), which serves it whatever --host,
# --port or --uds say: connections made while Rill starts or restarts wait in its backlog instead of
# being refused. The first connection starts rill.service if it is not running.
[Unit]
Description=Rill OpenAI-compatible LLM inference server (listening socket)

[Socket]
ListenStream={listen}
Backlog=2048
NoDelay=true
{mode}
[Install]
WantedBy=sockets.target
"""


def add_systemd_unit_parser(sub) -> None:
    ap = sub.add_parser("systemd-unit", help="print a systemd service unit for `rill serve`",
                        description="Print a systemd unit (Type=notify, watchdog, hardening) that runs "
                                    "`rill serve`. Flags after `--` go to `rill serve`.",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--user", default="rill", help="the account the service runs as")
    ap.add_argument("--exec", dest="rill", default=str(Path(sys.executable).parent / "rill"),
                    help="the rill executable (default: the one of this environment)")
    ap.add_argument("--shutdown-timeout", type=float, default=30.0,
                    help="`rill serve --shutdown-timeout`; TimeoutStopSec= is this plus a margin")
    ap.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="the writable cache folder (absolute)")
    ap.add_argument("--watchdog-sec", type=int, default=60, help="WatchdogSec= (0: off)")
    ap.add_argument("--env-file", default=DEFAULT_ENV_FILE, help="EnvironmentFile= (optional at start)")
    ap.add_argument("--socket", metavar="LISTEN", default=None,
                    help="print the socket unit (rill.socket) for socket activation instead: systemd listens on "
                         "LISTEN (127.0.0.1:8000, [::]:8000, or a Unix socket path) and passes it to rill.service")
    ap.add_argument("serve_flags", nargs=argparse.REMAINDER, help="-- then flags for `rill serve`")


def print_unit(args, serve_parser) -> int:
    """Validates the serve flags with serve's own parser (exit 2 on a bad one), prints the unit."""
    if args.socket is not None:
        if not _PLAIN.match(args.socket.replace("[", "").replace("]", "")):
            print(f"rill systemd-unit: --socket {args.socket!r}: host:port or a path, without spaces", file=sys.stderr)
            return 2
        print(render_socket_unit(args.socket), end="")
        return 0
    flags = args.serve_flags[1:] if args.serve_flags[:1] == ["--"] else args.serve_flags
    for name, path in (("--exec", args.rill), ("--cache-dir", args.cache_dir), ("--env-file", args.env_file)):
        if not path.startswith("/") or not _PLAIN.match(path):
            print(f"rill systemd-unit: {name} {path!r}: an absolute path without spaces or quotes", file=sys.stderr)
            return 2
    parser = argparse.ArgumentParser(prog="rill")
    serve_parser(parser.add_subparsers(dest="command"))
    serve_args = parser.parse_args(["serve", "--shutdown-timeout", str(args.shutdown_timeout), *flags])
    print(render_unit(rill=args.rill, user=args.user, serve_flags=flags,
                      shutdown_timeout_s=serve_args.shutdown_timeout, cache_dir=args.cache_dir,
                      watchdog_s=args.watchdog_sec, env_file=args.env_file), end="")
    return 0
