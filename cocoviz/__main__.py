"""`python -m cocoviz`."""

from cocoviz.cli import entry

entry()
