"""The gossip keyring: AES-GCM keys from a file, sealing and opening frames.

File format: one base64-encoded AES key of 16, 24 or 32 bytes per line;
blank lines and ``#`` comments are ignored. The first key seals every frame
this node sends; every key is tried on a received frame, so a cluster rotates
by (1) adding the new key as a second line everywhere, (2) moving it to the
first line everywhere, (3) removing the old one.

Sealed frame: ``[1][12-byte random nonce][ciphertext + 16-byte tag]`` with a
fixed associated-data label, 29 bytes of overhead (memberlist's layout).
This module reads only the key file it is given.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import HamidError

SEALED = 1
PLAIN = 0
NONCE = 12
AAD = b"hamid-gossip/1"
OVERHEAD = 1 + NONCE + 16


class KeyringError(HamidError):
    """The key file is missing or malformed; the message says which line."""


class Keyring:
    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise KeyringError("a keyring needs at least one key")
        for k in keys:
            if len(k) not in (16, 24, 32):
                raise KeyringError(f"AES keys are 16, 24 or 32 bytes, got {len(k)}")
        self.keys = list(keys)
        self._aes = [AESGCM(k) for k in keys]
        self.generation = 0  # bumped by each replace(): users that cache per-key state rebuild it

    def replace(self, other: "Keyring") -> bool:
        """Take ``other``'s keys in place (a rotated key file), so every holder of
        this keyring (gossip, the peer API's server and client) uses them at once.
        False when they are the same keys."""
        if other.keys == self.keys:
            return False
        self.keys, self._aes = list(other.keys), list(other._aes)
        self.generation += 1
        return True

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Keyring":
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise KeyringError(f"cannot read gossip key file {path}: {e.strerror}") from None
        keys = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                k = base64.b64decode(line, validate=True)
            except (binascii.Error, ValueError):
                raise KeyringError(f"{path} line {n}: not base64") from None
            if len(k) not in (16, 24, 32):
                raise KeyringError(f"{path} line {n}: a key of {len(k)} bytes; accepted: 16, 24 or 32 bytes "
                                   "(e.g. `head -c 32 /dev/urandom | base64`)")
            keys.append(k)
        if not keys:
            raise KeyringError(f"{path}: no keys (one base64 key per line, the first used to send)")
        return cls(keys)

    def seal(self, plain: bytes) -> bytes:
        nonce = os.urandom(NONCE)
        return bytes([SEALED]) + nonce + self._aes[0].encrypt(nonce, plain, AAD)

    def open(self, frame: bytes) -> bytes | None:
        """The plaintext, or None if no key opens it."""
        if len(frame) < OVERHEAD or frame[0] != SEALED:
            return None
        nonce, body = frame[1:1 + NONCE], frame[1 + NONCE:]
        for aes in self._aes:
            try:
                return aes.decrypt(nonce, body, AAD)
            except InvalidTag:
                continue
        return None


async def watch_key_file(keyring: Keyring, path: str | os.PathLike, *, interval: float = 5.0) -> None:
    """Reload ``path`` into ``keyring`` whenever its content changes (a Secret
    volume swaps its files atomically; polled, since inotify on a swapped
    symbolic link sees nothing). A file that no longer loads is logged and
    the keys in use are kept."""
    import trio

    from .logs import get_logger

    log = get_logger("gossip")
    last: bytes | None = None
    while True:
        await trio.sleep(interval)
        try:
            raw = await trio.to_thread.run_sync(Path(path).read_bytes)
        except OSError as e:
            log.error("cannot read the gossip key file; keeping the keys in use", path=str(path), error=e.strerror)
            continue
        if raw == last:
            continue
        last = raw
        try:
            new = Keyring.load(path)
        except KeyringError as e:
            log.error("the gossip key file no longer loads; keeping the keys in use", error=str(e))
            continue
        if keyring.replace(new):
            log.info("gossip keyring reloaded", path=str(path), keys=len(new.keys))
