"""The web console: a server's databases, tables, buckets, lake, cluster, rates and running
queries, served by the server itself on ``--console-port`` (option ``console.port``).

:mod:`.server` serves the pages and the JSON API and tells who is asking (:mod:`.sessions`: login
cookies and HTTP Basic, the Flight endpoint's users); :mod:`.views` gathers what a caller may see
through the server's own checks; :mod:`.rates` keeps the last hour of the server's metrics for the
plots. The pages (``static/``) are plain HTML and JavaScript: no build step, nothing fetched from
elsewhere.
"""

from flightstore.console.server import Console

__all__ = ["Console"]
