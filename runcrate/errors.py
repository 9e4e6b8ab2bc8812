class Refused(Exception):
    """A request refused before anything changed: a stable code, a sentence for a person, and
    the form field to blame (None: the request as a whole).

    Service functions raise a subclass; the API answers `{"error": {"code", "message"}}` with
    `status`, and pages show `message` beside `field`. Subclasses map their codes to statuses.
    """

    STATUS: dict[str, int] = {}

    def __init__(self, code: str, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    @property
    def status(self) -> int:
        return self.STATUS.get(self.code, 422)
