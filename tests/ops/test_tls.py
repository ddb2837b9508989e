"""TLS: a server started with a self-signed CA and certificate made here, reached with rediss:// by the
library and by the CLI; a client that does not trust the CA is refused."""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rollout_queue import RolloutQueue, SourceGroup
from rollout_queue.devtools.local_server import LocalServer, ServerStartError, available_servers, pick_free_port
from tests.ops.conftest import Cli, samples



def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a self-signed CA and a certificate for 127.0.0.1 signed by it,
    made with `cryptography`, else with the openssl command line."""
    try:
        return _with_cryptography(directory)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is installed: no certificates")
        return _with_openssl(directory)


def _with_cryptography(directory: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rollout-queue test CA")])
    valid = {"not_valid_before": now - datetime.timedelta(minutes=5), "not_valid_after": now + datetime.timedelta(days=1)}
    ca = (x509.CertificateBuilder(issuer_name=ca_name, subject_name=ca_name, public_key=ca_key.public_key(),
                                  serial_number=x509.random_serial_number(), **valid)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    cert = (x509.CertificateBuilder(issuer_name=ca_name, subject_name=leaf, public_key=key.public_key(),
                                    serial_number=x509.random_serial_number(), **valid)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def _with_openssl(directory: Path) -> tuple[Path, Path, Path]:
    ca, ca_key, cert, key, csr = (directory / n for n in ("ca.pem", "ca.key", "server.pem", "server.key", "s.csr"))
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1",
         "-subj", "/CN=rollout-queue test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
         "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


@pytest.fixture(params=sorted(available_servers()))
def tls_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(rediss:// URL, CA file). The plain port stays open on loopback for LocalServer's readiness probe."""
    ca, cert, key = make_certificates(tmp_path)
    port = pick_free_port()
    server = LocalServer(request.param, extra_config=[
        ("tls-port", str(port)), ("tls-cert-file", str(cert)), ("tls-key-file", str(key)),
        ("tls-ca-cert-file", str(ca)), ("tls-auth-clients", "no")])
    try:
        server.start()
    except ServerStartError as exc:
        if "tls" in exc.log_tail.lower() or "ssl" in exc.log_tail.lower():
            pytest.skip(f"{request.param}-server at {server.binary} was built without TLS support "
                        f"(it refuses tls-port): {exc.log_tail.splitlines()[-1] if exc.log_tail else exc}")
        raise
    try:
        yield f"rediss://127.0.0.1:{port}/0", ca
    finally:
        server.cleanup(graceful=False)


def test_rediss_end_to_end(tls_server: tuple[str, Path], cli: Cli) -> None:
    url, ca = tls_server
    q = RolloutQueue.from_url(url, "tls-queue", ssl_ca_certs=str(ca))
    assert q.client.connection_pool.connection_class.__name__ == "SSLConnection"
    (entry_id,) = q.submit([SourceGroup("s-0", "over TLS", 2)])
    w = q.worker("gpu-0")
    (res,) = w.reserve(1)
    w.complete(res.receipt, samples(2, 0))
    lease = q.lease(1)
    assert lease is not None and lease.groups[0].entry_id == entry_id
    lease.commit()
    code, out, err = cli(url, "tls-queue", "--tls-ca-cert", str(ca), "stats", "--json")
    assert code == 0 and json.loads(out)["committed"] == 1, err
    # A client that does not trust the test CA is refused: the certificate really is checked.
    untrusting = redis.Redis.from_url(url, socket_connect_timeout=2)
    with pytest.raises(redis.exceptions.ConnectionError, match="(?i)certificate"):
        untrusting.ping()
    code, _, err = cli(url, "tls-queue", "stats")
    assert code == 3 and "certificate" in err.lower()
