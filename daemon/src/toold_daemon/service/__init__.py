"""The service: sessions and requests (see ``router``)."""

from .router import Service
from .sessions import Session
from .shared import own_batch_id

__all__ = ["Service", "Session", "own_batch_id"]
