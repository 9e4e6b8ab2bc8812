"""The suite's flush after a transactional test (tests/conftest.py, _flush_by_delete): DELETE
FROM every table on PostgreSQL, where Django's is one TRUNCATE of them all."""

import pytest
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection

from clusters.models import Cluster
from tests.conftest import postgres_only
from tests.factories import ClusterFactory


@postgres_only
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_flush_deletes_every_row_of_every_table_rows_that_point_at_each_other_included(owner):
    ClusterFactory(project=owner.project, status=Cluster.Status.READY)
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name('clusters_cluster')}")
        assert cursor.fetchone()[0] == 1

    flush = connection.ops.sql_flush(no_style(), tables)
    assert flush[0] == "SET CONSTRAINTS ALL DEFERRED;"
    assert all(statement.startswith("DELETE FROM ") for statement in flush[1:])
    assert len(flush) == len(tables) + 1
    # As the end of a transactional test flushes (without the content types made again).
    call_command(
        "flush", verbosity=0, interactive=False, reset_sequences=False, inhibit_post_migrate=True
    )

    with connection.cursor() as cursor:
        left = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            left[table] = cursor.fetchone()[0]
    assert set(left.values()) == {0}, {t: n for t, n in left.items() if n}


@postgres_only
@pytest.mark.postgres
def test_a_flush_that_resets_the_sequences_is_still_djangos_truncate():
    flush = connection.ops.sql_flush(no_style(), ["clusters_cluster"], reset_sequences=True)
    assert flush == ['TRUNCATE "clusters_cluster" RESTART IDENTITY;']
