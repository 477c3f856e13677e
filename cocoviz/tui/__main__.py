"""`python -m cocoviz.tui [FILE]`: the same as `cocoviz tui`."""

import sys

from cocoviz.cli import main

sys.exit(main(["tui", *sys.argv[1:]]) if sys.argv[1:] else main([]))
