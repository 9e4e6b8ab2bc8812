"""The embedded broker: kombu's filesystem transport, with messages written atomically.

kombu writes a message straight into the queue folder under its final name, while a consumer
takes any file with a queue's name: a worker polling at the wrong moment moves a file that is
still empty, fails to decode it and stops ("Unrecoverable error: JSONDecodeError"). Here a
message is written under a name no queue matches and renamed into place once complete; the
rename is atomic within a folder, so a consumer sees whole messages or none.

Used when REDIS_URL is unset, through the `runcrate-fs://` broker URL registered below.
"""

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

SCHEME = "runcrate-fs"


class Channel(filesystem.Channel):
    # kombu's filesystem Channel names the message `payload`, its AbstractChannel `message`:
    # an override matches one of the two, never both.
    def _put(self, queue: str, payload: dict, **kwargs: object) -> None:  # type: ignore[override]
        # The same name kombu gives a message (its time orders the queue), reached by a rename.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        # "partial-<uuid>.tmp": a consumer matches the part after the first dot against
        # "<queue>.msg", and "tmp" matches no queue.
        partial = os.path.join(self.data_folder_out, f"partial-{uuid.uuid4()}.tmp")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add a message to {self.data_folder_out!r}") from exc


class Transport(filesystem.Transport):
    Channel = Channel


TRANSPORT_ALIASES[SCHEME] = "runcrate.broker:Transport"
