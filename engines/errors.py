"""Errors an engine or loader raises for bad user input (shown as one line by the CLI)."""


class ModelError(ValueError):
    """A model, weight file, checkpoint or prompt the user supplied cannot be used.

    The message names the bad value and what was expected; the CLI prints it as one line.
    """
