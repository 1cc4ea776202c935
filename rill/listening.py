"""Where `rill serve` listens, and how: a TCP address (--host, --port), a Unix socket (--uds), or the socket systemd
passed it (socket activation: LISTEN_FDS, LISTEN_PID), each with TLS (--ssl-certfile, --ssl-keyfile; vLLM's
names) or without. The flags are checked before anything starts; the launcher checks that a worker answers
there before it tells systemd READY=1.

With socket activation systemd holds the listening socket across restarts: connections made while Rill starts
or restarts wait in its backlog instead of being refused.
"""
from __future__ import annotations

import argparse
import http.client
import os
import socket
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): the first passed descriptor
LISTEN_VARS = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


def add_listen_flags(ap: argparse.ArgumentParser) -> None:
    """README: "Listening"; docs/listening.md."""
    net = ap.add_argument_group("listening (docs/listening.md)")
    net.add_argument("--uds", default=None, help="listen on this Unix-domain socket path instead of --host/--port")
    net.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM, the chain after it)")
    net.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM); needs --ssl-certfile")
    net.add_argument("--ssl-ca-certs", default=None,
                     help="CA certificates (PEM) that client certificates are checked against (mutual TLS)")
    net.add_argument("--ssl-cert-reqs", type=int, choices=[0, 1, 2], default=0,
                     help="client certificates, as Python's ssl.CERT_*: 0 none asked (default), 2 required and "
                          "checked against --ssl-ca-certs (1 is taken as 2)")


def check_listen_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Exits (status 2) with one line naming the flag: a half-given certificate, an unreadable file, a client
    check without CAs, a socket path whose folder does not exist."""
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
    for flag in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(args, flag)
        if path is not None and not os.access(path, os.R_OK):
            parser.error(f"--{flag.replace('_', '-')} {path}: not a readable file")
    if args.ssl_ca_certs and not args.ssl_certfile:
        parser.error("--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile (TLS)")
    if args.ssl_cert_reqs and not args.ssl_ca_certs:
        parser.error("--ssl-cert-reqs needs --ssl-ca-certs (the CAs client certificates are checked against)")
    if args.ssl_certfile:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        except (ssl.SSLError, OSError) as exc:
            parser.error(f"--ssl-certfile/--ssl-keyfile do not load: {exc}")
    if args.uds is not None and not Path(args.uds).resolve().parent.is_dir():
        parser.error(f"--uds {args.uds}: its folder does not exist")


def systemd_socket(environ: dict | None = None) -> int:
    """The listening socket systemd passed this process (its first, fd 3), or -1. The variables are taken out of
    the environment, so that the engine and the workers never read them as theirs."""
    environ = os.environ if environ is None else environ
    fds, pid, _ = (environ.pop(name, "") for name in LISTEN_VARS)
    if not fds.isdigit() or int(fds) < 1 or pid != str(os.getpid()):
        return -1
    os.set_inheritable(SD_LISTEN_FDS_START, True)  # Granian's workers serve it
    return SD_LISTEN_FDS_START


def reserve_port(host: str, port: int) -> socket.socket:
    """The TCP socket the workers will serve, bound now, before the model loads, and listening only once they start.
    Granian's own socket takes SO_REUSEPORT, under which a second `rill serve` on a port already served started as
    if nothing were wrong and took part of its connections; bound here without it, a port another process holds is
    an OSError (EADDRINUSE) at once. SO_REUSEADDR lets a restart bind despite its predecessor's closed connections."""
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)  # Granian's workers serve it
    return sock


def free_uds(path: str) -> str | None:
    """None when `path` is free for --uds: nothing there, or a socket no process listens on (a server killed before it
    could remove its own, which Granian's bind then refused: "Address already in use", and no restart came up),
    removed here. Else why not: another server listens there, or it is not a socket (never removed)."""
    there = Path(path)
    if not there.exists() and not there.is_symlink():
        return None
    if not stat.S_ISSOCK(there.lstat().st_mode):
        return f"{path} exists and is not a socket"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return f"another server listens on {path}"
    except ConnectionRefusedError:
        there.unlink()
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    finally:
        probe.close()


@dataclass(frozen=True)
class Listener:
    """Where the workers answer, as the launcher reaches them."""

    host: str = "127.0.0.1"
    port: int = 8000
    uds: str = ""
    fd: int = -1  # systemd's socket
    tls: bool = False

    @classmethod
    def of(cls, host: str, port: int, uds: str | None, fd: int, tls: bool) -> Listener:
        if fd >= 0:  # where systemd's socket is bound, whatever the flags say
            sock = socket.socket(fileno=os.dup(fd))
            try:
                name = sock.getsockname()
                if sock.family == socket.AF_UNIX:
                    return cls(uds=name if isinstance(name, str) else name.decode(), fd=fd, tls=tls)
                return cls(host=name[0], port=name[1], fd=fd, tls=tls)
            finally:
                sock.close()
        return cls(host=host, port=port, uds=uds or "", tls=tls)

    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        where = f"unix:{self.uds}" if self.uds else f"{self.host}:{self.port}"
        return f"{scheme}://{where}" + (f" (systemd's socket, fd {self.fd})" if self.fd >= 0 else "")

    def answers(self, timeout_s: float = 1.0) -> bool:
        """Does a worker answer HTTP there? Any response counts: a worker served it."""
        conn = None
        try:
            conn = self._connection(timeout_s)
            conn.request("GET", "/health")
            conn.getresponse().read()
            return True
        except ssl.SSLError:  # a worker's TLS refused us (mutual TLS: the probe has no client certificate)
            return True
        except (OSError, http.client.HTTPException):
            return False
        finally:
            if conn is not None:
                conn.close()

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if self.tls:  # our own server: its certificate need not name the address we probe
            context = ssl._create_unverified_context()
            conn = http.client.HTTPSConnection(host, self.port, timeout=timeout_s, context=context)
        else:
            conn = http.client.HTTPConnection(host, self.port, timeout=timeout_s)
        if self.uds:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            try:
                sock.connect(self.uds)
            except OSError:
                sock.close()
                raise
            conn.sock = context.wrap_socket(sock) if self.tls else sock
        return conn
