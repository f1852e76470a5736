"""hpcserve's in-job runtime: what runs inside the Slurm job, stdlib only (Python 3.7+).

The renderer copies this package into every job directory as the folder `hpcserve_runtime/`
(readable there beside the scripts that call it), and job.sbatch runs `python3 -m
hpcserve_runtime run JOBDIR`: the nodes need python3, not an installed hpcserve. Modules import
one another relatively and nothing of hpcserve, so the same files work in both places.

job.py is the timeline and the serving loop; each concern is a module of one class that the
loop ticks. To add a concern: its module here, built in `Job.__init__`, ticked at its place in
`Job.tick()`; it reads and changes instances through table.py and reports what another
concern must act on as an event (events.py), never by calling that concern
(tests/unit/test_concern_cycles.py). A new failure kind goes in failures.py, a job state in
slurm_jobs.py, a plan.json key in contract.py's spec version, plan_json.py's schema and spec.py's
view (the runtime reads plan.json only through spec.py's attributes).
"""
