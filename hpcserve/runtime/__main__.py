"""`python3 -m hpcserve_runtime run JOBDIR | discover ... | stage ...`: the in-job runtime's entry point."""

import sys

if sys.argv[1:2] == ["discover"]:
    # Every node's discovery step: its own module, not the orchestrator's whole package.
    from .discovery import main

    sys.exit(main(sys.argv[2:]))

if sys.argv[1:2] == ["stage"]:
    # Every node's stage step (model.stage), likewise without the orchestrator.
    from .stage import main

    sys.exit(main(sys.argv[2:]))

from .job import main  # noqa: E402

sys.exit(main())
