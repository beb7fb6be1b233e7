"""The one user-facing error type.

Everything that a user can cause (a bad path, an incompatible drafter, a prompt longer than the
context) raises :class:`LocalspecError` with a one-line message. The CLI turns it into
``Error: <message>`` and exit code 1; no other exception should reach a user as a traceback.
"""


class LocalspecError(Exception):
    """A problem the user can fix, described in one line."""
