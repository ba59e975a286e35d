"""Errors the engine raises for problems a user can fix (bad path, corrupt file)."""


class ModelLoadError(Exception):
    """A model could not be loaded; the message is one line a user can act on."""
