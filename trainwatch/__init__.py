"""trainwatch: catch silent errors in PyTorch training while the job runs."""

__version__ = "0.1.0"
