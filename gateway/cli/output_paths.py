"""Checks, before a command starts its work, that the files and directories it writes at the
end can be written: a benchmark that runs for an hour must not fail on its output path."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gateway.cli.usage_error import UsageError


def check_output_file(path: str, flag: str) -> None:
    """A file the command will create or replace (its missing parent directories are created)."""
    _check_not_empty(path, flag)
    target = Path(path).expanduser()
    if target.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file path")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable")
    _check_can_create_in(target.parent, flag, path)


def check_output_dir(path: str, flag: str) -> None:
    """A directory the command will create (with its parents) or write into."""
    _check_not_empty(path, flag)
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag} {path} exists and is not a directory")
    _check_can_create_in(target, flag, path)


def check_file_outside_dir(file_path: str, file_flag: str, dir_path: str, dir_flag: str) -> None:
    """The file is written first, then the directory: the file must not be the directory or one
    of the directories above it, or the second write fails after all the work."""
    file = Path(file_path).expanduser().absolute()
    directory = Path(dir_path).expanduser().absolute()
    if file == directory or file in directory.parents:
        raise UsageError(f"{file_flag} {file_path} and {dir_flag} {dir_path}: the file would stand where the "
                         "directory must be; give them different paths")


def _check_not_empty(path: str, flag: str) -> None:
    # An empty path means the working directory to some calls and nothing to others.
    if not path.strip():
        raise UsageError(f"{flag} is empty; give a path")


def _check_can_create_in(directory: Path, flag: str, path: str) -> None:
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is not a directory")
    # Permission bits do not tell (root ignores them; /proc and read-only mounts refuse anyway):
    # creating a file there does.
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".tiergate-write-check-"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {existing} ({exc.strerror or exc})") from None
