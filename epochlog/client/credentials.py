"""The credentials of a local cluster `epochlog up` made, and how a client finds them (docs/security.md).

`epochlog up` keeps in `<data-dir>/client/` the cluster CA's certificate, an admin client certificate
and its key (the first of `[clients.access] super_users`), and `credentials.json`, which names those
files and the cluster's client and Kafka addresses; `<data-dir>/client.env` holds the same as the SDK's
environment variables (`source` it in a shell). A client takes its credentials from, in order:

1. what its caller gives (`AsyncClient(tls=..., token=...)`, the CLI's `--tls-ca/--cert/--key/--token`);
2. the environment: EPOCHLOG_TLS_CA, EPOCHLOG_TLS_CERT, EPOCHLOG_TLS_KEY, EPOCHLOG_TOKEN;
3. a `data/*/client/credentials.json` under the working directory or the repository (where `epochlog
   up` keeps its data by default) whose cluster has one of the addresses the client was given; the
   newest when several do (`up` rewrites its file at each start, so the cluster started last wins).

So `epochlog up` then `epochlog put ...` from the repository needs nothing typed, and a client of
another cluster never picks these up: they are matched by address (and the CA in them refuses a server
of another cluster at the handshake). With a token of its own (1 or 2) a client takes only the CA from
3, not the admin certificate, so that it acts as the token's user.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, ClientTls

FILE_NAME = "credentials.json"
ENV_FILE_NAME = "client.env"
SEARCHED = "data/*/client/" + FILE_NAME          # under the working directory and the repository
REPOSITORY = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class LocalCredentials:
    """One local cluster's admin credential and the addresses it is for."""

    cluster: str
    principal: str                          # the client name its certificate carries
    client_addresses: tuple[str, ...]
    kafka_addresses: tuple[str, ...]
    ca_file: Path
    cert_file: Path
    key_file: Path

    def tls(self, *, with_certificate: bool = True) -> ClientTls:
        return ClientTls(str(self.ca_file), *((str(self.cert_file), str(self.key_file)) if with_certificate
                                              else (None, None)))

    def environment(self) -> dict[str, str]:
        """The SDK's variables naming these files (absolute paths)."""
        return {CA_ENV: str(self.ca_file), CERT_ENV: str(self.cert_file), KEY_ENV: str(self.key_file)}

    def serves(self, addresses: Iterable[str], *, kafka: bool = False) -> bool:
        """Whether one of `addresses` is this cluster's (the CLI's default endpoints are local-3's
        three; `up --config configs/single.toml` serves the first of them)."""
        known = set(self.kafka_addresses if kafka else self.client_addresses)
        return any(a in known for a in addresses)

    def write(self, directory: Path) -> Path:
        """`credentials.json` in `directory` and `client.env` beside it (its parent, the data directory)."""
        document = {"cluster": self.cluster, "principal": self.principal,
                    "client_addresses": list(self.client_addresses), "kafka_addresses": list(self.kafka_addresses),
                    "ca_file": str(self.ca_file), "cert_file": str(self.cert_file), "key_file": str(self.key_file)}
        path = directory / FILE_NAME
        _replace(path, json.dumps(document, indent=2) + "\n")
        env = "".join(f"export {k}={v}\n" for k, v in self.environment().items())
        _replace(directory.parent / ENV_FILE_NAME, f"# {self.cluster}'s admin credential, made by `epochlog up`\n"
                                                   f"unset {TOKEN_ENV}\n{env}")
        return path

    @classmethod
    def load(cls, path: Path) -> LocalCredentials | None:
        """The file's credentials; None when it is unreadable or names files that are gone."""
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
            found = cls(str(raw["cluster"]), str(raw["principal"]), tuple(raw["client_addresses"]),
                        tuple(raw.get("kafka_addresses") or ()), Path(raw["ca_file"]), Path(raw["cert_file"]),
                        Path(raw["key_file"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return found if all(p.is_file() for p in (found.ca_file, found.cert_file, found.key_file)) else None


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def find(addresses: Sequence[str], *, kafka: bool = False,
         roots: Sequence[Path] | None = None) -> LocalCredentials | None:
    """The newest local credentials whose cluster has one of `addresses` (client addresses, or Kafka
    ones with `kafka`), searched as the module docstring says; None when none does."""
    seen: set[Path] = set()
    matches: list[tuple[float, LocalCredentials]] = []
    if roots is None:
        try:
            roots = (Path.cwd(), REPOSITORY)
        except OSError:   # the working directory is gone
            roots = (REPOSITORY,)
    for root in roots:
        for path in root.glob(SEARCHED):
            path = path.resolve()
            if path in seen:
                continue
            seen.add(path)
            found = LocalCredentials.load(path)
            if found is not None and found.serves(addresses, kafka=kafka):
                try:
                    matches.append((path.stat().st_mtime, found))
                except OSError:
                    continue
    return max(matches, key=lambda m: m[0])[1] if matches else None


def resolve(addresses: Sequence[str], tls: ClientTls | None, token: str | None) -> tuple[ClientTls | None, str]:
    """The TLS and the token a client of `addresses` uses, given what its caller passed (None: not given)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "")
    if tls is None:
        tls = ClientTls.from_env()
    if tls is None:
        found = find(addresses)
        if found is not None:
            tls = found.tls(with_certificate=not token)
    return tls, token


def kafka_tls(bootstrap: Sequence[str]) -> ClientTls | None:
    """What a Kafka client of `bootstrap` presents: the environment's TLS, else the local credentials of
    the cluster with these Kafka addresses; None for a plaintext listener."""
    return ClientTls.from_env() or (None if (found := find(bootstrap, kafka=True)) is None else found.tls())


def kafka_python_options(bootstrap: Sequence[str]) -> dict[str, Any]:
    """kafka-python's security options for `bootstrap` ({} in plaintext): SSL with the client
    certificate, verified against the cluster CA. Members' certificates name node ids, not hosts, hence
    no host name check (the CA check stays)."""
    tls = kafka_tls(bootstrap)
    if tls is None:
        return {}
    options: dict[str, Any] = {"security_protocol": "SSL", "ssl_cafile": tls.ca_file, "ssl_check_hostname": False}
    if tls.cert_file:
        options.update(ssl_certfile=tls.cert_file, ssl_keyfile=tls.key_file)
    return options


__all__ = ["LocalCredentials", "find", "kafka_python_options", "kafka_tls", "resolve"]
