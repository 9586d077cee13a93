"""A task module only some workers import (for send_task of an unregistered name)."""

from proj.celery import app


@app.task(name="proj.extra.shout")
def shout(text):
    return text.upper() + "!"
