"""The way out for commands in proxy mode: a filtering HTTP and SOCKS5 proxy (``proxy``),
its rules (``rules``) and the process that runs it as the client (``process``)."""
