"""Where `rill serve` listens: HTTPS with client certificates (real TLS clients: httpx and the OpenAI SDK), a
Unix-domain socket, and systemd's socket activation through the real `systemd-socket-activate`, where a request
sent before the server is up waits in the socket's backlog and is answered instead of refused."""
from __future__ import annotations

import shutil
import ssl
import threading
import time

import httpx
import openai
import pytest

from rill.bench.serving.servers import RILL, ServerProcess, free_port
from rill.cli import main as rill_main
from rill.listening import Listener, free_uds, systemd_socket
from tests.helpers.server import TINY_MODEL, leftovers

trustme = pytest.importorskip("trustme")
BODY = {"model": TINY_MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, the server's certificate for 127.0.0.1 and a client's, all PEM files."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("client@example.com")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key", "client")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    client.private_key_and_cert_chain_pem.write_to_path(paths["client"])
    return paths


def serve(argv_head: list[str], tmp_path, tiny_dir, *flags: str, port: int) -> ServerProcess:
    argv = [*argv_head, str(RILL), "serve", "--model", str(tiny_dir), "--load-format", "dummy", "--served-model-name",
            TINY_MODEL, "--max-model-len", "128", "--enforce-eager", "--log-level", "warning", "--port", str(port),
            *flags]
    return ServerProcess(argv, port, tmp_path / "serve.log")


def wait_ready(srv: ServerProcess, http: httpx.Client, base_url: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert srv.proc.poll() is None, srv.log()
        try:
            if http.get(f"{base_url}/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not ready:\n{srv.log()}")


def stop(srv: ServerProcess) -> None:
    assert srv.stop() == 0, srv.log()
    assert leftovers(srv.proc.pid) == []


def test_https_with_client_certificates(tmp_path, tiny_dir, certs):
    port = free_port()
    srv = serve([], tmp_path, tiny_dir, "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(certs["key"]),
                "--ssl-ca-certs", str(certs["ca"]), "--ssl-cert-reqs", "2", port=port)
    trusted = ssl.create_default_context(cafile=str(certs["ca"]))
    trusted.load_cert_chain(str(certs["client"]))
    url = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=trusted) as http:
            wait_ready(srv, http, url)
            sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", http_client=http, max_retries=0,
                                _strict_response_validation=True)
            assert sdk.completions.create(**BODY).usage.completion_tokens == 3
        assert Listener(port=port, tls=True).answers()  # the launcher's readiness probe, without a certificate
        no_client_cert = ssl.create_default_context(cafile=str(certs["ca"]))
        with pytest.raises(httpx.HTTPError):  # mutual TLS: no certificate, no answer
            httpx.post(f"{url}/v1/completions", json=BODY, verify=no_client_cert, timeout=10)
        with pytest.raises(httpx.HTTPError):  # a client that does not trust the CA
            httpx.post(f"{url}/v1/completions", json=BODY, timeout=10)
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, timeout=10)
    finally:
        stop(srv)


def test_a_unix_domain_socket(tmp_path, tiny_dir):
    """Served on the socket, and only there. A socket file that a killed server left (no process listens) is taken
    over: Granian refused it (Address already in use) and a restart never came up. Another server on the path, or a
    file that is not a socket, stops the start with status 2 before any engine starts."""
    import socket
    import subprocess

    path = tmp_path / "rill.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, and nothing listens on it: a server killed with SIGKILL
    assert path.exists()
    srv = serve([], tmp_path, tiny_dir, "--uds", str(path), port=free_port())
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path))) as http:
            wait_ready(srv, http, "http://rill")
            sdk = openai.OpenAI(base_url="http://rill/v1", api_key="unused", http_client=http, max_retries=0,
                                _strict_response_validation=True)
            assert sdk.completions.create(**BODY).usage.completion_tokens == 3
        assert Listener(uds=str(path)).answers()
        second = subprocess.run([str(RILL), "serve", "--model", str(tiny_dir), "--load-format", "dummy", "--uds",
                                 str(path)], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"--uds {path}: another server listens on" in second.stderr, second.stderr
        assert "starting engine" not in second.stderr and Listener(uds=str(path)).answers()  # the first serves on
        (tmp_path / "file").write_text("x")
        assert free_uds(str(tmp_path / "file")) == f"{tmp_path / 'file'} exists and is not a socket"
        assert (tmp_path / "file").read_text() == "x"
        with pytest.raises(httpx.ConnectError):  # nothing on the TCP port
            httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=5)
    finally:
        stop(srv)
    assert not path.exists()


@pytest.mark.skipif(not shutil.which("systemd-socket-activate"), reason="systemd-socket-activate is not installed")
def test_socket_activation_queues_requests_made_before_the_server_is_up(tmp_path, tiny_dir):
    port = free_port()
    flag_port = free_port()
    srv = serve(["systemd-socket-activate", "-l", f"127.0.0.1:{port}"], tmp_path, tiny_dir, port=flag_port)
    early: dict = {}

    def ask_now():  # while the model loads: systemd's socket already listens
        try:
            early["status"] = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, timeout=300).status_code
        except httpx.HTTPError as exc:
            early["error"] = repr(exc)

    time.sleep(0.5)  # systemd-socket-activate has bound its socket
    asker = threading.Thread(target=ask_now)
    asker.start()
    try:
        asker.join(300)
        assert early == {"status": 200}, (early, srv.log())
        with pytest.raises(httpx.ConnectError):  # systemd's socket, not one of its own on --port
            httpx.get(f"http://127.0.0.1:{flag_port}/health", timeout=5)
    finally:
        stop(srv)


def test_systemd_socket_takes_its_variables_only_when_they_are_for_this_process(monkeypatch):
    env = {"LISTEN_FDS": "1", "LISTEN_PID": "1", "LISTEN_FDNAMES": "rill", "A": "1"}
    assert systemd_socket(env) == -1 and env == {"A": "1"}  # meant for another process, and taken out
    assert systemd_socket({}) == -1


@pytest.mark.parametrize("flags,message", [
    (["--ssl-keyfile", "k.pem"], "--ssl-certfile and --ssl-keyfile go together"),
    (["--ssl-certfile", "/no/cert.pem", "--ssl-keyfile", "/no/key.pem"], "--ssl-certfile /no/cert.pem: not a readable"),
    (["--ssl-ca-certs", "CA"], "--ssl-ca-certs needs --ssl-certfile"),
    (["--ssl-cert-reqs", "2"], "--ssl-cert-reqs needs --ssl-ca-certs"),
    (["--uds", "/no/such/folder/rill.sock"], "--uds /no/such/folder/rill.sock: its folder does not exist"),
])
def test_bad_listening_flags_stop_the_start_naming_the_flag(flags, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "CA").write_text("x")
    with pytest.raises(SystemExit) as exc:
        rill_main(["serve", *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_port_another_process_holds_stops_the_start_at_once(tmp_path, tiny_dir):
    """Granian's own socket took SO_REUSEPORT: a second `rill serve` on a port already served started and took part
    of its connections. The launcher binds the port first (rill/listening.py reserve_port): one held by another
    process (here a plain listening socket; another `rill serve` holds its own the same way) is status 2 with one
    line naming it, before any engine starts; once the port is free the same command serves on it."""
    import socket
    import subprocess

    port = free_port()
    holder = socket.create_server(("127.0.0.1", port))
    try:
        argv = [str(RILL), "serve", "--model", str(tiny_dir), "--load-format", "dummy", "--port", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"--port {port}: Address already in use" in done.stderr and "starting engine" not in done.stderr
    finally:
        holder.close()
    srv = serve([], tmp_path, tiny_dir, port=port)
    with httpx.Client() as http:
        wait_ready(srv, http, f"http://127.0.0.1:{port}")
        again = subprocess.run(argv, capture_output=True, text=True, timeout=120)  # held by a Rill now
        assert again.returncode == 2 and "Address already in use" in again.stderr, again.stderr[-2000:]
        assert http.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, timeout=60).status_code == 200
    stop(srv)
