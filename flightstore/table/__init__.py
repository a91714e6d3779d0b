"""A table's behaviour, one module per path, mixed into :class:`flightstore.store.Table`.

``validation`` checks a write against the schema, ``writes`` routes it to the buckets once per writer
batch, ``reads`` answers lookups and scans, ``changelog`` reads and follows the buckets' changes.
``flightstore.store.Table`` keeps the buckets themselves (opening, schema evolution, retention,
snapshots, closing).
"""
