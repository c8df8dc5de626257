"""Errors that the CLI turns into one clear line and exit code 2 (runtime-safe: stdlib only)."""


class TrainboxError(Exception):
    """A user-facing error: the message names the file, the key and the fix."""

    exit_code = 2


def not_a_command(module: str) -> int:
    """What `python3 -m <library module>` does: say so and exit 2, so that a health probe written as
    `python3 -m trainbox.runtime.dist` fails loudly instead of passing with no output."""
    import sys

    print(f"python3 -m {module}: a library module, not a command. Health check: `trainbox doctor` or "
          "`python3 -m trainbox.runtime.doctor` (--json for scripts); the entrypoint: "
          "`python3 -m trainbox.runtime.entrypoint COMMAND`", file=sys.stderr)
    return 2


if __name__ == "__main__":  # `python3 -m` on a library module must fail loudly, not pass silently
    from trainbox.runtime.errors import not_a_command

    raise SystemExit(not_a_command(__spec__.name))
