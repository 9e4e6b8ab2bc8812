# The throwaway redis-server the cache-down tests pause (tests/runcrate/throwaway_redis.py).
from tests.runcrate.throwaway_redis import cache_on_throwaway, throwaway_redis  # noqa: F401
