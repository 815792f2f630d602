"""``python -m longseq`` runs the command line (also under ``torchrun``)."""

import sys

from longseq.cli import main

sys.exit(main())
