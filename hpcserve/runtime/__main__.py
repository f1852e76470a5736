"""`python3 -m hpcserve_runtime run JOBDIR | discover ...`: the in-job runtime's entry point."""

import sys

from .job import main

sys.exit(main())
