"""Facts about this machine's processes, read from the kernel (``processes.py``)."""
