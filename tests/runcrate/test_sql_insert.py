"""runcrate/sql.py `insert_rows`: the one bare INSERT a metrics report's GPU rows go through
(clusters/metrics.py `store`), in place of the manager's private `_insert`."""

from datetime import UTC, datetime
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.models import GpuSample
from runcrate.sql import insert_rows
from tests.factories import ClusterFactory

AT = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


def samples(node) -> list[GpuSample]:
    full = GpuSample(
        node=node,
        at=AT,
        index=0,
        utilization_percent=97.5,
        memory_used_mib=70000,
        memory_total_mib=81559,
        temperature_c=61,
        power_w=650.3,
        power_limit_w=700.0,
        sm_clock_mhz=1980,
        throttle=4,
        ecc_corrected=2**40,
        ecc_uncorrected=0,
        retired_pages_pending=False,
        remapped_rows_pending=True,
    )
    sparse = GpuSample(node_id=node.pk, at=AT, index=1, utilization_percent=3)
    return [full, sparse]


# Outside a test's transaction, so that the insert is seen as it runs in a request.
@pytest.mark.django_db(transaction=True)
def test_it_inserts_every_row_in_one_statement_and_opens_no_transaction(owner):
    node = ClusterFactory(project=owner.project, size=1, machines=True).nodes.get()
    rows = samples(node)

    with (
        CaptureQueriesContext(connection) as queries,
        mock.patch.object(connection, "set_autocommit", wraps=connection.set_autocommit) as tx,
    ):
        insert_rows(rows)

    assert [q["sql"].split(" ", 1)[0] for q in queries.captured_queries] == ["INSERT"]
    assert "RETURNING" not in queries.captured_queries[0]["sql"]
    tx.assert_not_called()  # no BEGIN and COMMIT around it, as bulk_create would send
    assert [row.pk for row in rows] == [None, None]  # nothing read back

    full, sparse = GpuSample.objects.filter(node=node).order_by("index")
    fields = [f.attname for f in GpuSample._meta.concrete_fields if not f.primary_key]
    assert {f: getattr(full, f) for f in fields} == {f: getattr(rows[0], f) for f in fields}
    assert sparse.utilization_percent == 3 and sparse.at == AT
    assert sparse.power_w is None and sparse.retired_pages_pending is None


@pytest.mark.django_db
def test_no_rows_send_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        insert_rows([])
