"""Ed25519 signatures for the artifact tier.

Artifacts are compiled code (pickled graphs, Triton and C++ binaries), so a
reader must know who made one before anything in it is unpickled, imported or
dlopened. A writer holding a private key signs each artifact; a reader loads
one only when its signature verifies against a public key it trusts.

What is signed binds the bytes to the place they are stored under: the
artifact's kind, its key and the sha256 of its payload. A valid signature over
other bytes, or the same bytes moved to another key, does not verify.

Key files:
- private key: PEM PKCS#8, mode 0600 (``autotune keys new PATH``);
- public key: ``PATH.pub``, one line ``ed25519 <64 hex chars> [comment]``;
  readers list such files in ``AUTOTUNE_TRUSTED_KEYS``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32
_DOMAIN = b"autotune-artifact-v1\0"

# Verdicts of verify(); everything but OK is a miss for the reader.
OK = "ok"
UNSIGNED = "unsigned"
UNKNOWN_KEY = "unknown_key"
BAD_SIGNATURE = "bad_signature"


class KeyFileError(ValueError):
    """A key file is missing, unreadable or malformed; the message names it and the fix."""


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a public key (16 hex chars of its sha256)."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def payload_digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def signed_message(kind: str, key: str, digest: str) -> bytes:
    return b"".join((_DOMAIN, kind.encode(), b"\0", key.encode(), b"\0", bytes.fromhex(digest)))


@dataclass(frozen=True)
class Signer:
    """A loaded private key: signs artifacts."""

    path: str
    _private: object  # cryptography's Ed25519PrivateKey (kept opaque: imported lazily)
    public_key: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, kind: str, key: str, payload: bytes) -> bytes:
        return self._private.sign(signed_message(kind, key, payload_digest(payload)))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a reader accepts, by raw bytes."""

    keys: frozenset[bytes]

    def __bool__(self) -> bool:
        return bool(self.keys)

    @property
    def fingerprints(self) -> list[str]:
        return sorted(fingerprint(k) for k in self.keys)

    def verify(self, kind: str, key: str, payload: bytes, signature: bytes | None,
               public_key: bytes | None) -> str:
        """OK, or why the artifact must not be loaded. Never raises on bad data."""
        if not signature or not public_key:
            return UNSIGNED
        if bytes(public_key) not in self.keys:
            return UNKNOWN_KEY
        from cryptography.exceptions import InvalidSignature

        try:
            _public_key(bytes(public_key)).verify(bytes(signature), signed_message(kind, key, payload_digest(payload)))
        except (InvalidSignature, ValueError):
            return BAD_SIGNATURE
        return OK


@functools.lru_cache(maxsize=64)
def _public_key(raw: bytes) -> Any:
    """A trusted key, parsed once per process (a job verifies every payload with the same few keys)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


NO_TRUSTED_KEYS = TrustedKeys(frozenset())


def generate(path: str | os.PathLike[str], *, comment: str = "", overwrite: bool = False) -> Signer:
    """Write a new private key to path (mode 0600) and its public key to path.pub."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    target = Path(path)
    public_path = Path(f"{target}.pub")
    for existing in (target, public_path):
        if existing.exists() and not overwrite:
            raise KeyFileError(f"{existing} already exists; choose another path, or replace the pair "
                               "with `autotune keys new --force`")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    raw_public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_private(target, pem)
        public_path.write_text(f"ed25519 {raw_public.hex()}{' ' + comment if comment else ''}\n")
    except OSError as error:
        raise KeyFileError(f"cannot write key file {error.filename or target}: {error.strerror}; "
                           "choose a writable path") from None
    return Signer(str(target), private, raw_public)


def _write_private(path: Path, pem: bytes) -> None:
    # Created 0600 from the start: the key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    os.chmod(path, 0o600)


def load_signer(path: str | os.PathLike[str]) -> Signer:
    """The private key at path, or KeyFileError naming the file and the fix."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read(path, "signing key", "AUTOTUNE_SIGNING_KEY / --signing-key")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise KeyFileError(f"signing key {path} is not an unencrypted PEM private key ({error}); "
                           "create one with `autotune keys new PATH`") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path} is not an Ed25519 key; create one with `autotune keys new PATH`")
    raw_public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Signer(str(path), private, raw_public)


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """The raw public key in a PATH.pub file, or KeyFileError naming the file and the fix."""
    text = _read(path, "trusted key", "AUTOTUNE_TRUSTED_KEYS / trusted_keys").decode("utf-8", "replace")
    fields = text.split()
    if len(fields) >= 2 and fields[0] == "ed25519":
        try:
            raw = bytes.fromhex(fields[1])
        except ValueError:
            raw = b""
        if len(raw) == PUBLIC_KEY_BYTES:
            return raw
    raise KeyFileError(f"trusted key {path} is not an autotune public key (expected one line "
                       "'ed25519 <64 hex chars>'); use the .pub file that `autotune keys new` wrote")


def load_trusted(paths: Iterable[str | os.PathLike[str]]) -> TrustedKeys:
    return TrustedKeys(frozenset(load_public_key(p) for p in paths))


def _read(path: str | os.PathLike[str], what: str, where: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"{what} file {path} does not exist; check {where}, "
                           "or create a key pair with `autotune keys new PATH`") from None
    except IsADirectoryError:
        raise KeyFileError(f"{what} file {path} is a directory; check {where}: it names the file "
                           "that `autotune keys new PATH` wrote") from None
    except OSError as error:
        raise KeyFileError(f"cannot read {what} file {path}: {error.strerror}; check its permissions, "
                           "or create a new pair with `autotune keys new PATH`") from None
