"""Reached only through the URLconf: the worker imports it when it runs Django's checks."""

from django.http import HttpResponse

from pyrula_compat import shared_task


@shared_task
def from_urlconf(text):
    return f"view module says {text}"


def ping(request):
    return HttpResponse("pong")
