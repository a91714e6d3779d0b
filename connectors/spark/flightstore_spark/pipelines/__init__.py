"""Streaming pipelines built on the flightstore connector; each runs from the command line
(``python -m flightstore_spark.pipelines.<name> --help``)."""
