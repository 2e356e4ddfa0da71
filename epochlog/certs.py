"""The cluster's certificate authority and the certificates it issues (`epochlog certs`, docs/security.md).

Files (PEM; keys are written 0600, in directories created 0700):

    <ca dir>/ca.crt, ca.key           the cluster CA (`init`); in production keep ca.key off the nodes
    <out>/ca.crt                      a copy of the CA certificate, next to every certificate issued
    <out>/node.crt, node.key          a member (`member`): SAN URI epochlog://<cluster>/node/<id>, and
                                      SAN DNS node-<id>: the name a stock TLS client (gRPC) checks
    <out>/<name>.crt, <name>.key      a client (`client`): SAN URI epochlog://<cluster>/client/<name>

A member's `<out>` defaults to `<node data dir>/tls`, which is where `[cluster.tls]` looks by
default, so a node needs no TLS configuration. What a certificate's URI means, and how the peer
transport checks it, is eventlog.raft.runtime.tls. The CA names its cluster in its own SAN URI
(epochlog://<cluster>), so issuing needs only the CA directory.

Keys are ECDSA P-256 (fast to make and to handshake with); the CA signs with SHA-256. Member
certificates carry both serverAuth and clientAuth (a member accepts and dials), client
certificates clientAuth only; every certificate has subject and authority key identifiers.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from eventlog import kafka_codes as kc
from eventlog.errors import EpochlogError
from eventlog.fileutil import fsync_dir
from eventlog.raft.runtime.tls import SCHEME, Identity, client_identity, identities_in, node_identity

CA_DAYS = 3650
LEAF_DAYS = 825
RENEW_BEFORE = datetime.timedelta(days=30)   # `up` re-issues a member certificate this close to its end
_BACKDATE = datetime.timedelta(minutes=5)    # tolerate clocks a little behind the CA's


class CertsError(EpochlogError):
    """The CA or a certificate cannot be made or used as asked (the message says why)."""

    code = "certs"
    retriable = False
    grpc_status = "INTERNAL"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` atomically, created with `mode` (a key is never readable by others, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)   # the umask must not widen or narrow it
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def uris_of(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def load_certificate(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise CertsError(f"{path}: no such file") from None
    except ValueError as exc:
        raise CertsError(f"{path}: not a PEM certificate ({exc})") from None


@dataclass(frozen=True)
class IssuedFiles:
    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class ClusterCA:
    """A cluster's CA: its certificate and key, loaded from (or created in) `directory`."""

    directory: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cluster(self) -> str:
        for uri in uris_of(self.cert):
            if uri.startswith(SCHEME) and "/" not in uri[len(SCHEME):]:
                return unquote(uri[len(SCHEME):])
        raise CertsError(f"{self.directory / 'ca.crt'} is not an epochlog cluster CA (no {SCHEME}<cluster> URI)")

    @classmethod
    def create(cls, directory: str | Path, cluster: str, *, days: int = CA_DAYS) -> ClusterCA:
        """A new CA for `cluster` in `directory` (refused when one is there: replacing it would cut every
        member issued by it off from the others)."""
        directory = Path(directory)
        if (directory / "ca.crt").exists() or (directory / "ca.key").exists():
            raise CertsError(f"{directory} already holds a CA (ca.crt / ca.key); it is kept")
        if not cluster:
            raise CertsError("the cluster name is empty")
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "epochlog"),
                          x509.NameAttribute(NameOID.COMMON_NAME, f"epochlog cluster CA {cluster}"[:64])])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - _BACKDATE).not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=True, crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .add_extension(x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(f"{SCHEME}{quote(cluster, safe='')}")]), critical=False)
                .sign(key, hashes.SHA256()))
        _write(directory / "ca.key", _key_pem(key), 0o600)
        _write(directory / "ca.crt", _cert_pem(cert), 0o644)
        return cls(directory, cert, key)

    @classmethod
    def load(cls, directory: str | Path) -> ClusterCA:
        directory = Path(directory)
        cert = load_certificate(directory / "ca.crt")
        try:
            key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        except FileNotFoundError:
            raise CertsError(f"{directory / 'ca.key'}: no such file (issuing needs the CA's key)") from None
        except (ValueError, TypeError) as exc:
            raise CertsError(f"{directory / 'ca.key'}: not an unencrypted PEM key ({exc})") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise CertsError(f"{directory / 'ca.key'} is not the key of {directory / 'ca.crt'}")
        ca = cls(directory, cert, key)
        _ = ca.cluster   # raises when this is not an epochlog CA
        return ca

    @classmethod
    def load_or_create(cls, directory: str | Path, cluster: str) -> ClusterCA:
        """The CA in `directory`, made first when there is none; CertsError when it is another cluster's."""
        directory = Path(directory)
        ca = cls.load(directory) if (directory / "ca.crt").exists() else cls.create(directory, cluster)
        if ca.cluster != cluster:
            raise CertsError(f"the CA in {directory} is for cluster {ca.cluster!r}, not {cluster!r}")
        return ca

    # --- issuing -------------------------------------------------------------------------------

    def _issue(self, identity: Identity, common_name: str, usages: list[x509.ObjectIdentifier], days: int,
               dns_names: tuple[str, ...] = ()) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        not_after = min(now + datetime.timedelta(days=days), self.cert.not_valid_after_utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "epochlog"),
                                         x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - _BACKDATE).not_valid_after(not_after)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=False, crl_sign=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity.uri),
                                                            *map(x509.DNSName, dns_names)]), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        return cert, key

    def _save(self, files: IssuedFiles, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> IssuedFiles:
        _write(files.key, _key_pem(key), 0o600)
        _write(files.cert, _cert_pem(cert), 0o644)
        _write(files.ca, _cert_pem(self.cert), 0o644)
        return files

    def issue_member(self, node_id: int, out: str | Path, *, days: int = LEAF_DAYS) -> IssuedFiles:
        """Node `node_id`'s certificate and key (and the CA's certificate) in `out` as node.crt, node.key,
        ca.crt: the layout of [cluster.tls] when `out` is `<node data dir>/tls`."""
        out = Path(out)
        return self.issue_member_files(node_id, IssuedFiles(out / "node.crt", out / "node.key", out / "ca.crt"),
                                       days=days)

    def issue_member_files(self, node_id: int, files: IssuedFiles, *, days: int = LEAF_DAYS) -> IssuedFiles:
        """`issue_member` to the paths of `files` (a [cluster.tls] with other file names)."""
        if node_id < 1:
            raise CertsError(f"node id {node_id}: must be a positive integer")
        # The DNS name node-<id>: clients that check a server's name (RFC 6125: in the SAN, never the
        # common name) check it when told which node they dial (gRPC: ssl_target_name_override).
        cert, key = self._issue(node_identity(self.cluster, node_id), f"node-{node_id}",
                                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], days,
                                dns_names=(f"node-{node_id}",))
        return self._save(files, cert, key)

    def issue_client(self, name: str, out: str | Path, *, days: int = LEAF_DAYS) -> IssuedFiles:
        """A client certificate (`<name>.crt`, `<name>.key`, ca.crt in `out`) for the client faces; the
        peer port refuses it."""
        if not name or "/" in name or name.startswith("."):
            raise CertsError(f"client name {name!r}: a plain file name is needed")
        cert, key = self._issue(client_identity(self.cluster, name), f"client-{name}",
                                [ExtendedKeyUsageOID.CLIENT_AUTH], days)
        out = Path(out)
        return self._save(IssuedFiles(out / f"{name}.crt", out / f"{name}.key", out / "ca.crt"), cert, key)

    def issued(self, cert: x509.Certificate) -> bool:
        """Whether this CA signed `cert`."""
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True

    def member_is_current(self, node_id: int, files: IssuedFiles) -> bool:
        """Whether the files hold a certificate this CA issued to `node_id`, with its key, valid for at
        least RENEW_BEFORE more (what `up` checks before re-issuing)."""
        return self._is_current(node_identity(self.cluster, node_id), files)

    def client_is_current(self, name: str, files: IssuedFiles) -> bool:
        """member_is_current for the client certificate of `name` (`up`'s admin credential)."""
        return self._is_current(client_identity(self.cluster, name), files)

    def _is_current(self, identity: Identity, files: IssuedFiles) -> bool:
        try:
            cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
            key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
            ca_copy = x509.load_pem_x509_certificate(files.ca.read_bytes())
        except (OSError, ValueError, TypeError):
            return False
        return (ca_copy == self.cert and self.issued(cert) and key.public_key() == cert.public_key()
                and identities_in(uris_of(cert)) == [identity]
                and cert.not_valid_after_utc - _now() > RENEW_BEFORE)


def describe_certificate(path: Path) -> list[str]:
    """Human lines about a certificate file: who it names, who issued it, when it is valid."""
    cert = load_certificate(path)
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if is_ca:
        clusters = [unquote(u[len(SCHEME):]) for u in uris_of(cert) if u.startswith(SCHEME) and "/" not in u[len(SCHEME):]]
        who = f"the CA of cluster {clusters[0]!r}" if clusters else "a CA of no epochlog cluster"
    else:
        names = identities_in(uris_of(cert))
        who = ", ".join(f"{i.kind} {i.name} of cluster {i.cluster!r}" for i in names) or "no epochlog identity"
    return [f"{path}: {who}", f"  subject {cert.subject.rfc4514_string()}",
            f"  issuer  {cert.issuer.rfc4514_string()}",
            f"  valid   {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
            f"  uris    {', '.join(uris_of(cert)) or '-'}"]
