"""Backups of a home and their restore (``neotask backup``, ``neotask backup verify``,
``neotask restore``): a staged copy of a consistent point of the home, checked by the doctor,
packed with a manifest into one ``.tar.gz``.

Blocking code only (files, SQLite, tar): the gateway runs it off the event loop and chooses the
point (``gateway/backups.py``); this package knows no HTTP and no store internals beyond
``sessions/``'s files and layout.
"""
