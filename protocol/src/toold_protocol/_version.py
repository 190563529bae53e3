"""Protocol version numbers.

``PROTOCOL_VERSION`` is what this package speaks; ``MIN_PROTOCOL_VERSION`` is the
oldest version it still understands. A peer that offers something older is refused
with ``PROTOCOL_VERSION_UNSUPPORTED``.
"""

PROTOCOL_VERSION = 1
MIN_PROTOCOL_VERSION = 1
