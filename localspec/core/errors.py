"""The one user-facing error type.

Everything that a user can cause (a bad path, an incompatible drafter, a prompt longer than the
context) raises :class:`LocalspecError` with a one-line message. The CLI turns it into
``Error: <message>`` and exit code 1; no other exception should reach a user as a traceback.
"""


class LocalspecError(Exception):
    """A problem the user can fix, described in one line."""


class NotFound(LocalspecError):
    """A named model, catalog entry, repository or revision that the store or the hub does not have
    (the server answers it with 404, other store errors with 400)."""


class GrammarError(LocalspecError):
    """A grammar (GBNF, or a JSON schema turned into one) that cannot be used: too large or too
    deep for llama.cpp, not valid, or allowing no text. The server names the request field it
    came from (``response_format``, ``tools``), not the prompt's."""
