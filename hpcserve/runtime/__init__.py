"""hpcserve's in-job runtime: what runs inside the Slurm job, stdlib only (Python 3.7+).

The renderer copies this package into every job directory as the folder `hpcserve_runtime/`
(readable there beside the scripts that call it), and job.sbatch runs `python3 -m
hpcserve_runtime run JOBDIR`: the nodes need python3, not an installed hpcserve. Modules import
one another relatively and nothing of hpcserve, so the same files work in both places.
"""
