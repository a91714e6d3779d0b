"""``python -m flightstore`` runs the CLI."""

from flightstore.cli import main

main()
