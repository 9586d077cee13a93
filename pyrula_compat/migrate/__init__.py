"""Moving a live Celery deployment onto pyrula: ``pyrula migrate celery`` adopts the
messages of a Celery Redis broker as durable runs (:mod:`.adoption`, reading the broker
through :mod:`.broker` and decoding each message with :mod:`.messages`).

Nothing here is imported by a worker or a client: only the migrate commands use it.
"""
