"""`python -m or1.cli`: the `or1` command."""

from or1.cli import main

main()
