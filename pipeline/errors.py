"""User-facing errors: the CLI prints these as one line and exits non-zero."""


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a language code); the message names the input."""
