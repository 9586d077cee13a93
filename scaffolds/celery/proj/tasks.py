"""Tasks, written as for Celery."""

from pyrula_compat import shared_task

from .celery import app


@app.task
def add(x, y):
    return x + y


@shared_task
def tsum(numbers):
    return sum(numbers)


# Fails once, then Celery's retry rules run it again under the same task id.
@app.task(bind=True, autoretry_for=(ConnectionError,), retry_kwargs={"countdown": 0.1},
          max_retries=2)  # fmt: skip
def send_welcome(self, user_id):
    if self.request.retries == 0:
        raise ConnectionError("provider unreachable")
    return {"sent_to": f"user-{user_id}@example.com", "retries": self.request.retries}
