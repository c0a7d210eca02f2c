"""Settings of the example shop: a Django project of its own with Leasecast installed.

What Leasecast needs is marked "Leasecast:"; everything else is what
``django-admin startproject`` writes. SQLite by default (a file beside this
project), PostgreSQL when ``DATABASE_URL`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "example-shop-not-a-secret")
DEBUG = os.environ.get("SHOP_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Leasecast: Channels, the broker's models and commands, and (optional)
    # the operators' live page with its admin pages.
    "channels",
    "gateway",
    "dashboard",
    # The shop's own app.
    "orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shop.urls"
ASGI_APPLICATION = "shop.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The queue lives in this database: a message commits or rolls back with the
# order it is about.
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'shop.sqlite3'}", conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Leasecast: on SQLite, WAL (readers never wait for the writer) and
    # BEGIN IMMEDIATE (a transaction takes the write lock when it starts, so
    # two writers queue up instead of failing with "database is locked").
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }

# Leasecast: django.tasks (Django 6) or the django-tasks package (Django 5.2)
# run through Leasecast queues; `python manage.py leasecast_worker` runs them.
TASKS = {
    "default": {
        "BACKEND": "gateway.tasks.LeasecastBackend",
        "QUEUES": ["default", "emails"],
    }
}

# Leasecast: every GATEWAY_* setting is optional (docs/tasks.md lists them).
GATEWAY_BLOCK_WAIT = 5.0

# Leasecast: the key of the signed tokens the packing page gets (scoped to its
# task's topic; gateway.tokens.signed_token). Set a long random one in production.
GATEWAY_SIGNING_KEY = os.environ.get("SHOP_SIGNING_KEY", "example-shop-signing-key-not-a-secret")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
