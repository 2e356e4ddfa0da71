"""Mutual TLS between members: who a certificate names, and the contexts of the peer transport.

Identity. A certificate names its holder with one URI in its subjectAltName:

    epochlog://<cluster>/node/<id>        a member (node id <id> of cluster <cluster>)
    epochlog://<cluster>/client/<name>    a client (for the client faces; refused on the peer port)

(<cluster> and <name> percent-encoded). The cluster CA (`epochlog certs`, epochlog/certs.py) signs
them; whoever holds a member certificate and its key IS that node to the others. The common name is
for people and never read.

Handshake (both ways; the node with the lower id dials, see transport): TLS 1.3 only, a certificate
required of both sides and verified against the cluster CA (`ca_file`), no hostname check (members
are named by node id, not by address), then the transport reads the node id from the verified peer
certificate (`peer_identity`) and refuses a connection whose certificate names another cluster,
something other than a node, or (when dialing) another node than the one dialed; the peer's hello
must then claim that same node id.

`load_peer_tls` checks this node's own files at start: present, loadable, the certificate issued by
the CA, not expired, and naming this cluster and node id. Each problem is a ConfigError naming the
key and file (one line; `epochlog serve` exits 3).
"""

from __future__ import annotations

import datetime
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from eventlog.errors import ConfigError
from eventlog.raft.runtime.config import PeerTlsConfig

logger = logging.getLogger(__name__)

SCHEME = "epochlog://"
EXPIRY_WARNING = datetime.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a certificate's URI names: `kind` "node" (name = the node id) or "client"."""

    cluster: str
    kind: str
    name: str

    @property
    def node_id(self) -> int | None:
        """The node id when this names a member, else None."""
        if self.kind != "node" or not self.name.isdigit() or self.name.startswith("0"):
            return None
        return int(self.name)

    @property
    def uri(self) -> str:
        return f"{SCHEME}{quote(self.cluster, safe='')}/{self.kind}/{quote(self.name, safe='')}"


def node_identity(cluster: str, node_id: int) -> Identity:
    return Identity(cluster, "node", str(node_id))


def client_identity(cluster: str, name: str) -> Identity:
    return Identity(cluster, "client", name)


def parse_identity(uri: str) -> Identity | None:
    """The identity a URI names, or None when it is not one of ours."""
    if not uri.startswith(SCHEME):
        return None
    parts = uri[len(SCHEME):].split("/")
    if len(parts) != 3 or parts[1] not in ("node", "client") or not parts[0] or not parts[2]:
        return None
    return Identity(unquote(parts[0]), parts[1], unquote(parts[2]))


def identities_in(uris: list[str]) -> list[Identity]:
    return [i for i in map(parse_identity, uris) if i is not None]


def peer_identity(peercert: dict[str, Any] | None) -> Identity | str:
    """The identity in a verified peer certificate (`transport.get_extra_info("peercert")`), or why
    there is none usable."""
    if not peercert:
        return "no verified certificate"
    uris = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "URI"]
    found = identities_in(uris)
    if len(found) != 1:
        return f"the certificate names {len(found)} epochlog identities (URIs {uris}), not one"
    return found[0]


@dataclass(frozen=True, slots=True)
class PeerTls:
    """The two TLS contexts of a member: `server` for accepted connections, `client` for dialed ones."""

    server: ssl.SSLContext
    client: ssl.SSLContext
    not_after: datetime.datetime   # when this node's certificate expires


def _context(purpose: int, ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    if purpose == ssl.PROTOCOL_TLS_CLIENT:
        ctx.check_hostname = False   # members are named by node id (checked after the handshake), not by host
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def load_peer_tls(config: PeerTlsConfig, data_dir: str | Path, cluster: str, node_id: int,
                  section: str = "cluster.tls") -> PeerTls | None:
    """The contexts for node `node_id` of `cluster` (None when `insecure`); ConfigError when a file is
    missing or wrong (see the module docstring)."""
    if config.insecure:
        return None
    from cryptography import x509  # only where TLS is on
    from cryptography.exceptions import InvalidSignature

    paths = {name: config.path(name, data_dir) for name in ("ca_file", "cert_file", "key_file")}
    for name, path in paths.items():
        if not path.is_file():
            raise ConfigError(f"{section}.{name}", str(path), "file not found (create the cluster's certificates "
                              "with `epochlog certs`, or set insecure = true for plaintext peers)")
    certs = {}
    for name in ("ca_file", "cert_file"):
        try:
            certs[name] = x509.load_pem_x509_certificate(paths[name].read_bytes())
        except (ValueError, OSError) as exc:
            raise ConfigError(f"{section}.{name}", str(paths[name]), f"not a PEM certificate: {exc}") from None
    ca, mine = certs["ca_file"], certs["cert_file"]
    try:
        mine.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise ConfigError(f"{section}.cert_file", str(paths["cert_file"]),
                          f"is not issued by the CA of {paths['ca_file']} ({exc or type(exc).__name__})") from None
    try:
        uris = mine.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    expected = node_identity(cluster, node_id)
    if identities_in(uris) != [expected]:
        raise ConfigError(f"{section}.cert_file", str(paths["cert_file"]),
                          f"names {uris or 'no identity'}, not this node ({expected.uri})")
    now = datetime.datetime.now(datetime.UTC)
    not_after = mine.not_valid_after_utc
    if not mine.not_valid_before_utc <= now < not_after:
        raise ConfigError(f"{section}.cert_file", str(paths["cert_file"]),
                          f"is valid from {mine.not_valid_before_utc:%Y-%m-%d %H:%M} to {not_after:%Y-%m-%d %H:%M} "
                          f"UTC, not now (issue a new one: epochlog certs member)")
    if not_after - now < EXPIRY_WARNING:
        logger.warning("the peer certificate %s expires on %s UTC: issue a new one (epochlog certs member)",
                       paths["cert_file"], f"{not_after:%Y-%m-%d %H:%M}")
    try:
        server = _context(ssl.PROTOCOL_TLS_SERVER, paths["ca_file"], paths["cert_file"], paths["key_file"])
        client = _context(ssl.PROTOCOL_TLS_CLIENT, paths["ca_file"], paths["cert_file"], paths["key_file"])
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{section}.key_file", str(paths["key_file"]),
                          f"cannot be used with {paths['cert_file']}: {exc}") from None
    return PeerTls(server, client, not_after)
