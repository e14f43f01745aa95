"""The one exception family the CLI turns into a one-line message and exit code 1."""


class JbkvError(Exception):
    """A known failure with a message fit to show a user as one line."""


class WeightsNotFoundError(JbkvError):
    """Model weights are missing; the message lists what is expected where."""
