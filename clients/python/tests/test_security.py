"""TLS and API keys against real 3-node clusters: a client with the CA (and, under `--tls-client-auth`, a
certificate) holds, watches and campaigns; clients without them are refused. Under `--auth` each key is a
namespace of its own, and a missing or unknown key raises `Unauthenticated`. The CA and certificates are
minted here (with `cryptography`, as the Rust tests use rcgen)."""

import contextlib
import datetime
import ipaddress
import ssl
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest
from cluster import Cluster
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import holdfast

Pem = bytes


class Ca:
    """A CA that signs certificates for servers and clients."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            self._builder(self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem: Pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
        )

    def issue(self, common_name: str) -> Tuple[Pem, Pem]:
        """A certificate for localhost and 127.0.0.1, good for servers and clients; its PEM and its key's."""
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), key.public_key())
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


class TlsSetup:
    """A CA, a node certificate, a client certificate, their files, and the harness's HTTPS context."""

    def __init__(self, directory: Path) -> None:
        self.ca = Ca("holdfast python test CA")
        self.node_cert, self.node_key = self.ca.issue("localhost")
        self.client_cert, self.client_key = self.ca.issue("worker-1")
        self.files = {}
        for name, pem in [
            ("ca.pem", self.ca.pem),
            ("node.pem", self.node_cert),
            ("node.key", self.node_key),
            ("client.pem", self.client_cert),
            ("client.key", self.client_key),
        ]:
            (directory / name).write_bytes(pem)
            self.files[name] = str(directory / name)
        self.context = ssl.create_default_context(cadata=self.ca.pem.decode())
        self.context.load_cert_chain(self.files["client.pem"], self.files["client.key"])

    def server_args(self, client_auth: bool) -> List[str]:
        args = ["--tls-cert", self.files["node.pem"], "--tls-key", self.files["node.key"]]
        return args + ["--tls-ca", self.files["ca.pem"]] + (["--tls-client-auth"] if client_auth else [])


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsSetup:
    return TlsSetup(tmp_path_factory.mktemp("tls"))


@contextlib.contextmanager
def started(extra_args: List[str], context: Optional[ssl.SSLContext] = None) -> Iterator[Cluster]:
    """A 3-node cluster with `extra_args`, stopped at the end of the `with`."""
    cluster = Cluster(3, extra_args, context)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def mtls_cluster(tls: TlsSetup) -> Iterator[Cluster]:
    """A cluster whose client port speaks TLS and wants a client certificate the CA signed."""
    with started(tls.server_args(client_auth=True), tls.context) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[Cluster]:
    """A cluster under `--auth` where anyone may sign up for a key."""
    with started(["--auth", "--open-signup"]) as cluster:
        yield cluster


def test_a_client_with_a_certificate_holds_watches_and_campaigns_over_mutual_tls(
    mtls_cluster: Cluster, tls: TlsSetup
) -> None:
    client = holdfast.Client(
        mtls_cluster.endpoints, ca_cert=tls.ca.pem, client_cert=tls.client_cert, client_key=tls.client_key
    )
    assert all(e.startswith("127.0.0.1:") for e in client.endpoints)
    with client.watch("over-tls") as watch:
        assert next(watch).holder is None
        with client.lock("over-tls", lease=2.0) as held:
            state = next(watch)
            assert state.holder is not None and state.holder.fence == held.fence
            assert mtls_cluster.read_lock("over-tls")["holder"]["fence"] == held.fence  # type: ignore[index]
    with client.acquire("over-tls-one-shot", ttl=30) as hold:
        assert client.get("over-tls-one-shot").holder.fence == hold.fence  # type: ignore[union-attr]
    with client.campaign("over-tls-election", "me", lease=2.0) as leadership:
        assert client.leader("over-tls-election") == holdfast.Leader(b"me", leadership.fence, client.owner)


def test_clients_without_a_certificate_the_ca_signed_are_refused(mtls_cluster: Cluster, tls: TlsSetup) -> None:
    rogue_cert, rogue_key = Ca("someone else's CA").issue("worker-1")
    refused = [
        holdfast.Client(mtls_cluster.endpoints),  # cleartext
        holdfast.Client(mtls_cluster.endpoints, ca_cert=tls.ca.pem),  # no certificate
        holdfast.Client(mtls_cluster.endpoints, ca_cert=tls.ca.pem, client_cert=rogue_cert, client_key=rogue_key),
    ]
    for client in refused:
        with pytest.raises(holdfast.Unavailable):
            client.get("over-tls")
        client.close()


def test_a_client_with_the_ca_holds_a_lock_over_tls(tls: TlsSetup) -> None:
    with started(tls.server_args(client_auth=False), tls.context) as cluster:
        client = holdfast.Client([f"https://{e}" for e in cluster.endpoints], ca_cert=tls.ca.pem)
        with client.lock("over-tls", lease=2.0) as held:
            assert cluster.read_lock("over-tls")["holder"]["fence"] == held.fence  # type: ignore[index]
        # A CA that did not sign the nodes' certificates is not trusted.
        with pytest.raises(holdfast.Unavailable):
            holdfast.Client(cluster.endpoints, ca_cert=Ca("another CA").pem).get("over-tls")


def signup(cluster: Cluster) -> str:
    key = cluster.http_post(1, "/v1/signup")["api_key"]
    assert isinstance(key, str) and key
    return key


def test_each_api_key_sees_only_its_own_locks(auth_cluster: Cluster) -> None:
    first = holdfast.Client(auth_cluster.endpoints, api_key=signup(auth_cluster), owner="first")
    second = holdfast.Client(auth_cluster.endpoints, api_key=signup(auth_cluster), owner="second")
    with first.lock("keyed", lease=2.0) as held:
        info = first.get("keyed")
        assert info is not None and info.holder is not None and info.holder.fence == held.fence
        # Another key is another namespace: the name is free there, and its watches and lists show nothing
        # of the first key's.
        assert second.get("keyed") is None and second.list().locks == []
        other = second.acquire("keyed", ttl=30)
        with second.watch("", prefix=True) as everything:
            state = next(everything)
            assert (state.name, state.initial) == ("keyed", True)
            assert state.holder is not None and state.holder.owner == "second"
            assert first.get("keyed").holder.fence == held.fence  # type: ignore[union-attr]
            first_hold = first.acquire("first-only", ttl=30)
            first_hold.release()
            other.release()
            freed = next(everything)
            assert (freed.name, freed.holder) == ("keyed", None), "the first key's changes are not seen"
        with second.campaign("keyed-election", "b", lease=2.0):
            assert first.leader("keyed-election") is None


@pytest.mark.parametrize("key", [None, "hf_not-a-key"], ids=["no-key", "unknown-key"])
def test_a_missing_or_unknown_key_raises_unauthenticated(auth_cluster: Cluster, key: Optional[str]) -> None:
    client = holdfast.Client(auth_cluster.endpoints, api_key=key)
    calls = {
        "get": lambda: client.get("keyed"),
        "acquire": lambda: client.acquire("keyed", ttl=30),
        "lock": lambda: client.lock("keyed", lease=2.0).acquire(),
        "watch": lambda: next(client.watch("keyed")),
        "list": lambda: client.list(),
        "campaign": lambda: client.campaign("keyed", "v", lease=2.0),
    }
    for what, call in calls.items():
        with pytest.raises(holdfast.Unauthenticated):
            call()
            pytest.fail(f"{what} without a valid key was not refused")
