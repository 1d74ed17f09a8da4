"""What every part of the gateway shares: the exchange (one request and its reply), HTTP helpers, the canonical
path and the route table, tenants, and the folding of a chain."""
