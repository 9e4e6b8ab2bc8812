"""A local stand-in for Stripe: a tiny HTTP server for Checkout Sessions, and webhook events
built and signed here the way Stripe signs them (`t=…,v1=HMAC-SHA256("t.payload")`)."""

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

WEBHOOK_SECRET = "whsec_test_local_secret"


class FakeStripe:
    """Answers POST /v1/checkout/sessions like Stripe, remembering every request.

    Like Stripe, a request with an Idempotency-Key it has already answered gets the same
    session back. `fail_next` makes the next requests fail with a 500.
    """

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.fail_next = 0
        self.sessions_by_key: dict[str, dict] = {}
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length).decode()
                status, answer = fake.answer(self.path, dict(self.headers), body)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, path: str, headers: dict, body: str) -> tuple[int, dict]:
        with self._lock:
            form = {key: values[0] for key, values in parse_qs(body).items()}
            key = headers.get("Idempotency-Key") or headers.get("idempotency-key")
            self.requests.append({"path": path, "key": key, "form": form})
            if self.fail_next > 0:
                self.fail_next -= 1
                return 500, {"error": {"type": "api_error", "message": "Stripe had a hiccup."}}
            if key in self.sessions_by_key:
                return 200, self.sessions_by_key[key]
            number = len(self.sessions_by_key) + 1
            session = {
                "id": f"cs_test_{number:04d}",
                "object": "checkout.session",
                "mode": form.get("mode"),
                "url": f"https://checkout.stripe.test/c/pay/cs_test_{number:04d}",
                "client_reference_id": form.get("client_reference_id"),
                "amount_total": int(form.get("line_items[0][price_data][unit_amount]", 0)),
                "currency": "usd",
                "payment_status": "unpaid",
            }
            self.sessions_by_key[key] = session
            return 200, session

    def __enter__(self) -> "FakeStripe":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def sign(payload: str, *, secret: str = WEBHOOK_SECRET, timestamp: int | None = None) -> str:
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(
        secret.encode(), f"{timestamp}.{payload}".encode(), hashlib.sha256
    ).hexdigest()
    return f"t={timestamp},v1={digest}"


def session_event(
    event_type: str,
    *,
    session_id: str,
    payment_id: int | None = None,
    project_id: int | None = None,
    payment_status: str = "paid",
    amount_total: object = 5000,
    currency: object = "usd",
    event_id: str = "evt_test_1",
) -> str:
    return json.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "data": {
                "object": {
                    "id": session_id,
                    "object": "checkout.session",
                    "mode": "payment",
                    "payment_status": payment_status,
                    "amount_total": amount_total,
                    "currency": currency,
                    "client_reference_id": str(payment_id) if payment_id else None,
                    "metadata": {
                        "payment_id": str(payment_id or ""),
                        "project_id": str(project_id or ""),
                    },
                }
            },
        }
    )
