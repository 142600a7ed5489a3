"""``python -m torchrecord``: the same command line as the ``torchrecord`` script."""

from torchrecord.cli import main

raise SystemExit(main())
