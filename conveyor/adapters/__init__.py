"""Queue-adapter implementations: ``memory`` (embedded), ``redis``, ``kafka``."""
