"""The model side: litellm calls, error classes, and (later) retry and admission policy."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network on litellm's import
