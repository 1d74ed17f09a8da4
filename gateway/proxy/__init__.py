"""The proxy core: forwarding to the upstream, the body phases, and the only code that writes to the client."""
