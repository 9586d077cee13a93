"""A Django project whose tasks use Django's task framework, with pyrula as its backend."""
