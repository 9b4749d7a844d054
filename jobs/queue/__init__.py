"""The durable job queue (see `jobs.queue.core`): SQLite by default, PostgreSQL for several hosts."""
from jobs.queue.core import ACTIVE, JOB_STATES, TERMINAL, Queue, QueueError
from jobs.queue.records import NoQueue
from jobs.queue.schema import LATEST as SCHEMA_VERSION, MIGRATIONS
from jobs.queue.store import QueueUnavailable

__all__ = ["ACTIVE", "JOB_STATES", "MIGRATIONS", "SCHEMA_VERSION", "TERMINAL", "NoQueue", "Queue", "QueueError",
           "QueueUnavailable"]
