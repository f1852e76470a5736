"""The one seam that runs commands: runner.py here, ssh.py over SSH, client.py for sbatch's
output. Every operator command runs Slurm through a Runner; a test or a site injects another.
To add a Slurm query: its parser in hpcserve/runtime/slurm_*.py (shared with the job), its call
through Runner.run(), which asks again while the controller does not answer."""
