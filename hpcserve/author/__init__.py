"""Authoring: a deployment file -> a job directory, on the user's machine, without Slurm.

config (with schema, yamlsrc, values) reads and checks the deployment file, its site and
model profile; plan turns them into components, instances, nodes, ports and argv through
the engine adapters (hpcserve.engines); plan_json writes the job's spec; render writes the
job directory (templates, containers). Nothing here runs a command or talks to Slurm:
golden files test it (tests/golden/). To add a setting: config.py's dataclass, then
the plan step that reads it, then plan_json if the runtime needs it."""
