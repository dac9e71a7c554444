"""The root of hamid's own errors.

Every error that hamid reports to a user derives from :class:`HamidError`, so
callers (the CLI, the runtime hook, the local API) can tell "this is a message
for a person" from a bug.
"""


class HamidError(Exception):
    """An error with a message meant for the person who caused it."""

    # What an HTTP face (the Docker face, the local API) answers for it: the one mapping from a
    # refusal to a status, each error class saying its own (400: the request was refused as asked).
    http_status = 400


class Unreachable(HamidError):
    """The other side did not answer (refused connection, timed out, cut off): nothing said about it,
    only that it could not be asked. A face that must react to that without knowing which face's client
    raised it (the extender, after a peer commit) catches this."""
