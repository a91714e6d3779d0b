"""SQLAlchemy dialect (``flightstore://host:port[/database]``) and Superset engine spec for
flightstore, over the ADBC Flight SQL driver.

Installed with ``pip install 'flightstore[sqlalchemy]'`` (entry points ``sqlalchemy.dialects`` and
``superset.db_engine_specs``). This package imports neither flightstore's storage nor its server:
a BI tool's environment needs only SQLAlchemy and ``adbc-driver-flightsql``.
"""

from flightstore_sqlalchemy.dialect import FlightstoreDialect

__all__ = ["FlightstoreDialect"]
