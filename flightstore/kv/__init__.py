"""The primary-key store over RocksDB: key/value encoding, tablets, merge engines, recovery."""
