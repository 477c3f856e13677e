"""`python -m cocoviz.cli`."""

from cocoviz.cli import entry

entry()
