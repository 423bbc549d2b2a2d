"""Import-compatibility shims for paths of the official SDK (``tinker.lib.*``)."""
