"""``python -m latebandit``: the ``latebandit`` command, for environments without its script on the PATH."""

from latebandit.cli import main

main()
