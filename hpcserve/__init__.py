"""hpcserve: serve the largest open LLMs on Slurm from one YAML file."""

__version__ = "0.1.0"
