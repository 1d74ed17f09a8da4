"""The proxy core: the route chain's terminal handler (the request body through its filters, the tenant's turn, the
upstream request) and ``send``, the one road of every upstream request."""
