"""The one exception type for bad command-line input (exit 2, one line, no traceback)."""


class UsageError(ValueError):
    """Bad command-line input the user can fix."""
