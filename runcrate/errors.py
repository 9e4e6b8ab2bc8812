class Refused(Exception):
    """A request refused before anything changed: a stable code, a sentence for a person, and
    the form field to blame (None: the request as a whole).

    Every refusal in the product subclasses this. Service functions raise a subclass; the one
    API handler (`runcrate/api.py`) answers `{"error": {"code", "message"}}` with `status`, and
    pages show `message` beside `field`. Subclasses map their codes to statuses in `STATUS`
    (422 for a code not listed); one raised with `status=` answers that status.
    """

    STATUS: dict[str, int] = {}

    def __init__(
        self, code: str, message: str, *, field: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self._status = status

    @property
    def status(self) -> int:
        return self._status or self.STATUS.get(self.code, 422)
