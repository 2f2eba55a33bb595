"""`python -m layerdescent.cli`: the same as the `layerdescent` command."""

import sys

from layerdescent.cli import main

sys.exit(main())
