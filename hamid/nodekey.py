"""Each node's own identity on the peer API: an Ed25519 key pair.

A shared library: the gossip service carries the public half, the peer API
checks signatures against it.

The gossip keyring is shared by every daemon, so it proves only that a
request comes from *some* member. Each daemon therefore also holds a key
pair of its own, made on its first start and kept in the state directory
(``peer-identity.key``, 0600, root's), and gossips the public half in its
capacity document (``pk``), where the keyring protects it. Every peer
request is signed with the sender's private key; the receiver checks the
signature against the key the sender's node gossips. Why this and not a
per-node certificate issued at install: a DaemonSet cannot hand each pod its
own Secret, and no component of hamid may sign certificates for nodes;
gossip already carries each node's document, so the public key rides along
at no cost, and a key never leaves the node that made it.

A member's key is pinned the first time it is seen (:mod:`hamid.gossip.identity`)
and changes only with the old key's word: :func:`rotate` (``hamid identity
rotate``) makes a new key and a rotation statement, the old key's signature
over the new public key (``peer-identity.rotation``), which the daemon
gossips with its statements. The state directory is on the host, so a
restarted or upgraded daemon keeps its key.
"""

from __future__ import annotations

import base64
import os

import cbor2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .atomicfile import replace_file
from .errors import HamidError

FILE_NAME = "peer-identity.key"
ROTATION_NAME = "peer-identity.rotation"  # [old public key, old key's signature over rotation_bytes(new)]


class IdentityError(HamidError):
    """The node's identity key cannot be read or made."""


class NodeIdentity:
    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_b64 = base64.b64encode(raw).decode()

    @classmethod
    def generate(cls) -> "NodeIdentity":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, state_dir: str | os.PathLike) -> "NodeIdentity":
        """The key in ``state_dir`` (made there, 0600, on first use; never through a link)."""
        path = os.path.join(state_dir, FILE_NAME)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            key = Ed25519PrivateKey.generate()
            raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(raw)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise IdentityError(f"cannot write the node's identity key {path}: {e.strerror}") from None
            return cls(key)
        except OSError as e:
            raise IdentityError(f"cannot read the node's identity key {path}: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            raw = f.read(64)
        if len(raw) != 32:
            raise IdentityError(f"{path} is not a 32-byte Ed25519 private key; remove it and restart "
                                "(the node then gossips a new identity)")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def private_bytes(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())


def rotation_bytes(new_pk: str) -> bytes:
    """What an old key signs to hand its node's name over to ``new_pk``."""
    return b"hamid-identity-rotate/1\0" + new_pk.encode()


def rotate(state_dir: str | os.PathLike) -> tuple[str, str]:
    """Replace the node's key with a new one and keep the old key's word for it (the rotation
    statement), so members that pinned the old key take the new one. (old, new) public keys.
    The daemon must be restarted to use it; the statement stays beside the key, for members
    that hear of the node only later."""
    old = NodeIdentity.load_or_create(state_dir)
    new = NodeIdentity.generate()
    statement = cbor2.dumps([old.public_b64, old.sign(rotation_bytes(new.public_b64))])
    path = os.path.join(state_dir, FILE_NAME)
    try:  # the statement first: a crash between the two leaves the old key with a statement it ignores
        replace_file(os.path.join(state_dir, ROTATION_NAME), statement, 0o600)
        replace_file(path, new.private_bytes(), 0o600)
    except OSError as e:
        raise IdentityError(f"cannot write the node's new identity key {path}: {e.strerror}") from None
    return old.public_b64, new.public_b64


def load_rotation(state_dir: str | os.PathLike, identity: NodeIdentity) -> tuple[str, bytes] | None:
    """The rotation statement that hands over to ``identity``'s key: (old public key, signature), or
    None when there is none, or one that is for another key (left by a rotation that did not finish)."""
    path = os.path.join(state_dir, ROTATION_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise IdentityError(f"cannot read the identity rotation statement {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(512)
    try:
        old, sig = cbor2.loads(raw)
    except Exception:
        raise IdentityError(f"{path} is not a rotation statement; remove it (the node's key then changes "
                            "for its peers only after its old key was silent: README, Gossip security)") from None
    if not valid_public_key(old) or type(sig) is not bytes or not verify(old, sig, rotation_bytes(identity.public_b64)):
        return None
    return old, sig


def valid_public_key(pk: object) -> bool:
    """Whether ``pk`` is a base64 Ed25519 public key (as gossiped in ``pk``)."""
    if type(pk) is not str or len(pk) != 44:
        return False
    try:
        return len(base64.b64decode(pk, validate=True)) == 32
    except ValueError:
        return False


def verify(pk_b64: str, signature: bytes, data: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(pk_b64)).verify(signature, data)
        return True
    except (InvalidSignature, ValueError):
        return False
