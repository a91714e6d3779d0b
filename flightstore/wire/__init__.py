"""Wire formats shared by clients and servers (a client imports these, never ``server/``).

:mod:`.lookups` is the lookup stream's message format. (The Flight SQL protocol messages and the
ticket payloads still live in ``flightstore.server.protocol`` and ``flightstore.server.tickets``.)
"""
