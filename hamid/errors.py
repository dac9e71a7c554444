"""The root of hamid's own errors.

Every error that hamid reports to a user derives from :class:`HamidError`, so
callers (the CLI, the runtime hook, the local API) can tell "this is a message
for a person" from a bug.
"""


class HamidError(Exception):
    """An error with a message meant for the person who caused it."""
