from __future__ import annotations

from django.contrib import admin
from django.urls import path

from broker import views

urlpatterns = [
    path("_status", views.status, name="status"),
    path("admin/", admin.site.urls),
]
