"""Celery 5.7's settings and their defaults (``celery.app.defaults``), and the Celery 3
names each had.

``app.conf`` reads every setting Celery documents, with Celery's default, value and type
(``result_expires`` is ``timedelta(days=1)``, ``accept_content`` the tuple ``("json",)``).
Most only mean something to a broker, a result backend or a prefork pool that pyrula
does not have: they stay readable and change nothing (see docs/coming-from-celery.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

DEFAULT_PROCESS_LOG_FMT = "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"
DEFAULT_TASK_LOG_FMT = (
    "[%(asctime)s: %(levelname)s/%(processName)s] %(task_name)s[%(task_id)s]: %(message)s"
)

DEFAULTS: dict[str, Any] = {
    # top level
    "accept_content": ("json",),
    "result_accept_content": None,
    "enable_utc": True,
    "imports": (),
    "include": (),
    "timezone": None,
    # beat
    "beat_enable_remote_control": False,
    "beat_remote_control_max_tick_age": None,
    "beat_max_loop_interval": 0,
    "beat_schedule": {},
    "beat_scheduler": "celery.beat:PersistentScheduler",
    "beat_schedule_filename": "celerybeat-schedule",
    "beat_sync_every": 0,
    "beat_cron_starting_deadline": None,
    # broker
    "broker_url": None,
    "broker_read_url": None,
    "broker_write_url": None,
    "broker_transport": None,
    "broker_transport_options": {},
    "broker_connection_timeout": 4,
    "broker_connection_retry": True,
    "broker_connection_retry_on_startup": None,
    "broker_connection_max_retries": 100,
    "broker_channel_error_retry": False,
    "broker_failover_strategy": None,
    "broker_heartbeat": 120,
    "broker_heartbeat_checkrate": 3.0,
    "broker_login_method": None,
    "broker_native_delayed_delivery_queue_type": "quorum",
    "broker_pool_limit": 10,
    "broker_pool_acquire_timeout": None,
    "broker_use_ssl": False,
    "broker_host": None,
    "broker_port": None,
    "broker_user": None,
    "broker_password": None,
    "broker_vhost": None,
    # cache
    "cache_backend": None,
    "cache_backend_options": {},
    # cassandra
    "cassandra_entry_ttl": None,
    "cassandra_keyspace": None,
    "cassandra_port": None,
    "cassandra_read_consistency": None,
    "cassandra_servers": None,
    "cassandra_bundle_path": None,
    "cassandra_table": None,
    "cassandra_write_consistency": None,
    "cassandra_auth_provider": None,
    "cassandra_auth_kwargs": None,
    "cassandra_options": {},
    # s3
    "s3_access_key_id": None,
    "s3_secret_access_key": None,
    "s3_bucket": None,
    "s3_base_path": None,
    "s3_endpoint_url": None,
    "s3_region": None,
    # azureblockblob
    "azureblockblob_container_name": "celery",
    "azureblockblob_retry_initial_backoff_sec": 2,
    "azureblockblob_retry_increment_base": 2,
    "azureblockblob_retry_max_attempts": 3,
    "azureblockblob_base_path": "",
    "azureblockblob_connection_timeout": 20,
    "azureblockblob_read_timeout": 120,
    # gcs
    "gcs_bucket": None,
    "gcs_project": None,
    "gcs_base_path": "",
    "gcs_ttl": 0,
    # control
    "control_queue_ttl": 300.0,
    "control_queue_expires": 10.0,
    "control_queue_exclusive": True,
    "control_queue_durable": False,
    "control_exchange": "celery",
    # couchbase
    "couchbase_backend_settings": None,
    # arangodb
    "arangodb_backend_settings": None,
    # mongodb
    "mongodb_backend_settings": None,
    # cosmosdbsql
    "cosmosdbsql_database_name": "celerydb",
    "cosmosdbsql_collection_name": "celerycol",
    "cosmosdbsql_consistency_level": "Session",
    "cosmosdbsql_max_retry_attempts": 9,
    "cosmosdbsql_max_retry_wait_time": 30,
    # event
    "event_queue_expires": 60.0,
    "event_queue_ttl": 5.0,
    "event_queue_prefix": "celeryev",
    "event_queue_exclusive": True,
    "event_queue_durable": False,
    "event_serializer": "json",
    "event_exchange": "celeryev",
    # redis
    "redis_backend_use_ssl": None,
    "redis_db": None,
    "redis_host": None,
    "redis_max_connections": None,
    "redis_username": None,
    "redis_password": None,
    "redis_port": None,
    "redis_socket_timeout": 120.0,
    "redis_socket_connect_timeout": None,
    "redis_retry_on_timeout": False,
    "redis_socket_keepalive": False,
    # result
    "result_backend": None,
    "result_cache_max": -1,
    "result_compression": None,
    "result_exchange": "celeryresults",
    "result_exchange_type": "direct",
    "result_expires": timedelta(days=1),
    "result_chord_expires": None,
    "result_failure_expires": None,
    "result_persistent": None,
    "result_extended": False,
    "result_serializer": "json",
    "result_backend_transport_options": {},
    "result_chord_retry_interval": 1.0,
    "result_chord_join_timeout": 3.0,
    "result_backend_max_sleep_between_retries_ms": 10000,
    "result_backend_max_retries": float("inf"),
    "result_backend_base_sleep_between_retries_ms": 10,
    "result_backend_always_retry": False,
    # elasticsearch
    "elasticsearch_retry_on_timeout": None,
    "elasticsearch_max_retries": None,
    "elasticsearch_timeout": None,
    "elasticsearch_save_meta_as_text": True,
    # security
    "security_certificate": None,
    "security_cert_store": None,
    "security_key": None,
    "security_key_password": None,
    "security_digest": "sha256",
    # database
    "database_url": None,
    "database_engine_options": {"pool_pre_ping": True, "pool_recycle": 3600},
    "database_engine_callback": None,
    "database_short_lived_sessions": False,
    "database_table_schemas": None,
    "database_table_names": None,
    "database_create_tables_at_setup": True,
    # task
    "task_acks_late": False,
    "task_acks_on_failure_or_timeout": True,
    "task_acks_on_failure": None,
    "task_acks_on_timeout": None,
    "task_always_eager": False,
    "task_annotations": None,
    "task_compression": None,
    "task_create_missing_queues": True,
    "task_create_missing_queue_type": "classic",
    "task_create_missing_queue_exchange_type": None,
    "task_inherit_parent_priority": False,
    "task_default_delivery_mode": 2,
    "task_default_queue": "celery",
    "task_default_queue_type": "classic",
    "task_default_exchange": None,
    "task_default_exchange_type": "direct",
    "task_default_routing_key": None,
    "task_default_rate_limit": None,
    "task_default_priority": None,
    "task_eager_propagates": False,
    "task_ignore_result": False,
    "task_store_eager_result": False,
    "task_protocol": 2,
    "task_publish_retry": True,
    "task_publish_retry_policy": {
        "max_retries": 3,
        "interval_start": 0,
        "interval_max": 1,
        "interval_step": 0.2,
    },
    "task_queues": None,
    "task_queue_max_priority": None,
    "task_reject_on_worker_lost": None,
    "task_retry_on_worker_lost": False,
    "task_remote_tracebacks": False,
    "task_repr_maxlevels": 3,
    "task_routes": None,
    "task_send_sent_event": False,
    "task_serializer": "json",
    "task_soft_time_limit": None,
    "task_time_limit": None,
    "task_store_errors_even_if_ignored": False,
    "task_track_started": False,
    "task_allow_error_cb_on_chord_header": False,
    # worker
    "worker_agent": None,
    "worker_autoscaler": "celery.worker.autoscale:Autoscaler",
    "worker_cancel_long_running_tasks_on_connection_loss": False,
    "worker_soft_shutdown_timeout": 0.0,
    "worker_enable_soft_shutdown_on_idle": False,
    "worker_concurrency": None,
    "worker_consumer": "celery.worker.consumer:Consumer",
    "worker_direct": False,
    "worker_disable_rate_limits": False,
    "worker_deduplicate_successful_tasks": False,
    "worker_enable_remote_control": True,
    "worker_hijack_root_logger": True,
    "worker_log_color": None,
    "worker_log_datefmt": None,
    "worker_log_format": DEFAULT_PROCESS_LOG_FMT,
    "worker_lost_wait": 10.0,
    "worker_max_memory_per_child": None,
    "worker_max_tasks_per_child": None,
    "worker_pool": "prefork",
    "worker_pool_putlocks": True,
    "worker_pool_restarts": False,
    "worker_pool_start_method": "fork",
    "worker_proc_alive_timeout": 4.0,
    "worker_prefetch_multiplier": 4,
    "worker_eta_task_limit": None,
    "worker_enable_prefetch_count_reduction": True,
    "worker_disable_prefetch": False,
    "worker_redirect_stdouts": True,
    "worker_redirect_stdouts_level": "WARNING",
    "worker_send_task_events": False,
    "worker_state_db": None,
    "worker_task_log_datefmt": None,
    "worker_task_log_format": DEFAULT_TASK_LOG_FMT,
    "worker_timer": None,
    "worker_timer_precision": 1.0,
    "worker_detect_quorum_queues": True,
}
"""Every Celery 5.7 setting (new, lower-case name) and its default."""

PYRULA_DEFAULTS: dict[str, Any] = {
    "result_backend_fallback": None,
    "result_backend_fallback_prefix": None,
}
"""Settings the drop-in adds to Celery's (read the same ways, namespaced too):
the old result backend read during a move (docs/migrating-from-celery.md)."""

SETTINGS: dict[str, Any] = {**DEFAULTS, **PYRULA_DEFAULTS}
"""Every setting ``app.conf`` knows, with its default."""

_OLD_PREFIXES = (
    ("beat_", "CELERYBEAT_"),
    ("worker_", "CELERYD_"),
    ("task_", "CELERY_"),
    ("cache_", "CELERY_CACHE_"),
    ("couchbase_", "CELERY_COUCHBASE_"),
    ("arangodb_", "CELERY_ARANGODB_"),
    ("mongodb_", "CELERY_MONGODB_"),
    ("event_", "CELERY_EVENT_"),
    ("redis_", "CELERY_REDIS_"),
    ("result_", "CELERY_RESULT_"),
    ("elasticsearch_", "CELERY_ELASTICSEARCH_"),
    ("security_", "CELERY_SECURITY_"),
)
"""How Celery 3 spelled a namespace's settings (``task_acks_late``: ``CELERY_ACKS_LATE``)."""
_OLD_TOP = ("accept_content", "imports", "include", "timezone")
"""Top-level settings that had the ``CELERY_`` prefix."""
_OLD_EXCEPTIONS = {
    "result_accept_content": "RESULT_ACCEPT_CONTENT",
    "result_cache_max": "CELERY_MAX_CACHED_RESULTS",
    "result_expires": "CELERY_TASK_RESULT_EXPIRES",
    "database_url": "CELERY_RESULT_DBURI",
    "database_engine_options": "CELERY_RESULT_ENGINE_OPTIONS",
    "database_short_lived_sessions": "CELERY_RESULT_DB_SHORT_LIVED_SESSIONS",
    "database_table_names": "CELERY_RESULT_DB_TABLENAMES",
    "task_compression": "CELERY_MESSAGE_COMPRESSION",
    "task_eager_propagates": "CELERY_EAGER_PROPAGATES_EXCEPTIONS",
    "task_protocol": "CELERY_TASK_PROTOCOL",
    "task_publish_retry": "CELERY_TASK_PUBLISH_RETRY",
    "task_publish_retry_policy": "CELERY_TASK_PUBLISH_RETRY_POLICY",
    "task_send_sent_event": "CELERY_SEND_TASK_SENT_EVENT",
    "task_serializer": "CELERY_TASK_SERIALIZER",
    "task_soft_time_limit": "CELERYD_TASK_SOFT_TIME_LIMIT",
    "task_time_limit": "CELERYD_TASK_TIME_LIMIT",
    "worker_direct": "CELERY_WORKER_DIRECT",
    "worker_disable_rate_limits": "CELERY_DISABLE_RATE_LIMITS",
    "worker_enable_remote_control": "CELERY_ENABLE_REMOTE_CONTROL",
    "worker_lost_wait": "CELERYD_WORKER_LOST_WAIT",
    "worker_redirect_stdouts": "CELERY_REDIRECT_STDOUTS",
    "worker_redirect_stdouts_level": "CELERY_REDIRECT_STDOUTS_LEVEL",
    "worker_send_task_events": "CELERY_SEND_EVENTS",
}
"""Settings whose Celery 3 name follows no namespace rule."""


def old_name(name: str) -> str:
    """The Celery 3 name of setting ``name`` (its upper-case form when it had none)."""
    if name in _OLD_EXCEPTIONS:
        return _OLD_EXCEPTIONS[name]
    if name in _OLD_TOP:
        return f"CELERY_{name.upper()}"
    for prefix, old in _OLD_PREFIXES:
        if name.startswith(prefix):
            return old + name[len(prefix) :].upper()
    return name.upper()


OLD_KEYS: dict[str, str] = {old_name(name): name for name in DEFAULTS}
"""Celery 3 name -> Celery 4+ name, for every setting (Celery's ``_TO_NEW_KEY``)."""

__all__ = ["DEFAULTS", "DEFAULT_PROCESS_LOG_FMT", "DEFAULT_TASK_LOG_FMT", "OLD_KEYS", "old_name"]
