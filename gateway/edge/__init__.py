"""The edge: what a request is (canonical path, tenant, route, effective method), and serving it through its route's
chain with one record, in the order of the road: ``serve`` -> ``classify`` -> ``target``, ``tenancy``,
``route_table``, ``method``."""
