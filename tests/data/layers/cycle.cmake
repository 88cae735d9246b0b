set(QEVAL_LAYERS "low:high" "high:low")
