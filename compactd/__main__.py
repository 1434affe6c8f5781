"""`python -m compactd`: the same CLI as the `compactd` console script."""

from compactd.cli import main

main()
