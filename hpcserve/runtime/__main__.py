"""`python3 -m hpcserve_runtime run JOBDIR | discover ... | stage ...`: the in-job runtime's
entry point. `run` is the orchestrator (job.py); a node's discovery and stage steps run their
own module, not the orchestrator's whole package."""

import argparse
import sys


def refuse(job_dir: str, why: str) -> int:
    """An incompatible job directory: say so in state.json and the log, start nothing."""
    from .failures import INCOMPATIBLE
    from .state import State, now
    sys.stderr.write(f"hpcserve_runtime: {why}\n")
    try:
        State(job_dir).update("failed", reason=why, finished_at=round(now(), 3),
                              failure={"reason": INCOMPATIBLE})
    except OSError:
        pass
    return 2


def main(argv: "list[str] | None" = None) -> int:
    from .contract import SpecError
    from .discovery import cmd_discover, discover_args
    from .job import Job
    ap = argparse.ArgumentParser(prog="python3 -m hpcserve_runtime")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="orchestrate the deployment (called by job.sbatch)")
    r.add_argument("job_dir")
    discover_args(sub.add_parser("discover", help="print this node's address line"))
    a = ap.parse_args(argv)
    if a.cmd == "discover":
        return cmd_discover(a)
    try:
        job = Job(a.job_dir)
    except SpecError as e:
        return refuse(a.job_dir, str(e))
    return job.run()


if __name__ == "__main__":
    if sys.argv[1:2] == ["discover"]:
        from .discovery import main as discover

        sys.exit(discover(sys.argv[2:]))
    if sys.argv[1:2] == ["stage"]:
        from .stage import main as stage

        sys.exit(stage(sys.argv[2:]))
    sys.exit(main())
