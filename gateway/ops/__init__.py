"""Operations: metrics, the access log, the usage report, the admin listener and the worker supervisor."""
