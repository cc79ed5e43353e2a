"""The model side: litellm calls, error classes, and (later) retry and admission policy."""
