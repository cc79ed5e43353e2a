"""Keeping secrets where they belong: ``masking.py`` (secret values out of everything
stored, shown, logged or prompted), ``secrets_file.py`` (the one file that holds them),
``transport_key.py`` (the actor transport's key file), ``tls.py`` (one verifying TLS
context per process). docs/security.md."""
