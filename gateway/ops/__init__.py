"""Operations: metrics, the access log, the usage ledger, the admin listener and the worker supervisor."""
