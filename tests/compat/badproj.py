"""An app that asks for pickle: the worker refuses to start."""

from pyrula_compat import Celery

app = Celery("badproj", broker="memory://")
app.conf.task_serializer = "pickle"


@app.task
def noop():
    return None
