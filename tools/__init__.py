"""Scripts a user runs (``python -m tools.<name>``).  Importing the package applies the project's CPU settings
before any tool loads numpy (see ``runtime.cpu_env``)."""
from runtime import cpu_env  # noqa: F401
