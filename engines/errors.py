"""Errors an engine or loader raises for bad user input (shown as one line by the CLI)."""


class ModelError(ValueError):
    """A model, weight file, checkpoint or prompt the user supplied cannot be used.

    The message names the bad value and what was expected; the CLI prints it as one line.
    """


class UnsupportedModel(ModelError):
    """An engine does not implement a layer feature the model uses (for example the megakernel and a Gemma
    model). Commands that run over every known model skip such a model, saying so; naming it is an error."""
