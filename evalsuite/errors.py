"""Errors for bad user input outside the engines (shown by the CLI as one line, exit code 2)."""


class SpecError(ValueError):
    """A flag, prompt file, golden file or setting the user supplied cannot be used."""
