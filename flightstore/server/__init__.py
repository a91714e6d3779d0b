"""The Flight SQL server: wire messages (protocol), metadata answers, service and auth."""
