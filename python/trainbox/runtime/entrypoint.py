"""trainbox-entrypoint: prepare the environment, then exec the command (runtime: stdlib only).

The image runs it under tini: ENTRYPOINT ["/usr/bin/tini", "-s", "-g", "--", "trainbox-entrypoint"].
In order, it:

1. loads the stack manifest (/etc/trainbox/stack.json, or $TRAINBOX_MANIFEST);
2. applies the stack's environment defaults: a variable already set (by the image's ENV or by the user's
   `docker run -e`) keeps its value, so the precedence is stack default < image ENV < user -e;
   TRAINBOX_DEVICE=cpu also defaults TORCH_DEVICE_BACKEND_AUTOLOAD=0, so torch_npu is not auto-loaded;
3. sets up CANN as the cann base image's own ENTRYPOINT would: the toolkit's, BiSheng's (AscendNPU-IR,
   which triton-ascend needs) and ATB's set_env.sh (ATB told `--cxx_abi=1`, so it does not import torch).
   When the image build recorded what they export (/etc/trainbox/cann-env.json, trainbox.runtime.cann_env)
   that record is applied and nothing is sourced (`trainbox image build` also bakes it as ENV, so this is
   a no-op there; what the ENV lacked is named in $TRAINBOX_CANN_ENV_APPLIED for the doctor); otherwise the
   scripts that exist (list: $TRAINBOX_SET_ENV_SCRIPTS, colon separated, each `PATH [ARG...]`, empty to skip)
   are sourced in one `bash` with `set +u` (the scripts read unset variables). Either way a variable that was
   already set keeps its value unless the scripts only extended it (PATH-like prepends, then de-duplicated).
   Skipped with TRAINBOX_DEVICE=cpu (the venv's cpu_mode hook then hides torch_npu from every Python process);
4. with TRAINBOX_CHECK=1 prints the quick doctor checks' problems to stderr and goes on; with
   TRAINBOX_CHECK=strict refuses to start (exit 78) when one FAILs;
5. replaces itself with the command (os.execvpe: no Python process stays behind, so signals from tini
   reach the command and its exit status is the container's). No command: an interactive shell
   (bash, else sh). A command that is not found exits 127, one that cannot be executed 126.

TRAINBOX_DEBUG=1 prints what it changed. It imports nothing heavy so that `docker run IMAGE true` costs
little more than `docker run --entrypoint true IMAGE` (bench/entrypoint_overhead.py).
"""

from __future__ import annotations

import os
import sys

from .npu import (ASCENDNPU_IR_SET_ENV, ATB_SET_ENV_ARGS, CANN_ENV_APPLIED_VAR, CANN_ENV_FILE, NNAL_SET_ENV,
                  TOOLKIT_HOMES, TOOLKIT_SET_ENV, VERSIONED_HOMES)

PROG = "trainbox-entrypoint"
SET_ENV_SCRIPTS = (
    *TOOLKIT_SET_ENV,
    # BiSheng / AscendNPU-IR under the toolkit home: found by ascendnpu_ir_set_env()
    NNAL_SET_ENV + " " + " ".join(ATB_SET_ENV_ARGS),
)
EXIT_CHECK_FAILED = 78  # EX_CONFIG from sysexits.h: the environment, not the command, is wrong
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
SOURCE_TIMEOUT_S = 60

# Set by bash itself, not by the scripts: never import them.
_SHELL_VARS = {"_", "SHLVL", "PWD", "OLDPWD"}

HELP = f"""usage: {PROG} [COMMAND [ARG...]]

The trainbox image's entrypoint (run by tini). It applies the stack's environment defaults, sources
the CANN/NNAL set_env.sh scripts that exist, optionally runs quick checks, then execs COMMAND.
Without COMMAND it starts an interactive shell (bash, else sh).

environment:
  TRAINBOX_CHECK=0|1|strict   1: print problems found by the quick checks; strict: refuse to start
                              (exit {EXIT_CHECK_FAILED}) when a check fails. Full report: trainbox doctor
  TRAINBOX_DEVICE=cpu         run without an accelerator on purpose, as in a CPU image: no CANN
                              set_env, TORCH_DEVICE_BACKEND_AUTOLOAD=0, and every Python process
                              finds no torch_npu (trainbox.runtime.cpu_mode)
  TRAINBOX_MANIFEST=PATH      stack manifest to read (default /etc/trainbox/stack.json)
  TRAINBOX_SET_ENV_SCRIPTS=A:B  scripts to source instead of the CANN/NNAL defaults ('' for none);
                              each entry is `PATH [ARG...]`
  TRAINBOX_CANN_ENV_FILE=PATH the build's record of the CANN environment (default {CANN_ENV_FILE})
  TRAINBOX_DEBUG=1            say what was changed
"""


def _say(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")


def _env_name_ok(key) -> bool:
    return isinstance(key, str) and bool(key) and not key[0].isdigit() and \
        all(c == "_" or (c.isascii() and c.isalnum()) for c in key)


def apply_defaults(env: dict, manifest: dict | None, skipped: list[str] | None = None) -> list[str]:
    """Set the stack's env defaults where unset; return the names that were set. A name or value that
    cannot be in an environment (`BAR=1`, a NUL) is skipped with a warning (exec would refuse it) and
    added to `skipped`."""
    applied = []
    for key, value in ((manifest or {}).get("env") or {}).items():
        if not _env_name_ok(key) or not isinstance(value, str) or "\x00" in value:
            _say(f"warning: the stack manifest's env entry {str(key)[:60]!r} is not NAME=VALUE with NAME "
                 "[A-Za-z_][A-Za-z0-9_]*; skipped it (rebuild the image from a valid stack)")
            if skipped is not None:
                skipped.append(str(key))
            continue
        if key not in env:
            env[key] = value
            applied.append(key)
    if env.get("TRAINBOX_DEVICE", "").strip().lower() == "cpu" and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in env:
        # torch auto-loads torch_npu at `import torch`; without CANN that import fails.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        applied.append("TORCH_DEVICE_BACKEND_AUTOLOAD")
    return applied


def ascendnpu_ir_set_env(env: dict) -> str | None:
    """BiSheng's (AscendNPU-IR) set_env.sh under the toolkit home the image declares, else the newest one."""
    homes = [env.get(v) for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")] + list(TOOLKIT_HOMES)
    for home in filter(None, homes):
        p = os.path.join(home, ASCENDNPU_IR_SET_ENV)
        if os.path.isfile(p):
            return p
    import glob

    found = sorted(glob.glob(os.path.join(VERSIONED_HOMES, ASCENDNPU_IR_SET_ENV)))
    return found[-1] if found else None


def set_env_scripts(env: dict) -> list[str]:
    """The set_env scripts to source that exist, each `PATH [ARG...]`."""
    listed = env.get("TRAINBOX_SET_ENV_SCRIPTS")
    if listed is None:
        ir = ascendnpu_ir_set_env(env)
        candidates = list(SET_ENV_SCRIPTS[:2]) + ([ir] if ir else []) + list(SET_ENV_SCRIPTS[2:])
    else:
        candidates = [p for p in listed.split(":") if p.strip()]
    return [p for p in candidates if os.path.isfile(p.split()[0])]


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _find_bash(env: dict) -> str | None:
    for d in (env.get("PATH") or "/usr/bin:/bin").split(":") + ["/bin", "/usr/bin"]:
        p = os.path.join(d or ".", "bash")
        if os.access(p, os.X_OK):
            return p
    return None


def _dedupe(value: str) -> str:
    seen, out = set(), []
    for part in value.split(":"):
        if part and part not in seen:  # an empty entry would mean "current directory"
            seen.add(part)
            out.append(part)
    return ":".join(out)


def _extends(old: str, new: str) -> bool:
    """True when `new` is `old` with entries added (what `export X=/a:$X` does)."""
    old_parts = [p for p in old.split(":") if p]
    new_parts = set(new.split(":"))
    return bool(old_parts) and all(p in new_parts for p in old_parts)


def source_scripts(env: dict, scripts: list[str]) -> tuple[dict, list[str]]:
    """Source `scripts` in one bash and merge what they export into `env` (returns env, changed names)."""
    if not scripts:
        return env, []
    bash = _find_bash(env)
    if bash is None:
        _say(f"warning: bash not found; not sourcing {', '.join(scripts)}")
        return env, []
    import subprocess

    # Script output goes to stderr (captured); their `env -0` to stdout. </dev/null: a script must not eat
    # the command's stdin. Each failure is reported, the rest still run.
    lines = ["set +u"]
    for s in scripts:
        q = " ".join(_quote(w) for w in s.split())
        lines.append(f". {q} >&2 </dev/null || echo \"{PROG}: warning: {_quote(s)} returned $?\" >&2")
    lines.append("exec env -0")
    child_env = {k: v for k, v in env.items() if k not in ("BASH_ENV", "ENV")}
    try:
        proc = subprocess.run([bash, "--noprofile", "--norc", "-c", "\n".join(lines)], env=child_env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=SOURCE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _say(f"warning: sourcing {', '.join(scripts)} took over {SOURCE_TIMEOUT_S} s; starting without it")
        return env, []
    for line in proc.stderr.decode(errors="replace").splitlines():
        if line.startswith(f"{PROG}: warning:"):
            sys.stderr.write(line + "\n")
    if proc.returncode != 0 or not proc.stdout:
        _say(f"warning: sourcing {', '.join(scripts)} failed (bash exited {proc.returncode}; a script may call "
             "`exit`); starting without it")
        return env, []
    sourced = {}
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            sourced[os.fsdecode(key)] = os.fsdecode(value)
    return merge_env(env, sourced)


def merge_env(env: dict, sourced: dict) -> tuple[dict, list[str]]:
    """Merge what set_env scripts export into `env` (returns env, changed names): a value the image or the
    user set wins, except where the scripts only extended it (PATH-like prepends)."""
    changed = []
    for key, value in sourced.items():
        if key in _SHELL_VARS:
            continue
        old = env.get(key)
        if old == value:
            continue
        if old is None:
            env[key] = _dedupe(value) if key.endswith("PATH") else value
        elif _extends(old, value):
            env[key] = _dedupe(value)
        else:
            continue  # a value the image or the user set wins over the script's
        changed.append(key)
    return env, changed


def recorded_cann_env(env: dict) -> dict | None:
    """What the image build recorded the CANN scripts to export (None: no usable record, source them)."""
    path = env.get("TRAINBOX_CANN_ENV_FILE") or CANN_ENV_FILE
    if "TRAINBOX_SET_ENV_SCRIPTS" in env or not os.path.isfile(path):
        return None
    import json  # only here: a plain start must stay light (tests/test_entrypoint.py)

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        recorded = data["env"]
        if not (isinstance(recorded, dict) and data.get("sourced")):
            return None  # built where there was nothing to source (a substitute base): look again now
        return {str(k): str(v) for k, v in recorded.items()}
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        _say(f"warning: {path}: unreadable ({exc}); sourcing the CANN scripts instead")
        return None


def apply_cann_env(env: dict) -> tuple[dict, list[str], list[str]]:
    """Step 2: the CANN environment, from the build's record or by sourcing the scripts (returns env, the
    record or scripts used, the names changed). Nothing with TRAINBOX_DEVICE=cpu: the command runs as in a CPU
    image, and torch_npu is hidden from it anyway (trainbox.runtime.cpu_mode)."""
    if env.get("TRAINBOX_DEVICE", "").strip().lower() == "cpu":
        return env, [], []
    recorded = recorded_cann_env(env)
    if recorded is not None:
        env, changed = merge_env(env, recorded)
        if changed:  # the image's ENV lacked them: `trainbox doctor` (cann.env_baked) says so
            env[CANN_ENV_APPLIED_VAR] = ",".join(sorted(changed))
        return env, [env.get("TRAINBOX_CANN_ENV_FILE") or CANN_ENV_FILE], changed
    scripts = set_env_scripts(env)
    env, changed = source_scripts(env, scripts)
    return env, scripts, changed


def _check_mode(env: dict) -> str:
    raw = (env.get("TRAINBOX_CHECK") or "0").strip().lower()
    if raw in ("0", "", "false", "no", "off"):
        return "off"
    if raw == "strict":
        return "strict"
    if raw not in ("1", "true", "yes", "on"):
        _say(f"warning: TRAINBOX_CHECK={raw!r} is not 0, 1 or strict; running the checks as for 1")
    return "report"


def run_checks(env: dict, manifest: dict | None, manifest_error: str | None, strict: bool) -> bool:
    """Run the quick doctor checks; print problems; return False when strict and a check FAILs."""
    from . import doctor

    ctx = doctor.Context(env=env, manifest=manifest, manifest_error=manifest_error,
                         manifest_file=env.get("TRAINBOX_MANIFEST") or "/etc/trainbox/stack.json", quick=True)
    results = doctor.run_checks(ctx)
    for r in results:
        if r.status in (doctor.WARN, doctor.FAIL):
            _say(r.line())
    s = doctor.summarize(results)
    _say(f"checks: {s['status']} ({s['pass']} pass, {s['warn']} warn, {s['fail']} fail, {s['skip']} skip); "
         "full report: trainbox doctor")
    if strict and s["fail"]:
        _say(f"refusing to start: {s['fail']} check(s) failed and TRAINBOX_CHECK=strict; fix them, or set "
             "TRAINBOX_CHECK=1 to start anyway")
        return False
    return True


def _restore_signals() -> None:
    # Python ignores SIGPIPE and SIGXFSZ at startup, and ignored signals survive exec: give the command
    # the defaults it would get from a shell (`yes | head` must end by SIGPIPE, not by EPIPE errors).
    import signal

    for name in ("SIGPIPE", "SIGXFSZ"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)


def exec_command(argv: list[str], env: dict) -> int:
    """Replace this process with argv; only returns (an exit status) when exec fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    _restore_signals()
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        where = "" if "/" in argv[0] else f" on PATH={env.get('PATH', '')}"
        _say(f"error: command not found: {argv[0]!r}{where}")
        return EXIT_NOT_FOUND
    except PermissionError:
        _say(f"error: cannot execute {argv[0]!r}: permission denied (is it executable? a directory?)")
        return EXIT_NOT_EXECUTABLE
    except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument or the environment
        _say(f"error: cannot execute {argv[0]!r}: {getattr(exc, 'strerror', None) or exc}")
        return EXIT_NOT_EXECUTABLE
    return EXIT_NOT_EXECUTABLE  # not reached: exec does not return


def default_command(env: dict) -> list[str]:
    return ["bash"] if _find_bash(env) else ["sh"]


def prepare(env: dict, debug: bool) -> tuple[dict, bool]:
    """Steps 1-4: the environment to exec with, and False when TRAINBOX_CHECK=strict refuses to start."""
    from .manifest import ManifestError, load_manifest

    manifest, manifest_error = None, None
    try:
        manifest = load_manifest()
    except ManifestError as exc:
        manifest_error = str(exc)
        _say(f"warning: {exc}; starting without the stack's environment defaults")

    skipped: list[str] = []
    applied = apply_defaults(env, manifest, skipped)
    if skipped and _check_mode(env) == "strict":
        _say("refusing to start: the stack manifest holds invalid env entries and TRAINBOX_CHECK=strict")
        return env, False
    env, scripts, changed = apply_cann_env(env)
    if debug:
        _say(f"defaults applied: {', '.join(applied) or 'none'}; sourced: {', '.join(scripts) or 'none'}; "
             f"set by the scripts: {', '.join(sorted(changed)) or 'none'}")

    mode = _check_mode(env)
    if mode != "off" and not run_checks(env, manifest, manifest_error, strict=mode == "strict"):
        return env, False
    return env, True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        sys.stdout.write(HELP)
        return 0
    if argv[:1] == ["--"]:
        argv = argv[1:]
    env = dict(os.environ)
    debug = env.get("TRAINBOX_DEBUG") == "1"
    # The entrypoint must never be the reason a command does not run: whatever goes wrong while preparing
    # the environment is a warning, and the command starts with the environment it was given. Only
    # TRAINBOX_CHECK=strict turns a problem into a refusal.
    try:
        env, ok = prepare(dict(env), debug)
    except Exception as exc:  # noqa: BLE001 - see above
        if _check_mode(env) == "strict":
            _say(f"refusing to start: preparing the environment failed ({type(exc).__name__}: {exc}) and "
                 "TRAINBOX_CHECK=strict")
            return EXIT_CHECK_FAILED
        _say(f"warning: preparing the environment failed ({type(exc).__name__}: {exc}); starting the command "
             "with the environment it was given")
        env, ok = dict(os.environ), True
    if not ok:
        return EXIT_CHECK_FAILED

    if not argv:
        argv = default_command(env)
    if debug:
        _say(f"exec {argv!r}")
    return exec_command(argv, env)


if __name__ == "__main__":
    sys.exit(main())
