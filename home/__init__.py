"""The home directory: where everything lives under it (``layout``), the one-daemon lock
(``lock``), damaged state on disk (``damage``), who may read it (``permissions``), what a rename
may replace (``targets``), atomic writes (``atomic``) and the write probe (``probe``).

Every backend, the backups and the CLI use it; it imports nothing of the project but ``config``."""
