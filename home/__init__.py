"""The trouper home: ``paths.py`` says where everything lives under it (and keeps it
owner-only), ``logs.py`` where and how trouper logs."""
