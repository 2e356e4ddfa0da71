"""Where an events table lives: a local directory or an S3 (or S3-compatible) prefix.

`TableLocation` is one table's address and credentials, and the one place that turns them into what
each library wants: `storage_options` for delta-rs (the Delta log: reads, commits, optimize, vacuum)
and a pyarrow filesystem for the Parquet files (written by Spark executors, listed and deleted by the
driver). Neither needs Hadoop jars, so executors write straight to the store and the driver commits
paths every host can see.

Credentials and endpoint come from the usual variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION or AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
AWS_ALLOW_HTTP), resolved once on the driver; explicit options (`--storage-option KEY=VALUE`) win.
The resolved options travel to the executors as Spark data source options named `storage.<KEY>`
(Spark redacts the secret ones in plans and logs), so executors on other hosts need no environment.

Concurrent commits: delta-rs commits a version by writing `_delta_log/<version>.json` with a
conditional put (`If-None-Match: *`): of two writers of one version, the store refuses the second,
which then reloads and retries (spark.commit). That is delta-rs's default for S3 (AWS S3 since 2024,
MinIO, R2 and moto support it); `AWS_S3_ALLOW_UNSAFE_RENAME` (a put that may overwrite) is refused
here, since two exports could then overwrite each other's commit. See docs/export.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from spark.errors import ExportError

OPTION_PREFIX = "storage."
_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ALLOW_HTTP")
_UNSAFE = "AWS_S3_ALLOW_UNSAFE_RENAME"


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A table root: `uri` is an absolute local path or `s3://bucket/prefix` (no trailing slash);
    `options` are delta-rs storage options (upper-case AWS_* keys), empty for a local table."""

    uri: str
    options: dict[str, str] = field(default_factory=dict, repr=False)   # may hold secrets

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | Path, options: dict[str, str] | None = None, *,
              environ: dict[str, str] | None = None) -> TableLocation:
        """A location from a path or URI; for s3://, the options resolved from `environ`
        (default os.environ) and then `options`."""
        raw = str(text)
        scheme = urlparse(raw).scheme.lower() if "://" in raw else ""
        if scheme in ("", "file"):
            if options:
                raise ExportError("storage options are for object storage (s3://...), not a local path")
            local = raw[len("file://"):] if scheme == "file" else raw
            return cls(str(Path(local).expanduser().resolve()))
        if scheme in ("s3", "s3a"):
            parsed = urlparse(raw)
            if not parsed.netloc:
                raise ExportError(f"{raw}: an S3 location is s3://bucket/prefix")
            prefix = parsed.path.strip("/")
            uri = f"s3://{parsed.netloc}" + (f"/{prefix}" if prefix else "")
            return cls(uri, resolve_s3_options(options or {}, os.environ if environ is None else environ))
        raise ExportError(f"{raw}: tables live in a local directory or on S3 (s3://bucket/prefix); "
                          f"{scheme}:// is not supported")

    @classmethod
    def of(cls, value: str | Path | TableLocation) -> TableLocation:
        return value if isinstance(value, TableLocation) else cls.parse(value)

    def child(self, name: str) -> TableLocation:
        """A location below this one (a side table), with the same options."""
        return TableLocation(self.uri.rstrip("/") + "/" + name.strip("/"), dict(self.options))

    # --- what the libraries take ----------------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return not self.uri.startswith("s3://")

    def delta_options(self) -> dict[str, str] | None:
        """storage_options for deltalake (None for a local table)."""
        return None if self.is_local else dict(self.options)

    def filesystem(self) -> tuple[Any, str]:
        """(pyarrow filesystem, the table root as that filesystem's path)."""
        import pyarrow.fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem(), self.uri
        o = self.options
        endpoint = o.get("AWS_ENDPOINT_URL")
        kwargs: dict[str, Any] = {"region": o.get("AWS_REGION") or "us-east-1"}
        if o.get("AWS_ACCESS_KEY_ID"):
            kwargs.update(access_key=o["AWS_ACCESS_KEY_ID"], secret_key=o.get("AWS_SECRET_ACCESS_KEY", ""),
                          session_token=o.get("AWS_SESSION_TOKEN"))
        if endpoint:
            parsed = urlparse(endpoint)
            kwargs.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https")
        return pafs.S3FileSystem(**kwargs), self.uri[len("s3://"):]

    def path(self, relative: str) -> str:
        """A file below the root as the filesystem's path."""
        _, root = self.filesystem()
        return root.rstrip("/") + "/" + relative

    def file_uri(self, relative: str) -> str:
        return self.uri.rstrip("/") + "/" + relative

    def relative(self, path: str) -> str:
        """A path as delta-rs lists it (relative, or a URI below the root) relative to the root."""
        prefix = self.uri.rstrip("/") + "/"
        for p in (prefix, "file://" + prefix):
            if path.startswith(p):
                return path[len(p):]
        return path

    # --- files below the root ---------------------------------------------------------------------

    def list_files(self, suffix: str = ".parquet") -> list[StoredFile]:
        """Every file below the root ending in `suffix`, outside hidden directories (`_delta_log`,
        `_epochlog`: names starting with `_` or `.`, as Delta readers skip them)."""
        import pyarrow.fs as pafs

        fs, root = self.filesystem()
        root = root.rstrip("/")
        try:
            infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except FileNotFoundError:
            return []
        out = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(suffix):
                continue
            relative = info.path[len(root) + 1:]
            if any(part.startswith(("_", ".")) for part in relative.split("/")):
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            out.append(StoredFile(relative, int(info.size or 0), int(mtime * 1000)))
        return out

    def size(self, relative: str) -> int | None:
        """Bytes of a file below the root (None: no such file)."""
        import pyarrow.fs as pafs

        fs, _ = self.filesystem()
        info = fs.get_file_info(self.path(relative))
        return None if info.type == pafs.FileType.NotFound else int(info.size or 0)

    def delete(self, relative: str) -> None:
        """Delete a file below the root (no error if it is gone already)."""
        fs, _ = self.filesystem()
        try:
            fs.delete_file(self.path(relative))
        except FileNotFoundError:
            pass

    def read_bytes(self, relative: str) -> bytes | None:
        fs, _ = self.filesystem()
        try:
            with fs.open_input_stream(self.path(relative)) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None

    def write_bytes(self, relative: str, data: bytes) -> None:
        fs, _ = self.filesystem()
        path = self.path(relative)
        if self.is_local:
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as f:
            f.write(data)


    # --- Spark data source options ------------------------------------------------------------------

    def to_spark_options(self) -> dict[str, str]:
        out = {"path": self.uri}
        out.update({OPTION_PREFIX + k: v for k, v in self.options.items()})
        return out

    @classmethod
    def from_spark_options(cls, options: Any, key: str = "path") -> TableLocation:
        """The location a data source was given (`path` and `storage.*` options; option names reach
        Python data sources lower-cased)."""
        storage = {k[len(OPTION_PREFIX):].upper(): v for k, v in dict(options).items()
                   if k.lower().startswith(OPTION_PREFIX)}
        uri = options[key]
        return cls(uri, storage) if uri.startswith("s3://") else cls(uri)

    def __str__(self) -> str:
        return self.uri


def resolve_s3_options(explicit: dict[str, str], environ: Any) -> dict[str, str]:
    """delta-rs storage options for S3 from the environment, then `explicit` (keys upper-cased)."""
    out: dict[str, str] = {}
    for key in _ENV_KEYS:
        if environ.get(key):
            out[key] = environ[key]
    if not out.get("AWS_REGION") and environ.get("AWS_DEFAULT_REGION"):
        out["AWS_REGION"] = environ["AWS_DEFAULT_REGION"]
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
    out.update({k.upper(): v for k, v in explicit.items()})
    if out.get(_UNSAFE, "").lower() in ("1", "true", "yes"):
        raise ExportError(f"{_UNSAFE} lets two writers overwrite each other's Delta commit; the export needs "
                          f"a store with conditional put (If-None-Match), which S3, MinIO and R2 have")
    out.setdefault("AWS_REGION", "us-east-1")
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out.setdefault("AWS_ALLOW_HTTP", "true")
    return out


def parse_storage_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`KEY=VALUE` pairs (the CLI's repeatable --storage-option)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ExportError(f"--storage-option {pair!r}: give KEY=VALUE (e.g. AWS_ENDPOINT_URL=http://host:9000)")
        out[key.strip().upper()] = value
    return out


@dataclass(frozen=True, slots=True)
class StoredFile:
    path: str              # relative to the table root
    size: int
    modification_ms: int
