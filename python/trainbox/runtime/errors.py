"""Errors that the CLI turns into one clear line and exit code 2 (runtime-safe: stdlib only)."""


class TrainboxError(Exception):
    """A user-facing error: the message names the file, the key and the fix."""

    exit_code = 2
