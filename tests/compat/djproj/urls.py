from django.urls import path
from shop import views

urlpatterns = [path("ping/", views.ping)]
