set(QEVAL_LAYERS "low:" "high:low")
