"""`python -m kimi_batch.cli`: the `kimi-batch` command."""

import sys

from kimi_batch.cli.commands import main

sys.exit(main())
