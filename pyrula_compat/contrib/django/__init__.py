"""``celery.contrib.django``: ``DjangoTask`` (``delay_on_commit``)."""
