"""Run a Python program with arguments whose values are secrets, without putting them on its
command line: /proc/PID/cmdline, which `ps` shows every user of the node, keeps the words this
process was started with, while the program reads the secrets in sys.argv as if they were there.

    HPCSERVE_SECRET_ARGS='--api-key KEY_VAR' python3 secret_argv.py -m MODULE ARGS...
    HPCSERVE_SECRET_ARGS='--api-key KEY_VAR' python3 secret_argv.py SCRIPT ARGS...

HPCSERVE_SECRET_ARGS names each flag and the environment variable that holds its value (names
only: the launch script exports it); the value is read here and appended to ARGS. The program
runs in this process (runpy), so its PID is the one the launch script exec'd. Standard library
only: it ships in the job directory (hpcserve_runtime/) and runs with the engine's or router's
own Python.
"""

import os
import runpy
import sys

VAR = "HPCSERVE_SECRET_ARGS"


def secret_args(spec: str, env) -> list:
    """['FLAG=value', ...] for 'FLAG NAME FLAG NAME...'; SystemExit naming an unset variable
    (never a value). One word per flag: a value of its own would be taken for an option by
    argparse if it began with '-' (a key the user chose may)."""
    words = spec.split()
    if len(words) % 2:
        raise SystemExit(f"hpcserve: {VAR} must name FLAG VARIABLE pairs, not {spec!r}")
    out = []
    for flag, name in zip(words[::2], words[1::2]):
        value = env.get(name)
        if value is None:
            raise SystemExit(f"hpcserve: {name} is not set in this task's environment: "
                             f"{flag} takes its value from it")
        out.append(f"{flag}={value}")
    return out


def main() -> None:
    extra = secret_args(os.environ.pop(VAR, ""), os.environ)
    args = sys.argv[1:]
    if args[:1] == ["-m"] and len(args) > 1:
        sys.argv = [args[1], *args[2:], *extra]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args:
        sys.argv = [*args, *extra]
        runpy.run_path(args[0], run_name="__main__")
    else:
        raise SystemExit("usage: secret_argv.py (-m MODULE | SCRIPT) ARGS...")


if __name__ == "__main__":
    main()
