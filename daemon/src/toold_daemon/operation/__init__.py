"""Operating the service: logging, systemd notification, what the daemon does to
itself at start (hardening, giving up root, state files) and what ``toold doctor``
checks."""
