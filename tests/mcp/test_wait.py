"""`wait_for_cluster` is asynchronous, driven by the MCP SDK's own client: it sends progress
while a slow cluster boots, answers within its bound ("still <status>, call again"), stops
polling the moment its caller cancels, and twenty open waits never delay another tool."""

import time

import anyio
import pytest

from tests.clusters.lifecycle_kit import create, inventory
from tests.mcp.kit import error_code, payload, talk, talk_while

pytestmark = pytest.mark.django_db(transaction=True)


def in_step(ticker, *, polls):
    """The simulated data center's beat in step with the wait: one tick once the wait has read
    the cluster since the last one (`polls()` counts its reads), so it reads every state the
    cluster passes through, however slowly this machine runs either side."""
    seen = [0]

    def drive() -> None:
        count = polls()
        if count > seen[0]:
            seen[0] = count
            ticker()

    return drive


def test_it_sends_progress_while_a_slow_cluster_boots(env, tmp_path, account, ticker, api_calls):
    cluster = create(account.project, inventory(hosts=2), name="slow")

    def polls() -> int:  # the wait's reads of the cluster
        return api_calls.count(rf"/api/v1/clusters/{cluster.pk}")

    notes = []

    async def note(progress, total, message):
        notes.append((progress, total, message))

    async def conversation(session):
        arguments = {"cluster": cluster.pk, "timeout_seconds": 45}
        return payload(
            await session.call_tool("wait_for_cluster", arguments, progress_callback=note)
        )

    waited = talk_while(env, tmp_path, in_step(ticker, polls=polls), conversation)

    assert waited["settled"] is True and waited["ready"] is True
    assert waited["status"] == "ready" and waited["message"] == "ready: 2 of 2 machines up"
    assert len(notes) >= 3, notes
    progress = [p for p, _, _ in notes]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)  # it grows
    assert {total for _, total, _ in notes} == {2}
    assert notes[0][2].startswith("provisioning: 0 of 2 machines up, step ")
    assert notes[-1] == (2, 2, "ready: 2 of 2 machines up")
    assert any(", step agent" in m or ", step network" in m for _, _, m in notes), notes


def test_it_answers_within_its_bound_saying_to_call_again(env, tmp_path, account):
    cluster = create(account.project, inventory(hosts=2), name="stuck")  # nothing ticks

    async def conversation(session):
        payload(await session.call_tool("get_cluster", {"cluster": "stuck"}))  # a warm server
        started = time.monotonic()
        waited = await session.call_tool(
            "wait_for_cluster", {"cluster": "stuck", "timeout_seconds": 2}
        )
        took = time.monotonic() - started
        too_long = await session.call_tool(
            "wait_for_cluster", {"cluster": cluster.pk, "timeout_seconds": 51}
        )
        return payload(waited), took, too_long

    waited, took, too_long = talk(env, tmp_path, conversation)

    assert 2 <= took < 4
    assert waited["settled"] is False and waited["ready"] is False
    assert waited["status"] == "provisioning"
    assert waited["message"] == (
        "Still provisioning after 2 s (provisioning: 0 of 2 machines up, step running): call "
        "wait_for_cluster again."
    )
    assert waited["cluster"]["id"] == cluster.pk
    assert too_long.is_error  # the schema's bound: at most 50 s a call
    assert "less than or equal to 50" in too_long.content[0].text


def test_a_cancelled_wait_stops_polling(env, tmp_path, account, api_calls):
    cluster = create(account.project, inventory(hosts=2), name="left")
    polls = rf"/api/v1/clusters/{cluster.pk}"

    async def conversation(session):
        async with anyio.create_task_group() as group:
            group.start_soon(
                session.call_tool,
                "wait_for_cluster",
                {"cluster": cluster.pk, "timeout_seconds": 30},
            )
            with anyio.fail_after(10):
                while api_calls.count(polls) < 3:  # it polls (every 0.05 s here)
                    await anyio.sleep(0.02)
            group.cancel_scope.cancel()  # the client leaves: the SDK sends the cancellation
        # A round trip after the cancellation, so the server has read it.
        assert not (await session.call_tool("list_volumes", {})).is_error
        after_cancel = api_calls.count(polls)
        await anyio.sleep(1)  # twenty poll intervals
        assert not (await session.call_tool("list_volumes", {})).is_error
        return after_cancel, api_calls.count(polls)

    after_cancel, a_second_later = talk(env, tmp_path, conversation)

    assert after_cancel >= 3
    assert a_second_later == after_cancel  # not one API call since


def test_twenty_open_waits_never_delay_another_tool(env, tmp_path, account, api_calls):
    offer = inventory(hosts=2)
    cluster = create(account.project, offer, name="busy")
    polls = rf"/api/v1/clusters/{cluster.pk}"

    async def conversation(session):
        async with anyio.create_task_group() as group:
            for _ in range(20):
                group.start_soon(
                    session.call_tool,
                    "wait_for_cluster",
                    {"cluster": cluster.pk, "timeout_seconds": 40},
                )
            with anyio.fail_after(20):
                while api_calls.count(polls) < 20:  # every wait is open and polling
                    await anyio.sleep(0.02)
            started = time.monotonic()
            offers = await session.call_tool("list_offers", {"gpu": offer.gpu.slug, "nodes": 2})
            took = time.monotonic() - started
            group.cancel_scope.cancel()
        return payload(offers), took

    # Each wait polls once a second here, so the live server is not what is measured.
    offers, took = talk({**env, "RUNCRATE_POLL_SECONDS": "1"}, tmp_path, conversation)

    assert [o["id"] for o in offers["offers"]] == [offer.slug]
    assert took < 2


def test_waiting_for_an_unknown_cluster_is_the_apis_refusal(env, tmp_path, account):
    async def conversation(session):
        return await session.call_tool("wait_for_cluster", {"cluster": 999999})

    assert error_code(talk(env, tmp_path, conversation)) == "not_found"


def test_a_wait_on_an_api_that_does_not_answer_still_answers_within_its_bound(env, tmp_path):
    closed = {**env, "RUNCRATE_API_URL": "http://127.0.0.1:9"}  # nothing listens there

    async def conversation(session):
        started = time.monotonic()
        waited = await session.call_tool("wait_for_cluster", {"cluster": 7, "timeout_seconds": 2})
        return payload(waited), time.monotonic() - started

    waited, took = talk(closed, tmp_path, conversation)

    assert took < 4
    assert waited["settled"] is False and waited["cluster"] is None
    assert waited["message"].startswith("The API did not answer within 2 s")
    assert waited["message"].endswith("call wait_for_cluster again.")
