"""Operating deployments: what the commands do to jobs that exist (submit, status, list,
logs, cancel, scale, upgrade, bench, report, in an allocation). Every command runs
through one runner (hpcserve.slurm.runner: local or over SSH) and reads a deployment's
jobs through deployment_jobs. To add a command: its operation here over a runner,
its click command in hpcserve/cli.py, and a row in cli.py's help headings."""
