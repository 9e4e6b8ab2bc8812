"""Settings for Runcrate Clusters, read from the environment with embedded defaults.

With nothing set, the product runs on a laptop: SQLite and an embedded (filesystem) Celery
broker under RUNCRATE_VAR_DIR, mail written as files, and a development secret key generated
into the same folder. Production sets DATABASE_URL, REDIS_URL, SECRET_KEY and DEBUG=false.
"""

import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from runcrate.env import (
    env_bool,
    env_decimal,
    env_float,
    env_int,
    env_list,
    env_str,
    redis_database,
)

BASE_DIR = Path(__file__).resolve().parent.parent

VAR_DIR = Path(env_str("RUNCRATE_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _dev_secret_key() -> str:
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env_bool("DEBUG", True)
# The secret key signs sessions and password-reset links and derives the agents' tokens. With
# DEBUG off it comes from the environment, the same for every process: a key made up on the
# spot (the laptop's var/secret_key) would differ from one machine to the next.
if not DEBUG and not env_str("SECRET_KEY"):
    raise ImproperlyConfigured(
        "SECRET_KEY must be set when DEBUG is off: a long random secret, the same for every "
        "process, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )
SECRET_KEY = env_str("SECRET_KEY") or _dev_secret_key()
# Former keys, comma-separated, while a rotation settles: what they signed stays valid
# (sessions, reset links) and so do the agents' tokens derived from them (docs/security.md).
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS")
# `testserver` (Django's test client) is added by the test runner itself, never here.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
SITE_URL = env_str("SITE_URL", f"http://localhost:{env_int('PORT', 8000, minimum=1)}").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "anymail",
    # Two-factor sign-in: TOTP devices and recovery codes (accounts/otp.py).
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    # Listed so the API's docs page serves Swagger UI from our static files, not a CDN.
    "ninja",
    "runcrate",
    "accounts",
    "offers",
    "clusters",
    "billing",
    "notifications",
    "audit",
    # The project package last: it imports every app, and holds the `seed_demo` command.
    "config",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "runcrate.csp.ContentSecurityPolicy",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Every error under /api/v1/ as the envelope, whatever made it; then no NUL in any input.
    "runcrate.api.EnvelopeMiddleware",
    "runcrate.middleware.RefuseControlCharacters",
    # The database or the broker not answering is a 503, never a 500 (runcrate/outages.py).
    "runcrate.middleware.AnswerOutages",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "accounts.middleware.ProjectMiddleware",
    # One audit entry per state-changing request, after its view (audit/middleware.py).
    "audit.middleware.AuditMiddleware",
    # A member of a project that requires two-factor sign-in sets it up before any other page.
    "accounts.middleware.TwoFactorRequired",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "runcrate.context_processors.navigation",
                "offers.context_processors.cluster_sizes",
                "offers.context_processors.network_terms",
                "billing.context_processors.balance",
                "accounts.context_processors.abilities",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
# Django's own type (global_settings), a plain dict for both: dj_database_url's TypedDict
# would refuse the laptop's Path-valued NAME, which Django accepts.
DATABASES: dict[str, dict[str, Any]]
if DATABASE_URL:
    # Connections are kept a minute, and checked before a request reuses one: a connection the
    # server dropped meanwhile (a restart, a killed backend, a failover) is replaced, not
    # handed to the request to fail on. Losing it mid-request is a 503 (runcrate/outages.py).
    DATABASES = {
        "default": dict(
            dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
        )
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "db.sqlite3",
            # Web, worker and beat share the file: wait for locks instead of failing, and take
            # the write lock at BEGIN so two writers never deadlock on an upgrade.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": VAR_DIR / "test.sqlite3"},
        }
    }
IS_POSTGRES = DATABASES["default"]["ENGINE"].endswith("postgresql")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- accounts -------------------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
# Logins, sign-ups and password resets are rate-limited per account and per client address
# (accounts/throttle.py, django-ratelimit, in the cache). Behind a proxy, the header it adds
# the client's address to, e.g. X-Forwarded-For (its last entry counts); empty: REMOTE_ADDR.
RUNCRATE_CLIENT_IP_HEADER = env_str("RUNCRATE_CLIENT_IP_HEADER")
# Fail closed: limits that cannot be counted (the cache does not answer) refuse the attempt
# with a 503, rather than let unlimited password guesses through (docs/security.md). They count
# in the `limits` cache: the same Redis as the default cache, but one that raises when Redis
# does not answer, where the default one forgives.
RATELIMIT_FAIL_OPEN = False
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "clusters:list"
# The name authenticator apps show beside a two-factor code (accounts/otp.py).
OTP_TOTP_ISSUER = "Runcrate"
LOGOUT_REDIRECT_URL = "accounts:login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- static files: served by the product itself (whitenoise), nothing from outside ----------
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# DEBUG off (`make serve`, the Procfile): what `collectstatic` left in STATIC_ROOT, under hashed
# names, compressed, cached for a year. DEBUG on (`make run`, tests): the source folders as they
# are, so nothing needs collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

# --- cache (rate limits) --------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
# The cache and the broker on separate Redis databases (Django's cache.clear() flushes its whole
# database, queued tasks included): the broker on REDIS_URL's database, the cache on the next
# one unless REDIS_CACHE_URL names another.
REDIS_CACHE_URL = env_str("REDIS_CACHE_URL") or (redis_database(REDIS_URL, 1) if REDIS_URL else "")
CACHES: dict[str, dict[str, Any]]  # Django's type (global_settings): any backend's keys
if REDIS_URL:
    CACHES = {
        "default": {
            # Redis's own backend, but a cache that is down is a miss, never an error page
            # (runcrate/cache.py): the product runs on without its rate limits and markers.
            "BACKEND": "runcrate.cache.ForgivingRedisCache",
            "LOCATION": REDIS_CACHE_URL,
            "KEY_PREFIX": env_str("RUNCRATE_CACHE_PREFIX", "runcrate"),
            # A hung Redis (paused, half-open) fails each call within a second, and the
            # forgiving cache then skips it a moment, rather than making every call wait.
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    # The rate limits' counts (accounts/throttle.py): Django's own Redis backend, which raises
    # when Redis does not answer, so the limits fail closed instead of counting nothing.
    CACHES["limits"] = {
        **CACHES["default"],
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
    }
    RATELIMIT_USE_CACHE = "limits"
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": VAR_DIR / "cache",
        }
    }
    RATELIMIT_USE_CACHE = "default"  # files: an error is raised, never forgiven

# --- Celery -------------------------------------------------------------------------------
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {
        # An unacknowledged message (its worker died) is handed back after this long: longer
        # than any task may run (clusters.lifecycle.rules.LONGEST_WORK_SECONDS, a test says
        # so). Work whose worker died is handed out again sooner by the tick, under a new lease.
        "visibility_timeout": 2 * 60 * 60 + 600,
        # A hung broker fails a publish within seconds (the create answers, the tick hands the
        # work out later), not after redis-py's default of waiting forever. The read timeout
        # stays above kombu's 1 s BRPOP, which a consumer's read waits through by design.
        "socket_connect_timeout": 1,
        "socket_timeout": 2,
        "retry_on_timeout": False,
    }
else:
    # kombu's filesystem transport with atomic writes (runcrate/broker.py): one file per
    # message. It does not create its folders, and without `control_folder` it writes its
    # exchange tables to ./control of whatever directory the process started in.
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "runcrate-fs://localhost//"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # How often a worker looks for new files (default 1 s): a cluster's steps hand work
        # on several times, and each hand-off waits for the next look.
        "polling_interval": 0.25,
    }
# Remote control (`celery inspect`, broadcast) fans a message out to a queue per worker; on
# the filesystem broker the queue of a worker that has gone stays behind and fills up.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = bool(REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
# Acknowledged when done, and handed back when the worker process dies mid-task: every task is
# safe to run twice (clusters/tasks.py: leases, row locks, tokens).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Per-machine work (bootstraps, installs, wipes, network tests: seconds to minutes) has its own
# queue and worker, so it never delays `advance`, the tick and the meter on the default queue.
# A worker started without -Q consumes both (tests, a one-process deployment); `make run` and
# production run one worker per queue (docs/architecture.md, "Workers and queues").
CELERY_TASK_DEFAULT_QUEUE = "celery"
# Two more queues hold work whose other end is someone else's: a tenant's host (`logs`: reading a
# node's logs or the head's jobs) and a customer's webhook receiver or Slack (`notifications`).
# Each is bounded by a deadline, and each has its own worker, so a slow or hostile other end
# fills only its own queue, never the one that starts and stops other customers' machines.
CELERY_TASK_QUEUES = (
    Queue("celery", routing_key="celery"),
    Queue("machines", routing_key="machines"),
    Queue("releases", routing_key="releases"),
    Queue("logs", routing_key="logs"),
    Queue("notifications", routing_key="notifications"),
)
CELERY_TASK_ROUTES = {
    "clusters.tasks.node_work": {"queue": "machines"},
    "clusters.tasks.network_test": {"queue": "machines"},
    # A host's release after its cluster (stop, wipe, reimage, verify: minutes) on a queue and
    # worker of its own, so a big cluster's release never holds another cluster's steps.
    "clusters.tasks.release_work": {"queue": "releases"},
    # A node's logs or the head's jobs, read over SSH (clusters/telemetry/logs.py): a tenant's host.
    "clusters.tasks.fetch_logs": {"queue": "logs"},
    # Webhook and Slack deliveries (notifications/delivery.py): a customer's receiver.
    "notifications.tasks.send_notifications": {"queue": "notifications"},
}
# A publish that fails (the broker is down) fails fast: the caller records what happened, and
# the tick hands the work out again once the broker is back (clusters/lifecycle/dispatch.py).
CELERY_BROKER_CONNECTION_TIMEOUT = 1
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5}
CELERY_TASK_ALWAYS_EAGER = env_bool("RUNCRATE_TASKS_EAGER", False)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# How many hosts the `releases` worker releases at once (its threads, when started without
# --concurrency: config/celery.py); the hosts of a big cluster go back side by side up to this.
RUNCRATE_RELEASE_CONCURRENCY = env_int("RUNCRATE_RELEASE_CONCURRENCY", 8, minimum=1)
# The one beat scheduler's periodic tasks; each app adds its own entries here.
CELERY_BEAT_SCHEDULE: dict[str, dict] = {}
# Modules with tasks that autodiscovery (each app's tasks.py) does not find.
CELERY_IMPORTS = ["clusters.notifications", "clusters.lifecycle.stops"]
# Cluster emails (ready, failed, degraded) from the event outbox, clusters/notifications.py.
CELERY_BEAT_SCHEDULE["cluster-emails"] = {
    "task": "clusters.notifications.send_cluster_emails_task",
    "schedule": 10.0,
}

# Webhooks and Slack from the same events (notifications/, docs/notifications.md): new events
# become deliveries, due ones are sent and retried. Webhook URLs must resolve to public
# addresses unless this is set (tests and the demo set it).
RUNCRATE_WEBHOOKS_ALLOW_PRIVATE = env_bool("RUNCRATE_WEBHOOKS_ALLOW_PRIVATE", False)
CELERY_BEAT_SCHEDULE["notifications"] = {
    "task": "notifications.tasks.send_notifications",
    "schedule": 5.0,
}

# --- Runcrate -----------------------------------------------------------------------------
RUNCRATE_TICK_SECONDS = env_float("RUNCRATE_TICK_SECONDS", 2.0)
RUNCRATE_MIN_STEP_SECONDS = env_int("RUNCRATE_MIN_STEP_SECONDS", 30, minimum=1)
# The reconciler's beat: advance every cluster with something to do (clusters/tasks.py).
CELERY_BEAT_SCHEDULE["clusters-tick"] = {
    "task": "clusters.tasks.tick",
    "schedule": RUNCRATE_TICK_SECONDS,
}
# The `machines` queue's heartbeat, as often as the tick and on that queue: it runs only while
# the beat, the broker and a machines worker all run, so its Beat row says when our machinery
# for the machines was down (step deadlines do not count that time; /readyz names the worker).
# A message that waited ten periods is dropped: the next one says more.
CELERY_BEAT_SCHEDULE["machines-heartbeat"] = {
    "task": "clusters.tasks.machines_heartbeat",
    "schedule": RUNCRATE_TICK_SECONDS,
    "options": {"queue": "machines", "expires": 10 * RUNCRATE_TICK_SECONDS},
}
# The `releases` queue's heartbeat, the same way: /readyz names the releases worker when it is
# missing (hosts of ended clusters would never come back).
CELERY_BEAT_SCHEDULE["releases-heartbeat"] = {
    "task": "clusters.tasks.releases_heartbeat",
    "schedule": RUNCRATE_TICK_SECONDS,
    "options": {"queue": "releases", "expires": 10 * RUNCRATE_TICK_SECONDS},
}
# A beat is overdue on /readyz after several of its periods, and never sooner than this.
RUNCRATE_BEAT_OVERDUE_MIN_SECONDS = env_float("RUNCRATE_BEAT_OVERDUE_MIN_SECONDS", 60.0)
CELERY_BEAT_SCHEDULE["hosts-sweep"] = {"task": "clusters.tasks.sweep_hosts", "schedule": 300.0}
# Idempotency-Key records are kept 24 hours (clusters/idempotency.py); this deletes older ones.
CELERY_BEAT_SCHEDULE["idempotency-keys"] = {
    "task": "clusters.tasks.forget_idempotency_keys",
    "schedule": 3600.0,
}
RUNCRATE_METER_SECONDS = env_float("RUNCRATE_METER_SECONDS", 60.0)
# How many days of all a project's storage its balance must cover to create a volume
# (clusters/volumes.py): volumes are never deleted for lack of balance, so storage debt stops here.
RUNCRATE_VOLUME_PREPAID_DAYS = env_int("RUNCRATE_VOLUME_PREPAID_DAYS", 7, minimum=1)
# The meter charges usage and storage, then stops what the balance or a budget no longer covers
# (clusters/lifecycle/stops.py: billing says which projects and environments are over).
CELERY_BEAT_SCHEDULE["billing-meter"] = {
    "task": "clusters.stops.run_meter",
    "schedule": RUNCRATE_METER_SECONDS,
}
RUNCRATE_SIM_SPEED = env_float("RUNCRATE_SIM_SPEED", 1.0)

# Real machines (the ssh driver, docs/drivers.md). Agents reach the dashboard at
# RUNCRATE_AGENT_URL; the operator's key lives in RUNCRATE_SSH_KEY_FILE (made on first use).
RUNCRATE_AGENT_URL = env_str("RUNCRATE_AGENT_URL", SITE_URL).rstrip("/")
RUNCRATE_SSH_KEY_FILE = Path(
    env_str("RUNCRATE_SSH_KEY_FILE", str(VAR_DIR / "ssh" / "id_ed25519"))
).resolve()
RUNCRATE_SSH_CONNECT_SECONDS = env_float("RUNCRATE_SSH_CONNECT_SECONDS", 10.0)
RUNCRATE_SSH_COMMAND_SECONDS = env_float("RUNCRATE_SSH_COMMAND_SECONDS", 600.0)
# The most output the dashboard reads of one command on a host (a tenant's: clusters/machines/
# ssh.py Session.run); past it the command is closed. A log read takes less (its own cap).
RUNCRATE_SSH_OUTPUT_BYTES = env_int("RUNCRATE_SSH_OUTPUT_BYTES", 16 * 1024 * 1024, minimum=1024)
# How long a host's reimage command may run, and then how long the host has to answer again.
RUNCRATE_REIMAGE_SECONDS = env_float("RUNCRATE_REIMAGE_SECONDS", 900.0)
# How long one read of a host (a baseline, the check before reuse) may take in all; past it the
# host is not verified and stays dirty (clusters/machines/pristine.py).
RUNCRATE_VERIFY_SECONDS = env_float("RUNCRATE_VERIFY_SECONDS", 600.0)
# Where hosts fetch k3s (Kubernetes on ssh hosts): a release's folder, upstream or a mirror of it
# (`k3s`, `sha256sum-amd64.txt`, the air-gap images).
RUNCRATE_K3S_URL = env_str(
    "RUNCRATE_K3S_URL", "https://github.com/k3s-io/k3s/releases/download/v1.32.3%2Bk3s1"
).rstrip("/")
# A node of a ready or degraded cluster silent this long is lost; the watch runs this often.
RUNCRATE_HEARTBEAT_LOST_SECONDS = env_int("RUNCRATE_HEARTBEAT_LOST_SECONDS", 180, minimum=1)
CELERY_BEAT_SCHEDULE["clusters-heartbeats"] = {
    "task": "clusters.tasks.watch_heartbeats",
    "schedule": 30.0,
}
# Repair (clusters/lifecycle/repair.py, docs/lifecycle.md "Repair"): a cluster whose repair
# policy is `auto` replaces a worker that stays unhealthy this long (a lost one at once), at most
# this many replacements per cluster in any 24 hours; a replacement is never drawn from a host
# quarantined (lost, or replaced as unhealthy) in the last this many days.
RUNCRATE_REPAIR_GRACE_SECONDS = env_int("RUNCRATE_REPAIR_GRACE_SECONDS", 300, minimum=0)
RUNCRATE_AUTO_REPAIRS_PER_DAY = env_int("RUNCRATE_AUTO_REPAIRS_PER_DAY", 3, minimum=0)
RUNCRATE_QUARANTINE_DAYS = env_int("RUNCRATE_QUARANTINE_DAYS", 30, minimum=0)
CELERY_BEAT_SCHEDULE["clusters-repairs"] = {
    "task": "clusters.tasks.auto_repair",
    "schedule": 30.0,
}
# How often the agent of a ready (or degraded) cluster's node adds a health report to its
# heartbeat: the peers it reaches, its services, /shared (clusters/telemetry/health.py).
RUNCRATE_HEALTH_SECONDS = env_int("RUNCRATE_HEALTH_SECONDS", 120, minimum=1)
# How often the agent of a ready (or degraded) cluster's live node posts a metrics report: its
# GPUs' and its own figures (clusters/telemetry/metrics.py, docs/metrics.md). The beat rolls the raw
# samples up per minute and per hour, and prunes them.
RUNCRATE_METRICS_SECONDS = env_int("RUNCRATE_METRICS_SECONDS", 15, minimum=1)
CELERY_BEAT_SCHEDULE["metrics-minutes"] = {
    "task": "clusters.tasks.roll_up_metrics_minutes",
    "schedule": 60.0,
}
CELERY_BEAT_SCHEDULE["metrics-hours"] = {
    "task": "clusters.tasks.roll_up_metrics_hours",
    "schedule": 3600.0,
}
# The idle notice (clusters/telemetry/idle.py, docs/metrics.md): every GPU of a ready cluster below
# this
# utilisation for this long is told ("GPUs idle", an email once per idle period); nothing stops.
RUNCRATE_IDLE_GPU_PERCENT = env_float("RUNCRATE_IDLE_GPU_PERCENT", 5.0)
RUNCRATE_IDLE_GPU_MINUTES = env_float("RUNCRATE_IDLE_GPU_MINUTES", 30.0)
CELERY_BEAT_SCHEDULE["idle-gpus"] = {
    "task": "clusters.tasks.notice_idle_gpus",
    "schedule": 60.0,
}
# The simulated data center's machines report metrics as often as a real agent would.
CELERY_BEAT_SCHEDULE["simulated-metrics"] = {
    "task": "clusters.tasks.simulate_metrics",
    "schedule": float(RUNCRATE_METRICS_SECONDS),
}
# The track record per machine type (docs/offers.md, "Track record"): shown from this many
# clusters in the last 30 days on, refreshed from the clusters' events by the beat.
RUNCRATE_TRACK_RECORD_MIN_CLUSTERS = env_int("RUNCRATE_TRACK_RECORD_MIN_CLUSTERS", 5, minimum=1)
CELERY_BEAT_SCHEDULE["track-records"] = {
    "task": "clusters.tasks.refresh_track_records",
    "schedule": 300.0,
}
# Acceptance: a worker whose own measured bandwidth to node-0 is below this fraction of its
# machine type's expected link (`link_mbit`), or below the floor, fails the cluster.
RUNCRATE_ACCEPTANCE_LINK_FRACTION = env_float("RUNCRATE_ACCEPTANCE_LINK_FRACTION", 0.25)
RUNCRATE_ACCEPTANCE_MIN_MBIT = env_float("RUNCRATE_ACCEPTANCE_MIN_MBIT", 50.0)
RUNCRATE_SALES_EMAIL = env_str("RUNCRATE_SALES_EMAIL", "sales@runcrate.localhost")
RUNCRATE_MIN_BALANCE = env_decimal("RUNCRATE_MIN_BALANCE", "10.00")
RUNCRATE_QUOTE_RATE_LIMIT = env_int("RUNCRATE_QUOTE_RATE_LIMIT", 5, minimum=1)  # per hour
RUNCRATE_FERNET_KEYS = env_list("RUNCRATE_FERNET_KEYS")

# Who sells, printed at the top of every invoice (billing/invoices.py): lines separated by "|",
# the first the company's name, e.g. "Runcrate Clusters Inc.|1 Main St|Springfield|VAT EU123".
RUNCRATE_INVOICE_SELLER = [
    line.strip()
    for line in env_str(
        "RUNCRATE_INVOICE_SELLER", "Runcrate Clusters|support@runcrate.localhost"
    ).split("|")
    if line.strip()
]
# Last month's invoice emails, on the 1st (UTC) from 06:30, hourly that day: once per project and
# month whatever runs again, and late enough that the meter charged the month's last hour.
CELERY_BEAT_SCHEDULE["invoice-emails"] = {
    "task": "billing.tasks.send_invoice_emails",
    "schedule": crontab(minute=30, hour="6-23", day_of_month="1"),
}

# Where customers are told to write about payments (and anything else) when card payments
# are not available here (docs/billing.md, "Adding credit").
RUNCRATE_SUPPORT_EMAIL = env_str("RUNCRATE_SUPPORT_EMAIL", "support@runcrate.localhost")

STRIPE_SECRET_KEY = env_str("STRIPE_SECRET_KEY")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET")
STRIPE_API_BASE = env_str("STRIPE_API_BASE")  # tests point this at a local fake server

# The demo that `make run` starts (bin/run.py sets it, with DEBUG on): without Stripe keys, a
# demo payment page credits the balance through the signed-webhook path (billing/payments.py),
# signed with a secret derived from SECRET_KEY. Never on a deployment: it is free credit.
RUNCRATE_DEMO = env_bool("RUNCRATE_DEMO", False)
if RUNCRATE_DEMO and not DEBUG:
    raise ImproperlyConfigured(
        "RUNCRATE_DEMO is for the demo that make run starts (DEBUG on): its demo payments add "
        "credit without a card. Unset it, or set DEBUG=true."
    )

# --- email ------------------------------------------------------------------------------------
# With no email service configured, mail is written as files under $RUNCRATE_VAR_DIR/mail/.
# An ESP is chosen with EMAIL_BACKEND (e.g. anymail.backends.postmark.EmailBackend) plus the
# ANYMAIL_* variables it needs, read below.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
EMAIL_FILE_PATH = VAR_DIR / "mail"
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Runcrate <no-reply@runcrate.localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
ANYMAIL = {
    key.removeprefix("ANYMAIL_"): value
    for key, value in os.environ.items()
    if key.startswith("ANYMAIL_")
}

# --- security: strict whenever DEBUG is off ---------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    # Probes speak plain HTTP to the process itself; a redirect would read as healthy to them,
    # /readyz's 503 included.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# --- logs and errors --------------------------------------------------------------------------
# One line per record with its time (UTC), level and logger, on stderr (the process manager
# keeps it). Nothing secret is logged: keys and tokens never reach a log call.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "line": {
            "()": "runcrate.logs.UTCFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        }
    },
    # An expected 403 (the permission table's refusal) is one line, without a traceback.
    "filters": {"expected_refusals": {"()": "runcrate.logs.ExpectedRefusals"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "django.request": {"filters": ["expected_refusals"]},
    },
}
# An error reporter, only where one is configured: Sentry (or anything speaking its protocol).
# Its default sends no personal data (user emails, cookies, addresses); we leave it so.
SENTRY_DSN = env_str("SENTRY_DSN")
if SENTRY_DSN:
    import sentry_sdk

    sentry_sdk.init(
        dsn=SENTRY_DSN,
        environment=env_str("SENTRY_ENVIRONMENT", "production"),
        traces_sample_rate=0.0,
    )
