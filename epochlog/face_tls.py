"""TLS of the client faces (native, gRPC, Kafka, admin): `[clients.tls]`, the server's context, and the
principal a verified client certificate names.

The faces present the node's member certificate (`epochlog certs member`, the files the peer port
uses), so a cluster made by `epochlog up` needs nothing more. A client verifies it against the
cluster CA; members are named by node id, not by host (their certificates carry no DNS name), so the
SDK checks the certificate names a node of the CA instead of a host name (epochlog/client/tls.py).
A client MAY present a certificate of the same CA (`epochlog certs client`): its name is then the
connection's principal (statemachines/access.py), with no password or token needed. TLS 1.2 is the
floor (Kafka clients in the field still speak it); the peer port stays TLS 1.3 only.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from eventlog.configuration import doc
from eventlog.errors import ConfigError
from eventlog.raft.runtime.tls import SCHEME

if TYPE_CHECKING:
    from epochlog.client.tls import ClientTls

logger = logging.getLogger(__name__)

MISSING_FILE = ("file not found: make the certificates (`epochlog certs init`, then `epochlog certs member`; "
                "`epochlog up` makes them), or set [clients.tls] enabled = false for plaintext client faces")


@dataclass(frozen=True, slots=True)
class ClientTlsConfig:
    """TLS of every client face (`[clients.tls]`); paths relative to the node's data directory."""

    enabled: bool = field(default=True, metadata=doc(
        "Serve the native, gRPC, Kafka and admin faces over TLS (the Kafka face as SSL / SASL_SSL). On by "
        "default: plaintext faces only by `enabled = false`, said in the config."))
    cert_file: str = field(default="tls/node.crt", metadata=doc(
        "The certificate the faces present (default: the member certificate of [cluster.tls])."))
    key_file: str = field(default="tls/node.key", metadata=doc("Its private key."))
    ca_file: str = field(default="tls/ca.crt", metadata=doc(
        "The CA that client certificates must chain to (default: the cluster CA)."))
    require_client_cert: bool = field(default=False, metadata=doc(
        "Refuse a connection without a client certificate (else a token or SASL may authenticate it)."))


def server_context(config: ClientTlsConfig, data_dir: Path) -> ssl.SSLContext | None:
    """The faces' server context, or None when TLS is off. ConfigError (one line) for a file that is
    missing or does not load."""
    if not config.enabled:
        return None
    paths = {key: Path(getattr(config, key)) if Path(getattr(config, key)).is_absolute()
             else data_dir / getattr(config, key) for key in ("cert_file", "key_file", "ca_file")}
    for key, path in paths.items():
        if not path.is_file():
            raise ConfigError(f"clients.tls.{key}", str(path), MISSING_FILE)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(paths["cert_file"], paths["key_file"])
        context.load_verify_locations(cafile=str(paths["ca_file"]))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("clients.tls", str(paths["cert_file"]), f"cannot load the certificate, key or CA: "
                                                                  f"{exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED if config.require_client_cert else ssl.CERT_OPTIONAL
    return context


def certificate_principal(peercert: dict[str, Any] | None) -> str | None:
    """The principal a verified peer certificate names (`SSLObject.getpeercert()`): the client name of
    its `epochlog://<cluster>/client/<name>` URI, else its subject's common name; None without one. A
    member certificate names no client principal."""
    if not peercert:
        return None
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "URI" and value.startswith(SCHEME):
            parts = value[len(SCHEME):].split("/")
            if len(parts) == 3 and parts[1] == "client":
                return unquote(parts[2])
            if len(parts) == 3 and parts[1] == "node":
                return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def certificate_node(peercert: dict[str, Any] | None, cluster: str) -> int | None:
    """The node id a verified member certificate of `cluster` names (`epochlog://<cluster>/node/<id>`):
    another node's own calls (membership forwards, the Kafka face's writes through a leader). None for
    any other certificate."""
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith(SCHEME):
            parts = value[len(SCHEME):].split("/")
            if len(parts) == 3 and unquote(parts[0]) == cluster and parts[1] == "node" and parts[2].isdigit():
                return int(parts[2])
    return None


def internal_client_tls(config: ClientTlsConfig, data_dir: Path) -> ClientTls:
    """What a node's own clients of the other nodes present: its certificate, trusting the faces' CA."""
    from epochlog.client.tls import ClientTls   # the SDK's side; only where the faces speak TLS

    def path(name: str) -> str:
        value = Path(name)
        return str(value if value.is_absolute() else data_dir / value)

    return ClientTls(path(config.ca_file), path(config.cert_file), path(config.key_file))


def grpc_credentials(config: ClientTlsConfig | None, data_dir: Path) -> Any:
    """The gRPC face's server credentials from the same files, or None when TLS is off. gRPC's server
    either requires a client certificate or asks for none: without `require_client_cert` its clients
    authenticate by a bearer token."""
    if config is None or not config.enabled:
        return None
    server_context(config, data_dir)   # the same checks and one-line errors as the other faces
    import grpc   # only where gRPC is served

    def read(name: str) -> bytes:
        path = Path(name)
        return (path if path.is_absolute() else data_dir / path).read_bytes()

    return grpc.ssl_server_credentials([(read(config.key_file), read(config.cert_file))],
                                       root_certificates=read(config.ca_file),
                                       require_client_auth=config.require_client_cert)


def peercert_of_pem(pem: bytes | str) -> dict[str, Any]:
    """A PEM certificate (gRPC's `x509_pem_cert`) in the form of `SSLObject.getpeercert()` as far as
    certificate_principal and certificate_node read it: its URI names and its common name."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)
    try:
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return {"subjectAltName": tuple(("URI", u) for u in uris),
            "subject": tuple(((("commonName", str(n.value)),) for n in names))}
