class Refused(Exception):
    """A request refused before anything changed: a stable code, a sentence for a person, and
    the form field to blame (None: the request as a whole).

    Every refusal in the product subclasses this. Service functions raise a subclass; the one
    API handler (`runcrate/api.py`) answers `{"error": {"code", "message"}}` with `status`, and
    pages show `message` beside `field`. Subclasses map their codes to statuses in `STATUS`
    (422 for a code not listed); one raised with `status=` answers that status. A refusal
    worded for the customer ("Your balance …") may carry `staff_message`, the same refusal for
    staff acting for the project in the admin, who read it through `message_for`.
    """

    STATUS: dict[str, int] = {}

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        status: int | None = None,
        staff_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self._status = status
        self.staff_message = staff_message

    def message_for(self, *, staff: bool) -> str:
        """The sentence for who reads it: staff acting for the project, or the customer."""
        return self.staff_message if staff and self.staff_message else self.message

    @property
    def status(self) -> int:
        return self._status or self.STATUS.get(self.code, 422)
