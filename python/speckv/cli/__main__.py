"""``python -m speckv.cli``: the ``speckv`` command."""

from . import main

main()
