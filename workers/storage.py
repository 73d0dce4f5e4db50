"""Filesystems for local paths and URIs (s3://, gs://, hdfs://, file://), via pyarrow.fs."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import pyarrow.fs as pafs

_SCHEMES = {"s3": pafs.S3FileSystem, "gs": pafs.GcsFileSystem, "gcs": pafs.GcsFileSystem}
# What a URI path may hold unescaped (RFC 3986 pchar, less "%"): `uri` escapes the rest,
# so a key with a space, "#" or "?" still makes a URI that resolves back to that key.
_PATH_SAFE = "/:@!$&'()*+,;="


def resolve(uri: str, options: dict | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it). `options` go to the filesystem's constructor
    (e.g. S3's endpoint_override, region, access_key), so private endpoints work.
    A URI's path is percent-decoded, with or without options (pyarrow's from_uri decodes)."""
    scheme = urlparse(uri).scheme
    if scheme in _SCHEMES and options:
        parsed = urlparse(uri)
        if scheme == "s3":  # a small object then goes in one PUT, not a three-request multipart upload
            options = {"allow_delayed_open": True, **options}
        try:
            fs = _SCHEMES[scheme](**options)
        except TypeError as e:  # an unknown or mistyped option: say which filesystem took it
            raise ValueError(f"storage_options for {scheme}:// rejected by {_SCHEMES[scheme].__name__}: {e}") from e
        return fs, unquote(f"{parsed.netloc}{parsed.path}").rstrip("/")
    if remote_scheme(uri):
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(uri).absolute())


class FileSystems:
    """`resolve` for many URIs with one filesystem object per store (scheme and bucket),
    shared by every path on it: a filesystem per file costs a client (and, on S3, its
    credential lookup) each time."""

    def __init__(self, options: dict | None = None) -> None:
        self.options = options
        self._cache: dict[tuple[str, str], pafs.FileSystem] = {}

    def resolve(self, uri: str) -> tuple[pafs.FileSystem, str]:
        if uri.startswith("/"):  # an absolute local path, as listings hold them
            if ("", "") not in self._cache:
                self._cache["", ""] = pafs.LocalFileSystem()
            return self._cache["", ""], uri
        scheme = remote_scheme(uri)
        if scheme not in (None, *_SCHEMES):  # e.g. hdfs://: paths do not follow the bucket/key form
            return resolve(uri, self.options)
        parsed = urlparse(uri)
        key = (scheme or "", parsed.netloc if scheme else "")
        if key not in self._cache:
            self._cache[key], path = resolve(uri, self.options)
            return self._cache[key], path
        if scheme is None:
            return self._cache[key], str(Path(uri).absolute())
        return self._cache[key], unquote(f"{parsed.netloc}{parsed.path}").rstrip("/")


def remote_scheme(uri: str) -> str | None:
    """The URI's filesystem scheme; None for a local path (a one-letter "scheme" is a
    Windows drive). A string without "://" or a leading "file:" is a plain path: planning
    asks this of every input file, so it spares those a URL parse."""
    if "://" not in uri and not uri.startswith("file:"):
        return None
    scheme = urlparse(uri).scheme
    return scheme if len(scheme) > 1 else None


def uri(scheme: str, path: str) -> str:
    """The URI of `path` in a `scheme` filesystem, as `resolve` reads it back."""
    return f"{scheme}://{quote(path, safe=_PATH_SAFE)}"


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def is_local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return f.read()


def list_dir(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """The entries directly in `path`, by name; none when it does not exist."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    return sorted(fs.get_file_info(pafs.FileSelector(path)), key=lambda e: e.base_name)


def list_names(fs: pafs.FileSystem, path: str) -> list[str]:
    """The names of the files directly in `path`, unsorted; none when it does not exist.
    A local directory is read without a stat per entry (what `list_dir` pays for sizes
    and times): resuming a job lists every commit record by name alone."""
    if is_local(fs):
        try:
            with os.scandir(path) as entries:
                return [e.name for e in entries if e.is_file()]
        except FileNotFoundError:
            return []
    return [e.base_name for e in list_dir(fs, path) if e.is_file]
