"""Errors that the CLI turns into one line on stderr and exit code 2."""


class WarmdInputError(ValueError):
    """Bad input from the user: a path, a config, a flag value."""
