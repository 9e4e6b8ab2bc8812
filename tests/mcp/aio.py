"""Running the MCP SDK's async client from the synchronous tests."""

import concurrent.futures

import anyio


def run_async(main):
    """`anyio.run(main)` on a thread of its own: a session's Playwright (the browser tests)
    keeps an event loop running in the main thread, where anyio refuses to start another."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, main).result()
