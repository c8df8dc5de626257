"""Errors that the CLI turns into one clear line and exit code 2 (runtime-safe: stdlib only)."""

# The exit status of every trainbox command (commands/_args.py's grammar): 0 ok, 1 a check found problems, 2 usage
# or invalid input, 130 interrupted, 141 output pipe closed. Spelled here, once, for library code (a findings pass)
# and the thin CLI an image holds.
EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141


class TrainboxError(Exception):
    """A user-facing error: the message names the file, the key and the fix."""

    exit_code = 2


def cache_root() -> str:
    """trainbox's cache: TRAINBOX_CACHE, default ~/.cache/trainbox, read when asked (the host's paths.cache_dir()
    is this one; the image has no trainbox.paths)."""
    import os

    return os.environ.get("TRAINBOX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainbox")


# what the user can do about each errno a command meets on its own files (the rest: the system's own words)
_OS_FIX = {
    "ENOSPC": "no space left on the device; free some space and run it again",
    "EDQUOT": "the disk quota is used up; free some space and run it again",
    "EROFS": "the file system is read-only",
    "EACCES": "permission denied",
    "EPERM": "operation not permitted",
    "ENOTDIR": "a part of the path is a file, not a directory",
    "EISDIR": "is a directory, not a file",
    "ENAMETOOLONG": "the name is too long for the file system",
}


def describe_os_error(exc: OSError, path: str | None = None) -> str:
    """One line for an OSError that reached the command line: the path (the error's own, else `path`: a failed
    write() names none), what happened, and, when the path is in trainbox's cache (TRAINBOX_CACHE), how to point
    it elsewhere."""
    import errno
    import os

    code = errno.errorcode.get(exc.errno or 0, "")
    what = _OS_FIX.get(code) or " ".join(str(exc.strerror or exc).split())
    path = exc.filename if isinstance(exc.filename, str) else None if path is None else str(path)
    line = f"{path}: {what}" if path else what
    cache = os.path.abspath(cache_root())
    if path and (os.path.abspath(path) + "/").startswith(cache + "/"):
        line += (f" (trainbox's cache is {cache}: set TRAINBOX_CACHE to a writable directory with free space, "
                 "or fix this one)")
    return line


def not_a_command(module: str) -> int:
    """What `python3 -m <library module>` does: say so and exit 2, so that a health probe written as
    `python3 -m trainbox.runtime.dist` fails loudly instead of passing with no output."""
    import sys

    print(f"python3 -m {module}: a library module, not a command. Health check: `trainbox doctor` or "
          "`python3 -m trainbox.runtime.doctor` (--json for scripts); the entrypoint: "
          "`python3 -m trainbox.runtime.entrypoint COMMAND`", file=sys.stderr)
    return 2


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    raise SystemExit(not_a_command(__spec__.name))
