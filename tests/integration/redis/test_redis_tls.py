"""``[redis]`` TLS files against a real redis-server speaking TLS (mutual: it asks for
the client's certificate): files that work connect, and a file that cannot be used is a
config error naming its field (exit 2), where it was retried for ``retry_max_s`` as a
server out of reach and exited 1."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, server_missing
from tests.integration.redis.conftest import REPO, write_config
from tests.servers.process import require, wait_answering
from tests.servers.redis import REDIS_ERRORS, RedisProcess

pytestmark = pytest.mark.redis


def openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError):
        server_missing("openssl")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One self-signed certificate for 127.0.0.1 and its key: the CA both sides trust,
    the server's certificate and the client's; and the key again, encrypted."""
    out = tmp_path_factory.mktemp("certs")
    cert, key, locked = out / "cert.pem", out / "key.pem", out / "locked.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert))
    openssl("pkey", "-in", str(key), "-out", str(locked), "-aes256", "-passout", "pass:pw")
    garbage = out / "garbage.pem"
    garbage.write_text("not a certificate\n")
    return {"cert": cert, "key": key, "locked": locked, "garbage": garbage, "dir": out,
            "missing": out / "missing.pem"}


@pytest.fixture(scope="module")
def tls_port(certs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[int]:
    """A redis-server answering TLS on the port returned (plain text on another, for
    the readiness check only), requiring a client certificate."""
    require("redis-server", "redis-server")
    port = free_port()
    server = RedisProcess(
        free_port(), tmp_path_factory.mktemp("tls-redis"), "--save", "",
        "--tls-port", str(port), "--tls-cert-file", str(certs["cert"]),
        "--tls-key-file", str(certs["key"]), "--tls-ca-cert-file", str(certs["cert"]),
        "--tls-auth-clients", "yes")
    server.start()
    try:
        wait_answering(server.answers, 10, "redis-server to accept connections",
                       processes=[server], errors=REDIS_ERRORS)
        yield port
    finally:
        server.stop()


def status(tmp_path: Path, port: int, **files: Path) -> subprocess.CompletedProcess[str]:
    cfg = write_config(tmp_path / "c.toml", f"rediss://127.0.0.1:{port}/0",
                       redis={"prefix": "t", "retry_max_s": 1.0,
                              **{k: str(v) for k, v in files.items()}})
    return subprocess.run([sys.executable, "-m", "conveyor.cli", "status", "--config",
                           str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_tls_files_given_connect(
    tmp_path: Path, tls_port: int, certs: dict[str, Path]
) -> None:
    done = status(tmp_path, tls_port, tls_ca_file=certs["cert"],
                  tls_cert_file=certs["cert"], tls_key_file=certs["key"])
    assert done.returncode == 0, done.stderr
    refused = status(tmp_path, tls_port, tls_ca_file=certs["cert"])  # no client cert
    assert refused.returncode == 1, refused.stderr  # the server's refusal: not the config's


@pytest.mark.parametrize(("field", "file", "says"), [
    ("tls_ca_file", "missing", "cannot read '{path}' (No such file or directory)"),
    ("tls_ca_file", "dir", "cannot read '{path}' (Is a directory)"),
    ("tls_ca_file", "garbage", "'{path}' holds no certificate in PEM form"),
    ("tls_cert_file", "missing", "cannot read '{path}' (No such file or directory)"),
    ("tls_cert_file", "garbage", "cannot load the client certificate '{path}'"),
    ("tls_key_file", "missing", "cannot read '{path}' (No such file or directory)"),
    ("tls_key_file", "locked", "the client key in '{path}' is encrypted, and Conveyor "
                               "passes no password for it"),
])
def test_a_tls_file_that_cannot_be_used_is_a_config_error_naming_its_field(
    tmp_path: Path, tls_port: int, certs: dict[str, Path], field: str, file: str, says: str
) -> None:
    files = {"tls_ca_file": certs["cert"], "tls_cert_file": certs["cert"],
             "tls_key_file": certs["key"], field: certs[file]}
    done = status(tmp_path, tls_port, **files)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"$.redis.{field}: {says.format(path=certs[file])}" in done.stderr
