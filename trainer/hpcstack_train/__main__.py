"""``python -m hpcstack_train``: run the trainer (:func:`hpcstack_train.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
