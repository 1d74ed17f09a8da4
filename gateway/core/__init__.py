"""What every part of the gateway shares: the exchange (one request and its reply), the route type, the multipart
reader, HTTP helpers, tenants, the spool area, and the folding of a chain."""
