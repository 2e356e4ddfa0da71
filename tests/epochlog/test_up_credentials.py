"""Secure by default, still two commands: `epochlog up` makes the local cluster's admin credential and
the CLI and the SDK find it, while a client without it is refused (epochlog/client/credentials.py).

One process test (real nodes on free ports, `up` run from a scratch working directory as a user runs
it from the repository, its data in `data/local` there) and the pieces without processes: the
credential made once and reused, renewed near its end, none for plaintext faces, and the search by
address.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochlog.certs import ClusterCA, IssuedFiles
from epochlog.client import Client, ClientError
from epochlog.client.credentials import LocalCredentials, find, kafka_python_options, resolve
from epochlog.client.tls import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV, ClientTls
from epochlog.up import UpError, ensure_certificates, ensure_client_credentials, make_plan
from tests.epochlog.local_cluster import cluster_document, epochlog_argv, kill_leftovers, write_config
from tests.support.wait import wait_until

START_S = 120.0
CREDENTIAL_VARS = (CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV)


@pytest.fixture
def rng() -> random.Random:
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    return random.Random(seed)


@pytest.fixture
def no_credential_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)


def _clean_env() -> dict[str, str]:
    """The environment of a user who typed nothing: no credential variable set."""
    return {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS}


@pytest.fixture
def local_dir(tmp_path: Path) -> Iterator[Path]:
    """`data/local` under the scratch working directory (where `up` keeps its data by default)."""
    path = tmp_path / "data" / "local"
    yield path
    left = kill_leftovers(path)
    assert not left, f"node processes outlived `epochlog up`: {left}"


def test_the_default_up_cluster_refuses_plaintext_and_the_cli_with_no_flags_works(tmp_path, rng, local_dir,
                                                                                  no_credential_env):
    document = cluster_document(3, rng, name="local")
    config = write_config(tmp_path / "cluster.toml", document)
    endpoints = [m["client_address"] for m in document["cluster"]["members"]]
    out = tmp_path / "up.out"
    with out.open("wb") as sink:
        up = subprocess.Popen(epochlog_argv("up", "--config", config.name, "--data-dir", "data/local"),
                              stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path, env=_clean_env())
    try:
        def led() -> bool:
            assert up.poll() is None, f"up exited with {up.returncode}:\n{out.read_text()}"
            return "every group has a leader" in out.read_text()
        wait_until(led, START_S, "every group to have a leader")
        text = out.read_text()
        assert "client TLS: made admin's certificate in data/local/client" in text, text
        assert "source" not in text, "found by the CLI from its working directory: nothing to source"
        assert (local_dir / "client" / "admin.key").stat().st_mode & 0o777 == 0o600

        # A client that has no credential: the faces speak TLS only, so it gets no answer at all.
        with Client(endpoints, timeout=2.0) as plain:
            assert plain.aio.tls is None   # nothing under this test's working directory names the cluster
            with pytest.raises(ClientError):
                plain.status()

        # The CLI, typed with no credential option or variable, from the working directory of `up`.
        def cli(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(epochlog_argv(*args, "--config", config.name if cwd == tmp_path else str(config)),
                                  capture_output=True, text=True, timeout=60, cwd=cwd, env=_clean_env())
        put = cli("put", "app/x", "hello")
        assert put.returncode == 0, put.stderr
        got = cli("get", "app/x", "--json")
        assert got.returncode == 0 and json.loads(got.stdout)["value"] == "hello", got
        brokers = cli("brokers", "--json")   # the controller's commands (broker run, brokers simulate) alike
        assert brokers.returncode == 0, brokers.stderr
        # Enforcement is on: a certificate of the same CA that no grant names may not write.
        mallory = ClusterCA.load(local_dir / "ca").issue_client("mallory", tmp_path / "mallory")
        denied = cli("put", "app/x", "evil", "--tls-ca", str(mallory.ca), "--cert", str(mallory.cert),
                     "--key", str(mallory.key))
        assert denied.returncode == 3 and "mallory may not write kv/app/x" in denied.stderr, denied
        # Elsewhere (no data/*/client here names these addresses): the same command is refused.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        refused = cli("get", "app/x", cwd=elsewhere)
        assert refused.returncode != 0 and refused.stderr.startswith("error: "), refused
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
        code = up.wait(90)
    assert code == 0, out.read_text()

    cert = (local_dir / "client" / "admin.crt").read_bytes()
    again = subprocess.run(epochlog_argv("up", "--config", config.name, "--data-dir", "data/local", "--once"),
                           capture_output=True, text=True, timeout=START_S, cwd=tmp_path, env=_clean_env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert "client TLS: made" not in again.stdout and "peer TLS: made" not in again.stdout, again.stdout
    assert (local_dir / "client" / "admin.crt").read_bytes() == cert, "the second run must reuse the credential"


def test_the_admin_credential_is_made_once_renewed_near_its_end_and_not_for_plaintext_faces(tmp_path, rng):
    document = cluster_document(3, rng, name="creds-test")
    config = write_config(tmp_path / "cluster.toml", document)
    data = tmp_path / "data"
    plan = make_plan(config, None, data)
    ensure_certificates(plan)
    made, first = ensure_client_credentials(plan)
    assert first and made is not None and made.principal == "admin"
    assert made.client_addresses == tuple(m["client_address"] for m in document["cluster"]["members"])
    again, remade = ensure_client_credentials(plan)
    assert not remade and again == made
    files = IssuedFiles(made.cert_file, made.key_file, made.ca_file)
    assert ClusterCA.load(data / "ca").client_is_current("admin", files)
    env = (data / "client.env").read_text()
    assert f"export {CERT_ENV}={made.cert_file}\n" in env and f"unset {TOKEN_ENV}\n" in env, env
    assert LocalCredentials.load(data / "client" / "credentials.json") == made

    ClusterCA.load(data / "ca").issue_client("admin", data / "client", days=10)   # ours, near its end: renewed
    assert ensure_client_credentials(plan)[1]

    # Faces configured plaintext: no credential, and the stale one goes (a client would speak TLS to them).
    document["clients"]["tls"] = {"enabled": False}
    plaintext = make_plan(write_config(tmp_path / "plain.toml", document), None, data)
    assert ensure_client_credentials(plaintext) == (None, False)
    assert not (data / "client" / "credentials.json").exists() and not (data / "client.env").exists()

    # Enforcing with no super user: nothing `up` could make would be allowed anything (refused before
    # anything is made).
    nobody = cluster_document(3, rng, name="creds-test")
    nobody["clients"] = {}
    with pytest.raises(UpError, match=r"super_users is empty.*add super_users = \[\"admin\"\]"):
        make_plan(write_config(tmp_path / "nobody.toml", nobody), None, tmp_path / "nobody")
    assert not (tmp_path / "nobody").exists()


def _credentials(root: Path, name: str, addresses: tuple[str, ...], kafka: tuple[str, ...] = ()) -> LocalCredentials:
    ca = ClusterCA.create(root / name / "ca", name)
    files = ca.issue_client("admin", root / "data" / name / "client")
    found = LocalCredentials(name, "admin", addresses, kafka, files.ca, files.cert, files.key)
    found.write(root / "data" / name / "client")
    return found


def test_a_client_finds_the_credentials_of_the_cluster_it_names_and_no_other(tmp_path, no_credential_env):
    one = _credentials(tmp_path, "one", ("127.0.0.1:1001", "127.0.0.1:1002"), ("127.0.0.1:2001",))
    two = _credentials(tmp_path, "two", ("127.0.0.1:1001",))   # a single node on the first one's first port
    roots = [tmp_path]
    os.utime(tmp_path / "data" / "one" / "client" / "credentials.json", (1000, 1000))
    os.utime(tmp_path / "data" / "two" / "client" / "credentials.json", (2000, 2000))
    assert find(["127.0.0.1:1002"], roots=roots) == one
    assert find(["127.0.0.1:9999", "127.0.0.1:1002"], roots=roots) == one   # one address of it is enough
    assert find(["127.0.0.1:1001", "127.0.0.1:1002"], roots=roots) == two   # both serve it: the newest
    os.utime(tmp_path / "data" / "one" / "client" / "credentials.json", (3000, 3000))   # `up` started it again
    assert find(["127.0.0.1:1001"], roots=roots) == one
    assert find(["127.0.0.1:9999"], roots=roots) is None
    assert find(["127.0.0.1:2001"], kafka=True, roots=roots) == one
    # Files that are gone: not a credential.
    one.key_file.unlink()
    assert find(["127.0.0.1:1002"], roots=roots) is None
    assert find(["127.0.0.1:1001"], roots=roots) == two


def test_what_a_caller_gives_wins_and_a_token_takes_only_the_ca(tmp_path, monkeypatch, no_credential_env):
    monkeypatch.chdir(tmp_path)   # the working directory is searched
    found = _credentials(tmp_path, "local", ("127.0.0.1:1001",), ("127.0.0.1:2001",))
    assert resolve(["127.0.0.1:1001"], None, None) == (found.tls(), "")
    assert resolve(["127.0.0.1:5555"], None, None) == (None, "")
    assert resolve(["127.0.0.1:1001"], None, "t0ken") == (ClientTls(str(found.ca_file)), "t0ken")
    mine = ClientTls("/elsewhere/ca.crt")
    assert resolve(["127.0.0.1:1001"], mine, None) == (mine, "")
    monkeypatch.setenv(CA_ENV, "/env/ca.crt")
    assert resolve(["127.0.0.1:1001"], None, None) == (ClientTls("/env/ca.crt"), "")
    monkeypatch.delenv(CA_ENV)
    assert kafka_python_options(["127.0.0.1:2001"]) == {
        "security_protocol": "SSL", "ssl_cafile": str(found.ca_file), "ssl_check_hostname": False,
        "ssl_certfile": str(found.cert_file), "ssl_keyfile": str(found.key_file)}
    assert kafka_python_options(["127.0.0.1:2999"]) == {}
