"""The exception family the CLI turns into one line on stderr and an exit code."""


class JbkvError(Exception):
    """A known failure with a message fit to show a user as one line (exit code 1)."""

    exit_code = 1


class UsageError(JbkvError):
    """Bad input on the command line: a value, a prompt or a combination of options (exit 2)."""

    exit_code = 2


class WeightsNotFoundError(JbkvError):
    """Model weights are missing; the message lists what is expected where."""


def shown(text: str, limit: int = 60) -> str:
    """``repr`` of user input, cut to ``limit`` characters so an error stays one readable line."""
    return repr(text if len(text) <= limit else text[:limit] + "…")
